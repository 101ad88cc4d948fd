//! The `wrpc-broker` binary end to end: `demo` runs to completion, `inspect` describes the
//! embedded memory adapter and refuses a missing file, and an unsupported `--broker` is refused.

use std::process::{Command, Output};

fn wrpc_broker(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_wrpc-broker"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("running wrpc-broker")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn demo_runs_to_the_summary() {
    let output = wrpc_broker(&["demo"]);
    let out = stdout(&output);
    assert!(output.status.success(), "{out}\n{}", stderr(&output));
    // Reader 2 resumed after order 2: it got orders 3, 4 and 5.
    for n in 3..=5 {
        assert!(
            out.contains(&format!(r#"reader 2 (A) got offset {}, "#, n - 1))
                && out.contains(&format!(r#"{{"order":{n},"#)),
            "order {n} not resumed:\n{out}"
        );
    }
    assert!(
        out.contains("reader 2 resumed with orders 3, 4 and 5"),
        "{out}"
    );
    assert!(!out.contains("reader 2 (A) got offset 1,"), "{out}");
    // The three room deliveries, and the literal `room:*` staying silent.
    for who in ["alice (on A)", "bob (on A)", "carol (on B)"] {
        assert!(
            out.contains(&format!(r#"{who} got "hello from B""#)),
            "{who}:\n{out}"
        );
    }
    assert!(out.contains("got nothing"), "{out}");
    assert!(
        out.contains("refused with 400") && out.contains("refused with 410"),
        "{out}"
    );
    assert!(out.contains("Summary."), "{out}");
}

#[test]
fn demo_refuses_an_unsupported_broker() {
    let output = wrpc_broker(&["demo", "--broker", "redis://localhost:6379"]);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("broker URL scheme `redis` is not supported yet (memory)"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn inspect_lists_the_memory_adapter() {
    let output = wrpc_broker(&["inspect", wrpc_broker_contract::components::MEMORY]);
    let out = stdout(&output);
    assert!(output.status.success(), "{out}\n{}", stderr(&output));
    let line = |key: &str| {
        out.lines()
            .find(|l| l.starts_with(&format!("{key}:")))
            .unwrap_or_else(|| panic!("no `{key}:` line in:\n{out}"))
            .to_string()
    };
    assert!(
        line("capabilities").ends_with("backplane, log, queue, direct"),
        "{out}"
    );
    assert!(line("name").ends_with("memory"), "{out}");
    assert!(line("imports").contains("wrpc:memory/store"), "{out}");
    assert!(out.contains("retention.maxEntries"), "{out}");
}

#[test]
fn inspect_refuses_a_missing_file() {
    let output = wrpc_broker(&["inspect", "/nonexistent/adapter.wasm"]);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("/nonexistent/adapter.wasm"),
        "{}",
        stderr(&output)
    );
}
