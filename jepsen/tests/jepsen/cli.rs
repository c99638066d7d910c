//! Proves the `jepsen check` command line: exit 0 for a linearizable
//! history, 1 for a non-linearizable one (with the failing operation in the
//! verdict), 2 for a broken file and for an exhausted budget; `-o json`
//! prints a parsable report; JSON lines written by the library read back.

use std::process::Command;

use jepsen::history::{EventType, Function, write_json_lines};

use crate::common::event;

fn jepsen(args: &[&str]) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_jepsen"))
        .args(args)
        .output()
        .expect("runs the jepsen binary");
    let code = output.status.code().expect("exited normally");
    (code, String::from_utf8_lossy(&output.stdout).to_string())
}

fn write(dir: &std::path::Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("writes");
    path.to_string_lossy().to_string()
}

#[test]
fn exit_codes_and_json_output() {
    let dir = std::env::temp_dir().join(format!("jepsen-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let good = write(
        &dir,
        "good.log",
        "INFO  jepsen.util - 0\t:invoke\t:write\t1\nINFO  jepsen.util - 0\t:ok\t:write\t1\n\
         INFO  jepsen.util - 1\t:invoke\t:read\tnil\nINFO  jepsen.util - 1\t:ok\t:read\t1\n",
    );
    let bad = write(
        &dir,
        "bad.log",
        "INFO  jepsen.util - 0\t:invoke\t:write\t1\nINFO  jepsen.util - 0\t:ok\t:write\t1\n\
         INFO  jepsen.util - 1\t:invoke\t:read\tnil\nINFO  jepsen.util - 1\t:ok\t:read\t2\n",
    );
    let broken = write(
        &dir,
        "broken.log",
        "INFO  jepsen.util - 0\t:invoke\t:frobnicate\t1\n",
    );

    assert_eq!(jepsen(&["check", "--model", "cas-register", &good]).0, 0);
    let (code, text) = jepsen(&["check", "--model", "cas-register", &bad]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("NOT VALID") && text.contains("fails at"),
        "{text}"
    );
    assert_eq!(jepsen(&["check", "--model", "cas-register", &broken]).0, 2);
    assert_eq!(
        jepsen(&["check", "--model", "cas-register", "/nonexistent/history"]).0,
        2
    );
    let (code, text) = jepsen(&[
        "check",
        "--model",
        "cas-register",
        "--step-budget",
        "0",
        &good,
    ]);
    assert_eq!(code, 2, "an exhausted budget is not a verdict: {text}");

    let (code, json) = jepsen(&["check", "--model", "cas-register", "-o", "json", &bad]);
    assert_eq!(code, 1);
    let report: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
    assert_eq!(report["verdict"], "not-linearizable");
    assert_eq!(
        report["linearizability"]["keys"][0]["verdict"],
        "not-linearizable"
    );

    // Our own JSON lines, with the register model.
    let mut write_ok = event(0, EventType::Ok, Function::Write, "k", Some("a"));
    write_ok.version = Some(1 << 16);
    write_ok.index = Some(1);
    let mut read_ok = event(1, EventType::Ok, Function::Read, "k", Some("a"));
    read_ok.version = Some(1 << 16);
    read_ok.index = Some(1);
    let events = vec![
        event(0, EventType::Invoke, Function::Write, "k", Some("a")),
        write_ok,
        event(1, EventType::Invoke, Function::Read, "k", None),
        read_ok,
    ];
    let mut text = Vec::new();
    write_json_lines(&events, &mut text).expect("writes");
    let path = write(
        &dir,
        "history.jsonl",
        &String::from_utf8(text).expect("utf-8"),
    );
    let (code, out) = jepsen(&["check", "--model", "register", &path]);
    assert_eq!(code, 0, "{out}");
    let (code, exported) = jepsen(&["export", &path]);
    assert_eq!(code, 0);
    assert!(
        exported.contains("INFO  jepsen.util - 1\t:ok\t:read\t[\"k\" \"a\"]"),
        "{exported}"
    );
    std::fs::remove_dir_all(&dir).expect("cleans up");
}
