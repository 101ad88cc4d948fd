//! The `wrpc-broker` binary end to end: `demo` runs to completion, `inspect` describes the
//! embedded memory adapter and refuses a missing file, and an unsupported `--broker` is refused.

use std::process::{Command, Output};

fn wrpc_broker(args: &[&str]) -> Output {
    wrpc_broker_env(args, &[("RUST_LOG", "warn")])
}

fn wrpc_broker_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_wrpc-broker"))
        .args(args)
        .envs(env.iter().copied())
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

/// The whole demo on NATS. (On Redis it runs too, but in one run of three a job the old adapter
/// held at the hot swap did not come back within a minute: an open finding, see the issue.)
#[test]
fn demo_runs_on_nats() {
    demo_runs_on("nats://127.0.0.1:4222");
}

#[test]
fn demo_runs_on_redis() {
    demo_runs_on("redis://127.0.0.1:6379");
}

/// The demo on the server at `url`, to the end, with every job of the swap handled.
fn demo_runs_on(url: &str) {
    let output = wrpc_broker(&["demo", "--broker", url]);
    let out = stdout(&output);
    assert!(
        output.status.success(),
        "{url}:\n{out}\n{}",
        stderr(&output)
    );
    assert!(out.contains(&format!("on the broker at {url}")), "{out}");
    assert!(out.contains("400 of 400 jobs handled"), "{out}");
}

#[test]
fn migrate_moves_a_host_from_memory_to_redis_and_prints_each_step() {
    let output = wrpc_broker(&[
        "migrate",
        "--from",
        "memory://",
        "--to",
        "redis://127.0.0.1:6379",
        "--messages",
        "400",
    ]);
    let out = stdout(&output);
    assert!(output.status.success(), "{out}\n{}", stderr(&output));
    for step in [
        "switched: every write goes to redis",
        "consumers moved",
        "queue `orders` drained on the old broker",
        "readers moved: 1 finished the old feed",
        "the old adapter is closed",
        "400 messages handled",
    ] {
        assert!(out.contains(step), "no `{step}` in:\n{out}");
    }
}

#[test]
fn demo_refuses_an_unsupported_broker() {
    let output = wrpc_broker(&["demo", "--broker", "mqtt://127.0.0.1:1883"]);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("broker URL scheme `mqtt` is not supported by this build"),
        "{}",
        stderr(&output)
    );
}

/// A copy of `component` in a fresh directory outside the workspace (as a third party's file).
fn outside_copy(component: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("wrpc-check-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("adapter.wasm");
    std::fs::copy(component, &copy).unwrap();
    copy
}

#[test]
fn check_passes_the_memory_adapter_copied_outside_the_workspace() {
    let copy = outside_copy(wrpc_broker_contract::components::MEMORY);
    let output = wrpc_broker(&["check", copy.to_str().unwrap()]);
    let out = stdout(&output);
    assert!(output.status.success(), "{out}\n{}", stderr(&output));
    for capability in ["backplane", "log", "queue", "direct"] {
        assert!(
            out.lines()
                .any(|l| l.starts_with(capability) && l.contains(" pass ")),
            "{capability}:\n{out}"
        );
    }
    assert!(!out.contains("FAIL"), "{out}");
    assert!(out.contains(" 0 failed, 0 skipped"), "{out}");
    std::fs::remove_dir_all(copy.parent().unwrap()).unwrap();
}

#[test]
fn check_fails_a_mutant_naming_the_broken_test() {
    for (mutant, filter, broken) in [
        (
            "skip-entry",
            "log/",
            "append_100_with_headers_and_keys_reads_back_in_order",
        ),
        (
            "lose-retry",
            "queue/retry",
            "retry_redelivers_after_the_delay_with_attempt_plus_one",
        ),
    ] {
        let path = wrpc_broker_contract::components::MUTANTS
            .iter()
            .find(|(m, _)| *m == mutant)
            .unwrap()
            .1;
        let copy = outside_copy(path);
        let output = wrpc_broker(&["check", copy.to_str().unwrap(), "--filter", filter]);
        let out = stdout(&output);
        assert!(!output.status.success(), "mutant {mutant} passed:\n{out}");
        assert!(
            out.lines()
                .any(|l| l.contains(broken) && l.contains("FAIL")),
            "mutant {mutant}:\n{out}"
        );
        assert!(
            stderr(&output).contains("failed the contract suite"),
            "{}",
            stderr(&output)
        );
        std::fs::remove_dir_all(copy.parent().unwrap()).unwrap();
    }
}

#[test]
fn bench_prints_the_table_for_memory() {
    let output = wrpc_broker(&["bench", "--duration", "0.3"]);
    let out = stdout(&output);
    assert!(output.status.success(), "{out}\n{}", stderr(&output));
    for operation in [
        "floor step: call_concurrent vs a plain call",
        "floor: a pending import over loopback TCP",
        "trivial export call after a loopback round trip",
        "log append, 1 in flight",
        "queue produce+consume+ack, prefetch 64",
        "direct request/reply",
        "backplane publish → 1000",
        "cold compile",
    ] {
        assert!(out.contains(operation), "{operation}:\n{out}");
    }
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

#[test]
fn inspect_and_check_say_a_file_is_not_a_component() {
    let dir = std::env::temp_dir().join(format!("wrpc-not-a-component-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = dir.join("notes.wasm");
    std::fs::write(&text, "(component) is not a binary").unwrap();
    let module = dir.join("module.wasm");
    std::fs::write(&module, [b"\0asm".as_slice(), &[1, 0, 0, 0]].concat()).unwrap();
    for command in ["inspect", "check"] {
        for (file, expected) in [
            (&text, "not a WebAssembly component"),
            (&module, "a core WebAssembly module"),
        ] {
            let output = wrpc_broker(&[command, file.to_str().unwrap()]);
            assert!(!output.status.success(), "{command} {}", file.display());
            assert!(
                stderr(&output).contains(expected),
                "{command} {}: {}",
                file.display(),
                stderr(&output)
            );
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn demo_output_in_a_file_has_no_colour_codes() {
    let output = wrpc_broker_env(&["demo"], &[("RUST_LOG", "debug")]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        stderr(&output).lines().count() > 10,
        "log lines at debug level: {}",
        stderr(&output)
    );
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        stderr(&output)
    );
    assert!(!all.contains('\u{1b}'), "an escape code in:\n{all}");
}

#[test]
fn workers_sets_the_runtime_and_refuses_zero() {
    let output = wrpc_broker(&["--workers", "1", "demo"]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stdout(&output).contains("reader 2 resumed with orders 3, 4 and 5"));
    let output = wrpc_broker(&["demo", "--workers", "0"]);
    assert!(!output.status.success());
    assert!(stderr(&output).contains("--workers"), "{}", stderr(&output));
}
