//! The edge function end to end: composed with coord, served by `coord serve`
//! over real HTTP, on the in-memory store and on Redis — where two `coord
//! serve` processes share locks, presence and limits.

#![allow(clippy::unwrap_used)] // tests may unwrap: a panic is the failure report

mod common;

use std::process::Command;

use common::serve::{Reply, Serve};

/// A fresh Redis key prefix (its keys are deleted at the end of the test).
struct Prefix {
    url: String,
    name: String,
}

impl Prefix {
    async fn new(test: &str) -> Prefix {
        let url = common::redis_url().await;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        Prefix {
            url,
            name: format!("serve-{test}-{}-{nanos}", std::process::id()),
        }
    }
}

#[test]
fn the_composed_function_imports_only_the_store_and_wasi() {
    let engine = wasmtime::Engine::default();
    let names = |bytes: &[u8]| -> Vec<String> {
        let component = wasmtime::component::Component::new(&engine, bytes).unwrap();
        let ty = component.component_type();
        ty.imports(&engine)
            .map(|(name, _)| name.to_string())
            .collect()
    };
    let function = names(coord_host::serve::INVENTORY_FUNCTION);
    assert!(
        function.iter().any(|n| n.starts_with("coord:sync/lock@")),
        "the function imports the lock: {function:?}"
    );

    let composed =
        coord_host::compose::plug(coord_host::serve::INVENTORY_FUNCTION, coord_host::COMPONENT)
            .unwrap();
    let imports = names(&composed);
    assert!(imports.contains(&"coord:sync/store@0.1.0".to_string()));
    for name in &imports {
        assert!(
            name == "coord:sync/store@0.1.0" || name.starts_with("wasi:"),
            "unexpected import {name} in {imports:?}"
        );
    }
    for coord in coord_host::compose::coord_exports().unwrap() {
        assert!(!imports.contains(coord), "{coord} left unplugged");
    }
    let component = wasmtime::component::Component::new(&engine, &composed).unwrap();
    let exports: Vec<String> = component
        .component_type()
        .exports(&engine)
        .map(|(name, _)| name.to_string())
        .collect();
    assert!(
        exports
            .iter()
            .any(|n| n.starts_with("wasi:http/incoming-handler@")),
        "{exports:?}"
    );
}

#[test]
fn composing_a_component_without_coord_imports_fails_with_a_reason() {
    let error = coord_host::compose::plug(coord_host::COMPONENT, coord_host::COMPONENT)
        .unwrap_err()
        .to_string();
    assert!(error.contains("plugging coord"), "{error}");
}

/// The interfaces the `coordinator` world of `wit/world.wit` exports, read
/// from the WIT itself.
fn coordinator_world_exports() -> Vec<String> {
    let mut resolve = wit_parser::Resolve::new();
    let (package, _) = resolve
        .push_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../wit"))
        .unwrap();
    let world = resolve
        .select_world(&[package], Some("coordinator"))
        .unwrap();
    resolve.worlds[world]
        .exports
        .values()
        .filter_map(|item| match item {
            wit_parser::WorldItem::Interface { id, .. } => resolve.id_of(*id),
            _ => None,
        })
        .collect()
}

#[test]
fn coords_interfaces_are_those_coord_wasm_exports_as_the_wit_says() {
    let mut from_wit = coordinator_world_exports();
    let mut from_wasm = coord_host::compose::coord_exports().unwrap().to_vec();
    from_wit.sort();
    from_wasm.sort();
    assert_eq!(from_wasm, from_wit);
    assert!(
        from_wasm.iter().any(|n| n.starts_with("coord:sync/lease@")),
        "{from_wasm:?}"
    );
}

/// A `wasi:http` function that imports exactly one of coord's interfaces,
/// `interface` (`coord:sync/lease@0.1.0`): its handler calls the
/// interface's first function (every argument zero: empty strings, `none`,
/// 0), then returns without responding.
///
/// Built here from a core module written with wasm-encoder and wrapped with
/// wit-component, in milliseconds: four Rust guests (one per interface,
/// since wit-component drops the imports a module does not use) would be
/// four wasm32 builds. The WIT comes from the components themselves: coord's
/// from `coord.wasm`, `wasi:http`'s from the hello function.
fn function_importing_only(interface: &str) -> Vec<u8> {
    use wasm_encoder::{
        CodeSection, ConstExpr, EntityType, ExportKind, ExportSection, Function, FunctionSection,
        GlobalSection, GlobalType, ImportSection, Instruction, MemorySection, MemoryType, Module,
        TypeSection, ValType,
    };
    use wit_parser::abi::{AbiVariant, WasmType};
    use wit_parser::{
        FunctionKind, LiftLowerAbi, ManglingAndAbi, WasmExport, WasmExportKind, WasmImport,
        WorldItem,
    };

    // Each decoded component's own world is in a package `root:component`:
    // renamed apart, the two merge.
    let wit_of = |bytes: &[u8], root: &str| match wit_component::decode(bytes).unwrap() {
        wit_component::DecodedWasm::Component(mut resolve, world) => {
            let package = resolve.worlds[world].package.unwrap();
            let old = resolve.packages[package].name.clone();
            resolve.package_names.shift_remove(&old);
            resolve.packages[package].name.name = root.to_string();
            let renamed = resolve.packages[package].name.clone();
            resolve.package_names.insert(renamed, package);
            resolve
        }
        other => panic!("not a component: {:?}", other.package()),
    };
    let mut resolve = wit_of(coord_host::COMPONENT, "coord");
    resolve
        .merge(wit_of(&std::fs::read(HELLO_FUNCTION).unwrap(), "hello"))
        .unwrap();
    let handler = resolve
        .interfaces
        .iter()
        .filter_map(|(id, _)| resolve.id_of(id))
        .find(|name| name.starts_with("wasi:http/incoming-handler@"))
        .unwrap();
    let package = resolve
        .push_source(
            "single.wit",
            &format!(
                "package coord-test:single;\n\
                 world function {{ import {interface}; export {handler}; }}\n"
            ),
        )
        .unwrap();
    let world = resolve.select_world(&[package], Some("function")).unwrap();

    let mangling = ManglingAndAbi::Legacy(LiftLowerAbi::Sync);
    let core = |ty: &WasmType| match ty {
        WasmType::I64 | WasmType::PointerOrI64 => ValType::I64,
        WasmType::F32 => ValType::F32,
        WasmType::F64 => ValType::F64,
        WasmType::I32 | WasmType::Pointer | WasmType::Length => ValType::I32,
    };
    let zero = |ty: &ValType| match ty {
        ValType::I64 => Instruction::I64Const(0),
        ValType::F32 => Instruction::F32Const(0.0f32.into()),
        ValType::F64 => Instruction::F64Const(0.0f64.into()),
        _ => Instruction::I32Const(0),
    };
    // Where the arguments (when passed in memory) and the results go: all
    // zero bytes, room to spare; results' strings are allocated above.
    const ARGS: i32 = 1024;
    const RESULTS: i32 = 4096;
    const HEAP: i32 = 8192;

    let items = &resolve.worlds[world];
    let (key, imported) = items
        .imports
        .iter()
        .find_map(|(key, item)| match item {
            WorldItem::Interface { id, .. } if resolve.id_of(*id).as_deref() == Some(interface) => {
                Some((key, *id))
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("{interface} is not imported"));
    let func = resolve.interfaces[imported]
        .functions
        .values()
        .find(|f| matches!(f.kind, FunctionKind::Freestanding))
        .unwrap();
    let call = resolve.wasm_signature(AbiVariant::GuestImport, func);
    let (export_key, exported) = items
        .exports
        .iter()
        .find_map(|(key, item)| match item {
            WorldItem::Interface { id, .. } => Some((key, *id)),
            _ => None,
        })
        .unwrap();
    let handle = resolve.interfaces[exported]
        .functions
        .get("handle")
        .unwrap();
    let handle_sig = resolve.wasm_signature(AbiVariant::GuestExport, handle);

    let mut types = TypeSection::new();
    let params: Vec<ValType> = call.params.iter().map(core).collect();
    let results: Vec<ValType> = call.results.iter().map(core).collect();
    types.ty().function(params.clone(), results.clone()); // 0: the import
    types.ty().function(
        handle_sig.params.iter().map(core).collect::<Vec<_>>(),
        handle_sig.results.iter().map(core).collect::<Vec<_>>(),
    ); // 1: handle
    types.ty().function([ValType::I32; 4], [ValType::I32]); // 2: cabi_realloc
    let mut imports = ImportSection::new();
    let (module, name) = resolve.wasm_import_name(
        mangling,
        WasmImport::Func {
            interface: Some(key),
            func,
        },
    );
    imports.import(&module, &name, EntityType::Function(0));
    let mut functions = FunctionSection::new();
    functions.function(1); // func 1: handle
    functions.function(2); // func 2: cabi_realloc
    let mut memories = MemorySection::new();
    memories.memory(MemoryType {
        minimum: 2,
        maximum: None,
        memory64: false,
        shared: false,
        page_size_log2: None,
    });
    let mut globals = GlobalSection::new();
    globals.global(
        GlobalType {
            val_type: ValType::I32,
            mutable: true,
            shared: false,
        },
        &ConstExpr::i32_const(HEAP),
    );
    let mut exports = ExportSection::new();
    let handle_name = resolve.wasm_export_name(
        mangling,
        WasmExport::Func {
            interface: Some(export_key),
            func: handle,
            kind: WasmExportKind::Normal,
        },
    );
    exports.export(&handle_name, ExportKind::Func, 1);
    exports.export(
        &resolve.wasm_export_name(mangling, WasmExport::Realloc),
        ExportKind::Func,
        2,
    );
    exports.export(
        &resolve.wasm_export_name(mangling, WasmExport::Memory),
        ExportKind::Memory,
        0,
    );
    let mut code = CodeSection::new();
    let mut body = Function::new([]);
    for (n, ty) in params.iter().enumerate() {
        let last = n + 1 == params.len();
        body.instruction(&if call.retptr && last {
            Instruction::I32Const(RESULTS)
        } else if call.indirect_params && n == 0 {
            Instruction::I32Const(ARGS)
        } else {
            zero(ty)
        });
    }
    body.instruction(&Instruction::Call(0));
    for _ in &results {
        body.instruction(&Instruction::Drop);
    }
    body.instruction(&Instruction::End);
    code.function(&body);
    // cabi_realloc(old, old_size, align, size): a bump allocator.
    let mut realloc = Function::new([(1, ValType::I32)]);
    for instruction in [
        Instruction::GlobalGet(0),
        Instruction::LocalGet(2),
        Instruction::I32Add,
        Instruction::I32Const(1),
        Instruction::I32Sub,
        Instruction::I32Const(0),
        Instruction::LocalGet(2),
        Instruction::I32Sub,
        Instruction::I32And,
        Instruction::LocalTee(4),
        Instruction::LocalGet(3),
        Instruction::I32Add,
        Instruction::GlobalSet(0),
        Instruction::LocalGet(4),
        Instruction::End,
    ] {
        realloc.instruction(&instruction);
    }
    code.function(&realloc);
    let mut module = Module::new();
    module
        .section(&types)
        .section(&imports)
        .section(&functions)
        .section(&memories)
        .section(&globals)
        .section(&exports)
        .section(&code);
    let mut module = module.finish();
    wit_component::embed_component_metadata(
        &mut module,
        &resolve,
        world,
        wit_component::StringEncoding::UTF8,
        false,
    )
    .unwrap();
    wit_component::ComponentEncoder::default()
        .module(&module)
        .unwrap()
        .validate(true)
        .encode()
        .unwrap()
}

/// The imports of a component, by name.
fn imports_of(bytes: &[u8]) -> Vec<String> {
    let engine = wasmtime::Engine::default();
    let component = wasmtime::component::Component::new(&engine, bytes).unwrap();
    component
        .component_type()
        .imports(&engine)
        .map(|(name, _)| name.to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_importing_any_one_of_coords_interfaces_is_composed_and_served() {
    // Every interface the coordinator world exports, from the WIT: the
    // lease was once missing from a list kept by hand, and a function
    // importing only the lease was served uncomposed and could not link.
    let interfaces = coordinator_world_exports();
    assert_eq!(interfaces.len(), 4, "{interfaces:?}");
    let dir = std::env::temp_dir().join(format!("coord-single-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for interface in &interfaces {
        let function = function_importing_only(interface);
        let imports = imports_of(&function);
        let coord: Vec<&String> = imports.iter().filter(|n| n.starts_with("coord:")).collect();
        assert_eq!(
            coord,
            [interface],
            "{interface}: the test function's imports"
        );

        // What `coord serve` does with it: compose, compile, link.
        let server = coord_host::serve::Server::new(
            &function,
            std::sync::Arc::new(coord_host::backend::memory::MemoryBackend::default()),
        )
        .unwrap_or_else(|e| panic!("{interface}: not served: {e:#}"));
        assert!(server.composed(), "{interface}");
        assert!(
            coord_host::compose::imports_coord(&function).unwrap(),
            "{interface}: recognised as coord's"
        );
        let composed = coord_host::compose::plug(&function, coord_host::COMPONENT).unwrap();
        for name in imports_of(&composed) {
            assert!(
                name == "coord:sync/store@0.1.0" || name.starts_with("wasi:"),
                "{interface}: {name} left unplugged"
            );
        }

        // And over HTTP: the handler's call into coord returns (a link
        // error would stop `coord serve`; a failed call would trap), and
        // the handler then returns without a response, as it was written.
        let path = dir.join(format!("{}.wasm", interface.replace([':', '/', '@'], "-")));
        std::fs::write(&path, &function).unwrap();
        let serve = Serve::start(&[path.to_str().unwrap()]);
        let reply = get_raw(&serve, "/").await;
        assert!(reply.starts_with("HTTP/1.1 500"), "{interface}: {reply}");
        assert!(
            reply.contains("the function never set a response"),
            "{interface}: {reply}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stock_is_adjusted_under_a_fenced_lock_over_http() {
    let serve = Serve::start(&[]);
    let first = serve
        .call("POST", "/items/apple/adjust?delta=-3", None, "")
        .await;
    assert_eq!(first.status, 200, "{}", first.json);
    assert_eq!(first.json["stock"], 97);
    let second = serve
        .call("POST", "/items/apple/adjust?delta=5", None, "")
        .await;
    assert_eq!(second.json["stock"], 102);
    let (f1, f2): (u64, u64) = (
        first.json["fence"].as_str().unwrap().parse().unwrap(),
        second.json["fence"].as_str().unwrap().parse().unwrap(),
    );
    assert!(f2 > f1, "fences grow: {f1} then {f2}");
    let shown = serve.call("GET", "/items/apple", None, "").await;
    assert_eq!(shown.json["stock"], 102);
    assert_eq!(shown.json["fence"], second.json["fence"]);

    let refused = serve
        .call("POST", "/items/apple/adjust?delta=-500", None, "")
        .await;
    assert_eq!(refused.status, 409);
    assert_eq!(refused.json["field"], "delta");
    assert_eq!(
        serve.call("GET", "/items/apple", None, "").await.json["stock"],
        102,
        "a refused write changes nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_across_requests_blocks_others_and_a_lost_one_cannot_write() {
    let serve = Serve::start(&[]);
    let held = serve.call("POST", "/items/pear/lock", None, "").await;
    assert_eq!(held.status, 200, "{}", held.json);
    let lock = held.json.to_string();

    let busy = serve
        .call("POST", "/items/pear/adjust?delta=1", None, "")
        .await;
    assert_eq!(busy.status, 409);
    assert_eq!(busy.json["holderFence"], held.json["fence"]);
    assert!(busy.header("retry-after").is_some());

    let written = serve
        .call("POST", "/items/pear/adjust?delta=-1", None, &lock)
        .await;
    assert_eq!(written.status, 200, "{}", written.json);
    assert_eq!(written.json["fence"], held.json["fence"]);
    let extended = serve
        .call("POST", "/items/pear/lock/extend?ttl_ms=20000", None, &lock)
        .await;
    assert_eq!(extended.status, 200, "{}", extended.json);
    assert_eq!(extended.json["ttlMs"], 20000);
    let released = serve.call("DELETE", "/items/pear/lock", None, &lock).await;
    assert_eq!(released.json["released"], true);
    let again = serve.call("DELETE", "/items/pear/lock", None, &lock).await;
    assert_eq!(again.json["released"], false, "a released lock is gone");

    // A lock that lapses (1 ms TTL) is taken over; the old holder's write is
    // refused at the write boundary because a newer fence has written.
    let short = serve
        .call("POST", "/items/pear/lock?ttl_ms=1", None, "")
        .await;
    assert_eq!(short.status, 200, "{}", short.json);
    let newer = serve
        .call("POST", "/items/pear/adjust?delta=1&wait_ms=5000", None, "")
        .await;
    assert_eq!(newer.status, 200, "{}", newer.json);
    let stale = serve
        .call(
            "POST",
            "/items/pear/adjust?delta=1",
            None,
            &short.json.to_string(),
        )
        .await;
    // The commit-point check refuses it before the fence is even compared.
    assert_eq!(stale.status, 409, "{}", stale.json);
    assert_eq!(stale.json["field"], "body", "{}", stale.json);
    let lost = serve
        .call(
            "POST",
            "/items/pear/lock/extend",
            None,
            &short.json.to_string(),
        )
        .await;
    assert_eq!(lost.status, 409, "an expired lock cannot be extended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_are_limited_per_user_with_retry_after() {
    let serve = Serve::start(&[]);
    for n in 0..10 {
        let reply = serve.call("POST", "/exports", Some("ann"), "").await;
        assert_eq!(reply.status, 200, "export {n}: {}", reply.json);
        assert_eq!(reply.json["remaining"], 9 - n);
    }
    let limited = serve.call("POST", "/exports", Some("ann"), "").await;
    assert_eq!(limited.status, 429);
    let retry: u64 = limited.header("retry-after").unwrap().parse().unwrap();
    let retry_ms = limited.json["retryAfterMs"].as_u64().unwrap();
    // Sliding window: the previous window's count decays into the next one,
    // so a retry can be up to two windows away, never sooner than now.
    assert!((1..=120_000).contains(&retry_ms), "retryAfterMs {retry_ms}");
    assert_eq!(
        retry,
        retry_ms.div_ceil(1000),
        "the header is the body, in seconds"
    );
    let other = serve.call("POST", "/exports", Some("bob"), "").await;
    assert_eq!(other.status, 200, "another user has its own limit");
    let anonymous = serve.call("POST", "/exports", None, "").await;
    assert_eq!(anonymous.status, 400);
    assert_eq!(anonymous.json["field"], "x-user-id");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn editors_presence_upsert_touch_snapshot_watch_and_delete() {
    let serve = Serve::start(&[]);
    let before = serve.call("GET", "/items/fig/editors", None, "").await;
    assert_eq!(before.json["editors"], serde_json::json!([]));
    let joined = serve
        .call("PUT", "/items/fig/editors/s1", None, r#"{"userId":"ann"}"#)
        .await;
    assert_eq!(joined.status, 200, "{}", joined.json);
    let touched = serve
        .call("POST", "/items/fig/editors/s1/touch", None, "")
        .await;
    assert_eq!(touched.json["renewed"], true);
    let missing = serve
        .call("POST", "/items/fig/editors/nobody/touch", None, "")
        .await;
    assert_eq!(missing.status, 404);

    let snapshot = serve.call("GET", "/items/fig/editors", None, "").await;
    assert_eq!(snapshot.json["editors"][0]["session"], "s1");
    assert_eq!(snapshot.json["editors"][0]["value"]["userId"], "ann");
    let revision = snapshot.json["revision"].as_str().unwrap().to_string();

    // A watch after the snapshot's revision sees the next change only.
    let watch = format!("/items/fig/editors/watch?after={revision}&timeout_ms=5000");
    let watcher = serve.call("GET", &watch, None, "");
    let leave = async {
        // The watch is open before the delete or after it; it sees it either way.
        serve
            .call("DELETE", "/items/fig/editors/s1", None, "")
            .await
    };
    let (events, left) = tokio::join!(watcher, leave);
    assert_eq!(left.json["deleted"], true);
    assert_eq!(
        events.json["events"][0]["type"], "delete",
        "{}",
        events.json
    );
    assert_eq!(events.json["events"][0]["session"], "s1");
    let quiet = serve
        .call(
            "GET",
            &format!(
                "/items/fig/editors/watch?after={}&timeout_ms=10",
                events.json["revision"].as_str().unwrap()
            ),
            None,
            "",
        )
        .await;
    assert_eq!(
        quiet.json["events"],
        serde_json::json!([]),
        "nothing after the delete"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_errors_that_name_the_field() {
    let serve = Serve::start(&[]);
    let cases = [
        ("POST", "/items/kiwi/adjust?delta=lots", "", "delta"),
        ("POST", "/items/kiwi/adjust", "", "delta"),
        (
            "POST",
            "/items/kiwi/adjust?delta=1&wait_ms=-1",
            "",
            "wait_ms",
        ),
        ("POST", "/items/kiwi/adjust?delta=1", "{\"id\":1}", "body"),
        (
            "POST",
            "/items/kiwi/adjust?delta=1",
            r#"{"id":"inventory.stock","resource":"item:kiwi","owner":"x","fence":"ten","ttlMs":1,"expiresAt":1}"#,
            "body.fence",
        ),
        (
            "DELETE",
            "/items/kiwi/lock",
            r#"{"id":"inventory.stock","resource":"item:plum","owner":"x","fence":"1","ttlMs":1,"expiresAt":1}"#,
            "body.resource",
        ),
        ("POST", "/items/kiwi/lock?ttl_ms=999999999999", "", "ttl_ms"),
        ("PUT", "/items/kiwi/editors/s1", "not json", "body"),
        ("GET", "/nowhere", "", "path"),
    ];
    for (method, path, body, field) in cases {
        let reply = serve.call(method, path, None, body).await;
        assert!(
            (400..500).contains(&reply.status),
            "{method} {path}: {} {}",
            reply.status,
            reply.json
        );
        assert_eq!(
            reply.json["field"], field,
            "{method} {path}: {}",
            reply.json
        );
    }
    let big = "x".repeat(5000);
    let too_big = serve
        .call("PUT", "/items/kiwi/editors/s1", None, &format!("\"{big}\""))
        .await;
    assert_eq!(too_big.status, 400, "{}", too_big.json);
    assert_eq!(too_big.json["field"], "value");
    // Nothing was written by any of them.
    let stock = serve.call("GET", "/items/kiwi", None, "").await;
    assert_eq!(stock.json["fence"], "0");
    let editors = serve.call("GET", "/items/kiwi/editors", None, "").await;
    assert_eq!(editors.json["editors"], serde_json::json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_composed_by_coord_compose_is_served_as_it_is() {
    let dir = std::env::temp_dir().join(format!("coord-compose-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let function = dir.join("inventory-fn.wasm");
    let composed = dir.join("inventory.wasm");
    std::fs::write(&function, coord_host::serve::INVENTORY_FUNCTION).unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_coord"))
        .arg("compose")
        .arg(&function)
        .arg("-o")
        .arg(&composed)
        .status()
        .unwrap();
    assert!(status.success());
    let serve = Serve::start(&[composed.to_str().unwrap()]);
    let reply = serve
        .call("POST", "/items/plum/adjust?delta=1", None, "")
        .await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    assert_eq!(reply.json["stock"], 101);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The benchmark's hello function (examples/hello-fn), built by the build
/// script beside the other guests.
const HELLO_FUNCTION: &str = concat!(env!("OUT_DIR"), "/hello-fn.wasm");

/// `GET path` on a connection of its own, the whole reply as text (within
/// [`common::bounded`]'s limit).
async fn get_raw(serve: &Serve, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(&serve.address)
        .await
        .unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut reply = String::new();
    common::bounded(stream.read_to_string(&mut reply))
        .await
        .unwrap();
    reply
}

#[tokio::test]
async fn a_plain_wasi_http_function_without_coord_is_served_as_it_is() {
    // What the runtime benchmark serves from `coord serve` and `wasmtime
    // serve` alike: it imports nothing of coord's, so nothing is composed.
    let serve = Serve::start(&[HELLO_FUNCTION]);
    for _ in 0..3 {
        let reply = get_raw(&serve, "/").await;
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
        assert!(
            reply.to_ascii_lowercase().contains("content-length: 5"),
            "{reply}"
        );
        assert!(reply.ends_with("\r\n\r\nhello"), "{reply}");
    }
}

#[tokio::test]
async fn a_pool_sized_for_one_request_serves_one_request() {
    // The pool is sized from the function's bytes; wasmtime's own adapter
    // modules between the composed components are not in them, and a pool
    // counted without them once answered every request 503.
    let inventory = Serve::start(&["--max-requests", "1"]);
    let reply = inventory.call("GET", "/items/fig", None, "").await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    let hello = Serve::start(&[HELLO_FUNCTION, "--max-requests", "1"]);
    let reply = get_raw(&hello, "/").await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_that_traps_before_responding_costs_a_500_not_a_hung_request_or_its_instance() {
    // Two instances in the pool: had a trapped request kept its instance
    // (it once did, and hung until the client gave up), the third would
    // find none.
    let serve = Serve::start(&[HELLO_FUNCTION, "--max-requests", "2"]);
    for _ in 0..6 {
        let reply = get_raw(&serve, "/trap").await;
        assert!(reply.starts_with("HTTP/1.1 500"), "{reply}");
        assert!(reply.contains("the function trapped"), "{reply}");
        // The kind of trap, not the function's backtrace (the log has it).
        assert!(reply.contains("unreachable"), "{reply}");
        assert!(!reply.contains("backtrace"), "{reply}");
    }
    let reply = get_raw(&serve, "/").await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.ends_with("\r\n\r\nhello"), "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_serve_processes_on_one_redis_share_locks_presence_and_limits() {
    let prefix = Prefix::new("two").await;
    let args = [
        "--redis",
        prefix.url.as_str(),
        "--prefix",
        prefix.name.as_str(),
    ];
    two_processes_share_locks_presence_and_limits(&args).await;
    common::delete_prefix(&prefix.url, &prefix.name);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_serve_processes_on_one_nats_share_locks_presence_and_limits() {
    let url = common::nats_url();
    let subjects = format!("serve{}", std::process::id());
    let args = ["--nats", url.as_str(), "--prefix", subjects.as_str()];
    two_processes_share_locks_presence_and_limits(&args).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_serve_processes_on_one_redis_cluster_share_locks_presence_and_limits() {
    let url = tokio::task::spawn_blocking(common::redis_cluster_url)
        .await
        .unwrap();
    let prefix = format!("serve-cluster-{}", std::process::id());
    let args = ["--redis-cluster", url.as_str(), "--prefix", prefix.as_str()];
    two_processes_share_locks_presence_and_limits(&args).await;
    // With one replica acknowledging each write, the same holds.
    let acked = format!("{prefix}-acked");
    let args = [
        "--redis-cluster",
        url.as_str(),
        "--redis-replica-acks",
        "1",
        "--prefix",
        acked.as_str(),
    ];
    two_processes_share_locks_presence_and_limits(&args).await;
    common::delete_prefix(&url, &prefix);
    common::delete_prefix(&url, &acked);
}

/// Outside testers: the example kept every item's stock in one partition,
/// so on a Redis Cluster the whole table lived on one master (its failover
/// stopped every item) and on NATS every write rewrote the whole table. Each
/// item's record is a partition of its own now: twelve items' records land
/// on more than one master, and the export still lists every item.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_examples_items_spread_over_a_redis_clusters_masters() {
    use common::redis_cluster::{cli, parse_nodes};
    let url = tokio::task::spawn_blocking(common::redis_cluster_url)
        .await
        .unwrap();
    let prefix = format!("serve-spread-{}", std::process::id());
    let serve = Serve::start(&["--redis-cluster", url.as_str(), "--prefix", prefix.as_str()]);
    for n in 0..12 {
        let made = serve
            .call(
                "POST",
                &format!("/items/s{n}/adjust?delta=-{}", n + 1),
                None,
                "",
            )
            .await;
        assert_eq!(made.status, 200, "item s{n}: {}", made.json);
    }
    let exports = serve.call("POST", "/exports", Some("ann"), "").await;
    let mut listed: Vec<(String, i64)> = exports.json["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["item"].as_str().unwrap().to_string(),
                i["stock"].as_i64().unwrap(),
            )
        })
        .collect();
    listed.sort();
    let mut expected: Vec<(String, i64)> = (0..12).map(|n| (format!("s{n}"), 99 - n)).collect();
    expected.sort();
    assert_eq!(listed, expected, "{}", exports.json);

    let port: u16 = url
        .split(',')
        .next()
        .and_then(|u| u.rsplit(':').next())
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .unwrap();
    let nodes = parse_nodes(&cli(port, &["CLUSTER", "NODES"]).unwrap());
    let mut masters = std::collections::HashSet::new();
    for n in 0..12 {
        let key = format!("{prefix}:{{p:~inventory-record:s{n}}}:s");
        let slot: u16 = cli(port, &["CLUSTER", "KEYSLOT", &key])
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let master = nodes
            .iter()
            .find(|m| m.master && m.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot)))
            .unwrap();
        let exists = cli(master.port, &["EXISTS", &key]).unwrap();
        assert_eq!(exists.trim(), "1", "no record at {key} on its master");
        masters.insert(master.port);
    }
    assert!(
        masters.len() > 1,
        "twelve items' records are all on one master: {masters:?}"
    );
    common::delete_prefix(&url, &prefix);
}

/// `coord serve --cache-dir DIR` started in `cwd`, read until it listens,
/// then stopped: its compile-cache log line's (modules loaded, modules
/// compiled).
fn start_with_cache(cwd: &std::path::Path, args: &[&str]) -> (u64, u64) {
    use std::io::{BufRead, BufReader, Read};
    let mut child = Command::new(env!("CARGO_BIN_EXE_coord"))
        .current_dir(cwd)
        .arg("serve")
        .args(args)
        .args(["--listen", "127.0.0.1:0"])
        .env("COORD_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    for line in stdout.lines() {
        if line.unwrap().contains("listening on") {
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let mut log = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    let field = |name: &str| -> u64 {
        let at = log
            .find(&format!("{name}="))
            .unwrap_or_else(|| panic!("no {name} in the log: {log}"));
        log[at + name.len() + 1..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    (field("modules_loaded"), field("modules_compiled"))
}

/// The second start of the same function loads what the first compiled;
/// `--no-cache` keeps nothing.
#[test]
fn a_second_start_loads_the_compiled_function_from_the_cache() {
    let dir = std::env::temp_dir().join(format!("coord-cache-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cache = dir.to_str().unwrap();
    let here = std::env::temp_dir();
    let (loaded, compiled) = start_with_cache(&here, &["--cache-dir", cache]);
    assert_eq!(loaded, 0, "an empty cache loaded something");
    assert!(compiled > 0, "the first start compiled nothing");
    let (loaded, compiled) = start_with_cache(&here, &["--cache-dir", cache]);
    assert_eq!(compiled, 0, "the second start compiled again");
    assert!(loaded > 0, "the second start loaded nothing");

    // A relative directory is the working directory's (wasmtime's cache
    // takes only absolute ones: it was a warning and no cache at all).
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    start_with_cache(&work, &["--cache-dir", "relative"]);
    let (loaded, compiled) = start_with_cache(&work, &["--cache-dir", "relative"]);
    assert_eq!(compiled, 0, "a relative --cache-dir kept nothing");
    assert!(loaded > 0 && work.join("relative").is_dir());
    let _ = std::fs::remove_dir_all(&dir);

    let untouched = dir.join("untouched");
    let mut child = Command::new(env!("CARGO_BIN_EXE_coord"))
        .args(["serve", "--no-cache", "--listen", "127.0.0.1:0"])
        .env("XDG_CACHE_HOME", &untouched)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    for line in std::io::BufRead::lines(stdout) {
        if line.unwrap().contains("listening on") {
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!untouched.exists(), "--no-cache wrote a cache");
}

/// `coord serve ARGS` twice: a lock, presence and a limit through one are
/// the same through the other.
async fn two_processes_share_locks_presence_and_limits(args: &[&str]) {
    let a = Serve::start(args);
    let b = Serve::start(args);

    // A lock taken through one process is busy through the other.
    let held = a.call("POST", "/items/lime/lock", None, "").await;
    assert_eq!(held.status, 200, "{}", held.json);
    let busy = b.call("POST", "/items/lime/adjust?delta=1", None, "").await;
    assert_eq!(busy.status, 409, "{}", busy.json);
    assert_eq!(busy.json["holderFence"], held.json["fence"]);
    let released = b
        .call("DELETE", "/items/lime/lock", None, &held.json.to_string())
        .await;
    assert_eq!(
        released.json["released"], true,
        "released through the other"
    );
    let written = b
        .call("POST", "/items/lime/adjust?delta=-2", None, "")
        .await;
    assert_eq!(written.status, 200, "{}", written.json);
    assert_eq!(
        a.call("GET", "/items/lime", None, "").await.json["stock"],
        98
    );

    // Presence written through one is seen through the other.
    a.call("PUT", "/items/lime/editors/s1", None, r#"{"userId":"ann"}"#)
        .await;
    let seen = b.call("GET", "/items/lime/editors", None, "").await;
    assert_eq!(seen.json["editors"][0]["value"]["userId"], "ann");

    // The export limit is one limit across both processes.
    for n in 0..10 {
        let via = if n % 2 == 0 { &a } else { &b };
        let reply = via.call("POST", "/exports", Some("cat"), "").await;
        assert_eq!(reply.status, 200, "export {n}: {}", reply.json);
    }
    assert_eq!(
        a.call("POST", "/exports", Some("cat"), "").await.status,
        429
    );
    assert_eq!(
        b.call("POST", "/exports", Some("cat"), "").await.status,
        429
    );

    drop((a, b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_down_every_route_answers_503_and_work_resumes_after() {
    let mut server = common::RedisServer::spawn().unwrap();
    let url = server.url();
    let serve = Serve::start(&["--redis", url.as_str()]);
    let before = serve
        .call("POST", "/items/fig/adjust?delta=-1", None, "")
        .await;
    assert_eq!(before.status, 200, "{}", before.json);

    server.stop();
    // Unreachable is unavailable: never "busy", never a write, never a 429.
    let requests = [
        ("POST", "/items/fig/adjust?delta=-1", None, ""),
        ("POST", "/items/fig/lock", None, ""),
        ("POST", "/exports", Some("ann"), ""),
        ("PUT", "/items/fig/editors/s1", None, "{}"),
        ("GET", "/items/fig/editors", None, ""),
        ("GET", "/items/fig", None, ""),
    ];
    for (method, path, user, body) in requests {
        let reply = serve.call(method, path, user, body).await;
        assert_eq!(reply.status, 503, "{method} {path}: {}", reply.json);
    }

    // Restarted empty: the connection is re-made in the background, and the
    // fence still grows (revisions are seeded from the clock).
    server.start().unwrap();
    let mut after = None;
    for _ in 0..100 {
        let reply = serve
            .call("POST", "/items/fig/adjust?delta=-1", None, "")
            .await;
        if reply.status == 200 {
            after = Some(reply);
            break;
        }
        assert_eq!(
            reply.status, 503,
            "only unavailable while reconnecting: {}",
            reply.json
        );
        tokio::task::yield_now().await;
    }
    let after = after.expect("work resumes once Redis answers");
    let fence = |reply: &Reply| -> u64 { reply.json["fence"].as_str().unwrap().parse().unwrap() };
    assert!(
        fence(&after) > fence(&before),
        "fences stay monotonic across the restart"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_beyond_the_instance_limit_gets_503_until_one_frees() {
    let prefix = Prefix::new("full").await;
    let shared = [
        "--redis",
        prefix.url.as_str(),
        "--prefix",
        prefix.name.as_str(),
    ];
    let limited = Serve::start(&[&shared[..], &["--max-requests", "2"]].concat());
    let other = Serve::start(&shared);
    let snapshot = other.call("GET", "/items/box/editors", None, "").await;
    let watch = format!(
        "/items/box/editors/watch?after={}&timeout_ms=30000",
        snapshot.json["revision"].as_str().unwrap()
    );
    // A watch holds its instance until a change arrives; one that raced the
    // probe below for a slot is answered 503 and tries again.
    let hold = || async {
        loop {
            let reply = limited.call("GET", &watch, None, "").await;
            if reply.status != 503 {
                return reply;
            }
        }
    };
    let probe = async {
        let mut refused = None;
        for _ in 0..5000 {
            let reply = limited.call("GET", "/items/box", None, "").await;
            if reply.status == 503 {
                refused = Some(reply);
                break;
            }
            tokio::task::yield_now().await;
        }
        // Wake both watches through the other process.
        let joined = other.call("PUT", "/items/box/editors/s1", None, "{}").await;
        assert_eq!(joined.status, 200, "{}", joined.json);
        refused
    };
    let (first, second, refused) = tokio::join!(hold(), hold(), probe);
    let refused = refused.expect("with both instances held, a third request is refused");
    assert_eq!(refused.json["field"], "runtime", "{}", refused.json);
    for watched in [first, second] {
        assert_eq!(watched.status, 200, "{}", watched.json);
        assert_eq!(
            watched.json["events"][0]["type"], "upsert",
            "{}",
            watched.json
        );
    }
    // The instances are back in the pool: requests are served again.
    let mut served = false;
    for _ in 0..1000 {
        if limited.call("GET", "/items/box", None, "").await.status == 200 {
            served = true;
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(served, "requests are served once the watches returned");
    drop((limited, other));
    common::delete_prefix(&prefix.url, &prefix.name);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_waiting_past_the_deadline_gets_504_and_frees_its_instance() {
    // One instance and a 1 s deadline: an acquire waiting 20 s on a held
    // lock, and a watch long-polling 30 s, wait in host calls, where the
    // engine's epoch cannot stop them. The deadline must.
    let serve = Serve::start(&["--deadline-ms", "1000", "--max-requests", "1"]);
    // A request's instance is freed just after its response is sent, so the
    // next request may find it still taken for a moment: retry a 503 briefly
    // (a slot a waiting request kept would stay taken for 20 s).
    let when_free = |method: &'static str, path: String| {
        let serve = &serve;
        async move {
            for _ in 0..200 {
                let reply = serve.call(method, &path, None, "").await;
                if reply.status != 503 {
                    return reply;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            panic!("{method} {path}: no instance was freed within 2 s");
        }
    };
    let held = when_free("POST", "/items/plum/lock?ttl_ms=60000".into()).await;
    assert_eq!(held.status, 200, "{}", held.json);
    let watched = when_free("GET", "/items/plum/editors".into()).await;
    let watch = format!(
        "/items/plum/editors/watch?timeout_ms=30000&after={}",
        watched.json["revision"].as_str().unwrap()
    );
    for (method, path) in [
        ("POST", "/items/plum/adjust?delta=1&wait_ms=20000"),
        ("GET", watch.as_str()),
    ] {
        let started = std::time::Instant::now();
        let reply = when_free(method, path.to_string()).await;
        let took = started.elapsed();
        assert_eq!(reply.status, 504, "{path}: {}", reply.json);
        assert_eq!(reply.json["field"], "runtime", "{}", reply.json);
        let (least, most) = (
            std::time::Duration::from_millis(900),
            std::time::Duration::from_secs(5),
        );
        assert!(
            took >= least && took < most,
            "{path}: answered after {took:?}"
        );
        // The one instance is free again.
        let served = when_free("GET", "/items/plum".into()).await;
        assert_eq!(served.status, 200, "{}", served.json);
    }
}

/// The SDK's `with_lock` with `keep_alive` between steps, in the function:
/// a job of 5 × 150 ms under a lock of 300 ms keeps it to the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_audit_keeps_its_lock_alive_by_hand_past_its_ttl() {
    let serve = Serve::start(&[]);
    let audit = serve.call(
        "POST",
        "/items/fig/audit?steps=5&step_ms=150&ttl_ms=300",
        None,
        "",
    );
    let meanwhile = async {
        // Past the lock's first TTL: without keep_alive it would be free.
        tokio::time::sleep(std::time::Duration::from_millis(450)).await;
        serve
            .call("POST", "/items/fig/adjust?delta=-1", None, "")
            .await
    };
    let (audit, meanwhile) = tokio::join!(audit, meanwhile);
    assert_eq!(audit.status, 200, "{}", audit.json);
    assert_eq!(audit.json["steps"], 5);
    assert_eq!(meanwhile.status, 409, "still held: {}", meanwhile.json);
    assert_eq!(meanwhile.json["holderFence"], audit.json["fence"]);
    let after = serve
        .call("POST", "/items/fig/adjust?delta=-1", None, "")
        .await;
    assert_eq!(after.status, 200, "released at the end: {}", after.json);
    let limits = serve
        .call("POST", "/items/fig/audit?steps=21", None, "")
        .await;
    assert_eq!(limits.status, 400);
    assert_eq!(limits.json["field"], "steps");
}

/// `coord demo`, the README's story without HTTP, runs its five scenes to
/// the end: the stale write and the old epoch refused, the lease handed over.
#[test]
fn the_demo_runs_its_five_scenes() {
    demo_runs_its_five_scenes(&[]);
}

/// [`the_demo_runs_its_five_scenes`] with its state on NATS.
#[test]
fn the_demo_runs_its_five_scenes_on_nats() {
    let url = common::nats_url();
    demo_runs_its_five_scenes(&["--nats", url.as_str()]);
}

/// [`the_demo_runs_its_five_scenes`] with its state on a Redis Cluster.
#[test]
fn the_demo_runs_its_five_scenes_on_a_redis_cluster() {
    let url = common::redis_cluster_url();
    demo_runs_its_five_scenes(&["--redis-cluster", url.as_str()]);
}

/// Outside testers ran `coord demo --redis URL` twice at once: in every
/// round one demo exited 1 ("the lock ... was lost while the work ran",
/// then, once that was fixed, its lease scene found the other demo's node
/// holding the shared lease). Two at once on one Redis both run all five
/// scenes: they wait for each other's locks, and tell their own lease story.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_demos_at_once_on_one_redis_both_succeed() {
    let url = common::redis_url().await;
    let runs: Vec<_> = (0..2)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || demo_runs_its_five_scenes(&["--redis", url.as_str()]))
        })
        .collect();
    for run in runs {
        run.join().unwrap();
    }
}

fn demo_runs_its_five_scenes(store: &[&str]) {
    let output = Command::new(env!("CARGO_BIN_EXE_coord"))
        .arg("demo")
        .args(store)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for line in [
        "write refused",
        "done after 1.5 s, five TTLs; released",
        "took the lease over; the grace has",
        "does not write: node-b holds it",
        "Done.",
    ] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
}

/// SIGTERM while a request runs: the server stops accepting, lets the
/// running request finish within the grace period, and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_running_requests_finish_then_exits_zero() {
    let mut serve = Serve::start(&["--grace-ms", "5000"]);
    let address = serve.address.clone();
    let running = serve.call(
        "POST",
        "/items/kiwi/audit?steps=4&step_ms=250&ttl_ms=10000",
        None,
        "",
    );
    let stop = async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        serve.terminate();
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        // No longer accepting.
        tokio::net::TcpStream::connect(&address).await.is_err()
    };
    let (finished, refused) = tokio::join!(running, stop);
    assert_eq!(finished.status, 200, "not cut off: {}", finished.json);
    assert_eq!(finished.json["steps"], 4);
    assert!(refused, "new connections are refused after SIGTERM");
    let status = serve.wait();
    assert!(status.success(), "exits 0: {status:?}");
}

/// The command line: help for every command, and errors that name the flag.
#[test]
fn the_command_line_has_help_and_names_a_bad_flag() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_coord"))
            .args(args)
            .output()
            .unwrap()
    };
    let help = run(&["--help"]);
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    for command in ["serve", "compose", "demo"] {
        assert!(text.contains(command), "{text}");
        let sub = run(&[command, "--help"]);
        assert!(sub.status.success(), "{command} --help");
    }
    let bad = run(&["serve", "--max-requests", "0"]);
    assert_eq!(bad.status.code(), Some(2));
    let error = String::from_utf8_lossy(&bad.stderr);
    assert!(error.contains("--max-requests"), "{error}");
    let unknown = run(&["serve", "--no-such-flag"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("--no-such-flag"));
}

/// README shows `coord --help`; it stays what the binary prints.
#[test]
fn the_readme_shows_the_help_coord_prints() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let shown = readme
        .split("$ coord --help\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .expect("README has a `$ coord --help` block");
    let help = Command::new(env!("CARGO_BIN_EXE_coord"))
        .arg("--help")
        .output()
        .unwrap();
    assert_eq!(
        shown.trim_end(),
        String::from_utf8_lossy(&help.stdout).trim_end()
    );
}
