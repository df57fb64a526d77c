//! The operator's commands against a changing and a hostile store: a
//! forced release frees only the holder it showed, and what clients wrote
//! cannot write on the operator's terminal.

use std::io::Write;

use super::{coord, instance_on, json, spawn_coord, take, wait_bounded};
use crate::common::{self, redis_url};
use coord_host::ephemeral::Space;
use serde_json::Value;

/// Outside testers (7): the prompt showed fence F1; while it waited, F1 was
/// released and the lock taken again (F2) elsewhere; `y` then freed F2, a
/// holder the operator never saw. The release is now guarded by the holder
/// shown (fence and owner): it frees nothing and names the new holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_frees_only_the_holder_it_showed() {
    let url = redis_url().await;
    let (mut i, prefix) = instance_on(&url).await;
    for json in [false, true] {
        let resource = format!("item:swap-{json}");
        let first = take(&mut i, "inventory.stock", &resource).await;
        let mut args = vec!["lock", "release", "--force", "inventory.stock", &resource];
        if json {
            args.push("--json");
        }
        let mut child = spawn_coord(&args, &url, &prefix);
        // Read the prompt as it is written (it ends without a newline).
        let mut stderr = child.stderr.take().unwrap();
        let (prompted, prompt) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut seen = Vec::new();
            let mut byte = [0u8; 1];
            let mut sent = false;
            while let Ok(1) = std::io::Read::read(&mut stderr, &mut byte) {
                seen.push(byte[0]);
                if !sent && seen.ends_with(b"[y/N] ") {
                    let _ = prompted.send(String::from_utf8_lossy(&seen).into_owned());
                    sent = true;
                }
            }
            String::from_utf8_lossy(&seen).into_owned()
        });
        let shown = prompt
            .recv_timeout(std::time::Duration::from_secs(90))
            .expect("the prompt");
        assert!(shown.contains(&first.fence.to_string()), "{shown}");
        // Meanwhile, elsewhere: F1 is released and the lock taken again.
        assert!(i.lock().release(&first).await.unwrap().unwrap());
        let second = take(&mut i, "inventory.stock", &resource).await;
        assert!(second.fence > first.fence);
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"y\n").unwrap();
        drop(stdin);
        let output = wait_bounded(child, "lock release");
        let stderr = reader.join().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert_eq!(output.status.code(), Some(1), "{stdout} / {stderr}");
        assert!(
            i.lock().is_held(&second).await.unwrap().unwrap(),
            "the holder the operator never saw keeps its lock: {stdout} / {stderr}"
        );
        if json {
            let answer = json_text(&stdout);
            assert_eq!(answer["released"], false, "{answer}");
            assert_eq!(answer["changed"], true, "{answer}");
            assert_eq!(
                answer["shown"]["fence"],
                first.fence.to_string(),
                "{answer}"
            );
            assert_eq!(answer["now"]["fence"], second.fence.to_string(), "{answer}");
        } else {
            let said = format!("{stdout}{stderr}");
            assert!(!said.contains("released inventory.stock"), "{said}");
            assert!(said.contains("not released"), "{said}");
            assert!(said.contains("changed"), "{said}");
            assert!(
                said.contains(&second.fence.to_string()),
                "names the new holder: {said}"
            );
        }
        assert!(i.lock().release(&second).await.unwrap().unwrap());
    }
    common::delete_prefix(&url, &prefix);
}

fn json_text(text: &str) -> Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// Whether `text` holds a character a terminal would act on or hide: a C0
/// or C1 control, DEL, a bidi control, a zero-width character.
fn raw_control(text: &str) -> Option<char> {
    text.chars().find(|&c| {
        (c.is_control() && c != '\n')
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{2028}' | '\u{2029}' | '\u{feff}')
    })
}

/// Outside testers (8): a client named its editor session
/// `evil\nforged-row\x1b[2J` through the example function; `coord ephemeral
/// list` printed the newline raw (a forged row) and the escape (the screen
/// cleared). Every table now shows such characters escaped; `--json` keeps
/// the exact value, and a value that is not UTF-8 comes out as base64.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_clients_wrote_cannot_write_on_the_operators_terminal() {
    let url = redis_url().await;
    let (mut i, prefix) = instance_on(&url).await;
    let serve = crate::process::Serve::start(&["--redis", &url, "--prefix", &prefix]);
    let put = serve
        .call(
            "PUT",
            "/items/apple/editors/evil%0Aforged-row%1B%5B2J",
            None,
            "{\"name\":\"\u{202e}gnp.exe\u{9b}2J\u{7f}\"}",
        )
        .await;
    assert_eq!(put.status, 200, "{}", put.json);
    let editors = Space {
        id: "inventory.editors".into(),
        ttl_ms: 30_000,
        max_value_bytes: 4096,
    };
    // Bytes that are not UTF-8, as a function in bytes mode may store them.
    i.ephemeral()
        .upsert(&editors, "apple", "binary", &[0xff, 0x00, b'a', 0x80])
        .await
        .unwrap()
        .unwrap();

    let table = coord(
        &["ephemeral", "list", "inventory.editors", "apple"],
        &url,
        &prefix,
        "",
    );
    assert!(table.status.success());
    let text = String::from_utf8(table.stdout).unwrap();
    assert_eq!(raw_control(&text), None, "{text:?}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "a header, two entries, a count: {text}");
    assert!(!text.lines().any(|l| l.starts_with("forged-row")), "{text}");
    assert!(text.contains("evil\\nforged-row\\x1b[2J"), "{text}");
    assert!(text.contains("\\u{202e}gnp.exe\\u{9b}2J\\x7f"), "{text}");
    assert!(text.contains("\\xff\\x00a\\x80"), "{text}");

    let listed = coord(
        &["ephemeral", "list", "inventory.editors", "apple", "--json"],
        &url,
        &prefix,
        "",
    );
    let raw = String::from_utf8(listed.stdout.clone()).unwrap();
    assert_eq!(raw_control(&raw), None, "JSON escapes them too: {raw:?}");
    let listed = json(&listed);
    let entries = listed["entries"].as_array().unwrap();
    let binary = entries.iter().find(|e| e["key"] == "binary").unwrap();
    assert_eq!(binary["valueBase64"], "/wBhgA==", "{binary}");
    assert!(binary.get("value").is_none(), "{binary}");
    let evil = entries
        .iter()
        .find(|e| e["key"] == "evil\nforged-row\x1b[2J")
        .unwrap();
    assert_eq!(
        evil["value"],
        "{\"name\":\"\u{202e}gnp.exe\u{9b}2J\u{7f}\"}"
    );
    assert!(evil.get("valueBase64").is_none(), "{evil}");

    let watched = coord(
        &[
            "ephemeral",
            "watch",
            "inventory.editors",
            "apple",
            "--for-ms",
            "300",
        ],
        &url,
        &prefix,
        "",
    );
    let raw = String::from_utf8(watched.stdout).unwrap();
    assert_eq!(raw_control(&raw), None, "{raw:?}");
    let events: Vec<Value> = raw.lines().map(json_text).collect();
    assert!(
        events
            .iter()
            .any(|e| e["key"] == "binary" && e["valueBase64"] == "/wBhgA=="),
        "{raw}"
    );
    assert!(
        events.iter().any(|e| e["key"] == "evil\nforged-row\x1b[2J"),
        "{raw}"
    );

    // What the operator typed is echoed escaped too, in every table.
    for args in [
        &["lock", "inspect", "inventory.stock", "item:\x1b[2J"][..],
        &[
            "limit",
            "peek",
            "inventory.exports",
            "user:\u{202e}x",
            "--limit",
            "10",
            "--window",
            "60000",
        ],
    ] {
        let out = coord(args, &url, &prefix, "");
        assert!(
            out.status.success(),
            "{:?}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        assert_eq!(raw_control(&text), None, "{text:?}");
    }
    common::delete_prefix(&url, &prefix);
}
