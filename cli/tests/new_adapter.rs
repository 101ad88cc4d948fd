//! `wrpc-broker new-adapter`: writes the template crate and the host's WIT into a new folder,
//! named after it or `--name`, and refuses a folder that is not empty. (That the written crate
//! builds and passes `check` is scripts/template-check.sh, run by scripts/test.sh.)

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn new_adapter(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_wrpc-broker"))
        .arg("new-adapter")
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("running wrpc-broker")
}

/// A fresh folder outside the workspace, as a third party's.
fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wrpc-new-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The repository's copy of a file, by path from the workspace root.
fn repo(path: &str) -> String {
    read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path))
}

#[test]
fn new_adapter_writes_the_template_and_the_hosts_wit() {
    let scratch = scratch();
    let dir = scratch.join("my-adapter");
    let output = new_adapter(&[dir.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for (written, source) in [
        ("src/lib.rs", "adapters/template/src/lib.rs"),
        ("src/log.rs", "adapters/template/src/log.rs"),
        ("src/backplane.rs", "adapters/template/src/backplane.rs"),
        ("wit/world.wit", "adapters/template/wit/world.wit"),
        (".gitignore", "adapters/template/.gitignore"),
        ("wit/deps/broker/worlds.wit", "wit/broker/worlds.wit"),
        ("wit/deps/broker/log.wit", "wit/broker/log.wit"),
        ("wit/deps/memory/store.wit", "adapters/memory/wit/store.wit"),
    ] {
        assert_eq!(read(&dir.join(written)), repo(source), "{written}");
    }
    let manifest = read(&dir.join("Cargo.toml"));
    assert!(manifest.contains("name = \"my-adapter\""), "{manifest}");
    assert!(
        manifest.contains("wit-bindgen = { version = \"=0.61.1\""),
        "{manifest}"
    );
    assert!(
        !manifest.contains("path ="),
        "a path dependency:\n{manifest}"
    );
    assert!(read(&dir.join("Cargo.lock")).contains("name = \"my-adapter\""));
    assert!(
        out.contains("wrpc-broker check target/wasm32-wasip2/release/my_adapter.wasm"),
        "{out}"
    );
    std::fs::remove_dir_all(&scratch).unwrap();
}

#[test]
fn new_adapter_takes_a_name_and_an_empty_folder() {
    let dir = scratch();
    let output = new_adapter(&[dir.to_str().unwrap(), "--name", "kv_adapter"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(read(&dir.join("Cargo.toml")).contains("name = \"kv_adapter\""));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn new_adapter_refuses_a_folder_that_is_not_empty() {
    let dir = scratch();
    std::fs::write(dir.join("notes.txt"), "mine").unwrap();
    let output = new_adapter(&[dir.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(err.contains("is not empty"), "{err}");
    assert_eq!(read(&dir.join("notes.txt")), "mine");
    assert!(!dir.join("Cargo.toml").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn new_adapter_refuses_a_name_cargo_would_not_take() {
    let dir = scratch();
    let output = new_adapter(&[dir.join("2 fast").to_str().unwrap()]);
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        err.contains("cannot name the crate") && err.contains("--name"),
        "{err}"
    );
    assert!(!dir.join("2 fast").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}
