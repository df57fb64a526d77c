//! Composition: what a composed function imports, coord's interfaces read
//! from `coord.wasm`, a function for each interface, and functions served as
//! they are (composed already, or without coord).

use std::process::Command;

use crate::common;
use crate::process::Serve;

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
    let function = names(coord_guests::INVENTORY_FUNCTION);
    assert!(
        function.iter().any(|n| n.starts_with("coord:sync/lock@")),
        "the function imports the lock: {function:?}"
    );

    let composed =
        coord_serve::compose::plug(coord_guests::INVENTORY_FUNCTION, coord_host::COMPONENT)
            .unwrap();
    let imports = names(&composed);
    assert!(imports.contains(&"coord:sync/store@0.1.0".to_string()));
    for name in &imports {
        assert!(
            name == "coord:sync/store@0.1.0" || name.starts_with("wasi:"),
            "unexpected import {name} in {imports:?}"
        );
    }
    for coord in coord_serve::compose::coord_exports().unwrap() {
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
    let error = coord_serve::compose::plug(coord_host::COMPONENT, coord_host::COMPONENT)
        .unwrap_err()
        .to_string();
    assert!(error.contains("plugging coord"), "{error}");
}

/// The interfaces the `coordinator` world of `wit/world.wit` exports, read
/// from the WIT itself.
fn coordinator_world_exports() -> Vec<String> {
    let mut resolve = wit_parser::Resolve::new();
    let (package, _) = resolve
        .push_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../../wit"))
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
    let mut from_wasm = coord_serve::compose::coord_exports().unwrap().to_vec();
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
    assert_eq!(interfaces.len(), 6, "{interfaces:?}");
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
        let server = coord_serve::Server::new(
            &function,
            std::sync::Arc::new(coord_host::backend::memory::MemoryBackend::default()),
        )
        .unwrap_or_else(|e| panic!("{interface}: not served: {e:#}"));
        assert!(server.composed(), "{interface}");
        assert!(
            coord_serve::compose::imports_coord(&function).unwrap(),
            "{interface}: recognised as coord's"
        );
        let composed = coord_serve::compose::plug(&function, coord_host::COMPONENT).unwrap();
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
async fn a_function_composed_by_coord_compose_is_served_as_it_is() {
    let dir = std::env::temp_dir().join(format!("coord-compose-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let function = dir.join("inventory-fn.wasm");
    let composed = dir.join("inventory.wasm");
    std::fs::write(&function, coord_guests::INVENTORY_FUNCTION).unwrap();
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
pub(super) const HELLO_FUNCTION: &str = coord_guests::HELLO_FUNCTION_PATH;

/// `GET path` on a connection of its own, the whole reply as text (within
/// [`common::bounded`]'s limit).
pub(super) async fn get_raw(serve: &Serve, path: &str) -> String {
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
