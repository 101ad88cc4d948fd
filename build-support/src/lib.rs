//! Builds adapter components (cdylib crates of this workspace) for `wasm32-wasip2` from a build
//! script, so `cargo build` / `cargo test` at the root need no manual step.
//!
//! The nested `cargo build` uses its own target dir (`<target>/wasm-components`): sharing the
//! outer one would deadlock on its lock.

use std::path::{Path, PathBuf};
use std::process::Command;

mod python;

pub use python::{COMPONENTIZE_PY, PythonBuild, build_python};

/// The wasm target every component is built for.
pub const TARGET: &str = "wasm32-wasip2";
/// The cargo profile components are built with (see the workspace `Cargo.toml`).
pub const PROFILE: &str = "component";

/// One component to build: a workspace package with a set of features, saved under `name`.
pub struct Build<'a> {
    /// The cargo package, e.g. `wrpc-adapter-memory`.
    pub package: &'a str,
    /// Cargo features to enable (e.g. a mutant).
    pub features: &'a [&'a str],
    /// The file name (without `.wasm`) the component is saved as.
    pub name: &'a str,
}

/// The workspace root: the nearest ancestor of the calling crate's manifest dir whose
/// `Cargo.toml` has a `[workspace]` table.
pub fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .find(|dir| {
            std::fs::read_to_string(dir.join("Cargo.toml"))
                .is_ok_and(|toml| toml.lines().any(|l| l.trim() == "[workspace]"))
        })
        .expect("the workspace root (a Cargo.toml with [workspace])")
        .to_path_buf()
}

/// A driver crate's build script: build the adapter component `wrpc-adapter-<name>` (the
/// folder above the driver) and export its path as `WRPC_<NAME>_COMPONENT`, for the driver's
/// `include_bytes!` of the adapter it ships for its URLs.
pub fn embed_adapter(name: &str) {
    // Only what this adapter is built from: its folder (sources, WIT, files it includes such
    // as the Redis adapter's Lua scripts), not the driver beside it (host code), nor the
    // other adapters.
    let root = workspace_root();
    let own = root.join("adapters").join(name);
    let own_inputs = std::fs::read_dir(&own)
        .unwrap_or_else(|e| panic!("reading {}: {e}", own.display()))
        .map(|entry| entry.expect("reading the adapter's folder").path())
        .filter(|path| !path.ends_with("driver"));
    let shared = [
        root.join("wit"),
        root.join("guest-sdk"),
        root.join("Cargo.toml"),
        root.join("Cargo.lock"),
    ];
    for path in shared.into_iter().chain(own_inputs) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    let package = format!("wrpc-adapter-{name}");
    let build = Build {
        package: &package,
        features: &[],
        name,
    };
    let path = build_all(std::slice::from_ref(&build)).remove(0);
    println!(
        "cargo:rustc-env=WRPC_{}_COMPONENT={}",
        name.to_uppercase().replace('-', "_"),
        path.display()
    );
}

/// The outer target dir: the first ancestor of `OUT_DIR` holding `CACHEDIR.TAG`.
fn outer_target_dir() -> PathBuf {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    out.ancestors()
        .find(|dir| dir.join("CACHEDIR.TAG").exists())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| out.join("target"))
}

/// Tell cargo to rerun the build script when any component source changes. The adapter
/// template (`adapters/template/`, no workspace member: the CLI embeds it) is left out, so that
/// editing or building it does not rebuild the host. A new adapter folder changes `Cargo.lock`.
pub fn rerun_if_sources_change() {
    let root = workspace_root();
    let adapters = std::fs::read_dir(root.join("adapters"))
        .expect("reading adapters/")
        .map(|entry| entry.expect("reading adapters/").path())
        .filter(|path| !path.ends_with("template"));
    let fixed = [
        "wit",
        "guest-sdk",
        "tests/components",
        "Cargo.toml",
        "Cargo.lock",
    ];
    for path in fixed.iter().map(|dir| root.join(dir)).chain(adapters) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

/// Build the Python adapter in `adapters/<folder>` (its module `app`, its world `adapter` in
/// `wit/`) with the pinned componentize-py, save it as `<name>.wasm` beside the Rust
/// components and return its path. Rebuilt only when the folder's sources change.
pub fn build_python_adapter(folder: &str, name: &str) -> PathBuf {
    println!("cargo:rerun-if-env-changed=WRPC_PYTHON");
    let dir = workspace_root().join("adapters").join(folder);
    let target_dir = outer_target_dir().join("wasm-components");
    let out_dir = target_dir.join("out");
    std::fs::create_dir_all(&out_dir).expect("creating the component output dir");
    let build = PythonBuild {
        dir: &dir,
        world: "adapter",
        app: "app",
        name,
    };
    build_python(&build, &target_dir.join("python"), &out_dir)
}

/// Build each component and return the paths of the `.wasm` files, in order.
pub fn build_all(builds: &[Build<'_>]) -> Vec<PathBuf> {
    let root = workspace_root();
    let target_dir = outer_target_dir().join("wasm-components");
    let out_dir = target_dir.join("out");
    std::fs::create_dir_all(&out_dir).expect("creating the component output dir");
    // WRPC_COMPONENT_CARGO: another cargo for the components (cargo fuzz builds the host with
    // nightly, which has no wasm32-wasip2 standard library here; see scripts/fuzz.sh).
    let cargo = std::env::var("WRPC_COMPONENT_CARGO")
        .or_else(|_| std::env::var("CARGO"))
        .unwrap_or_else(|_| "cargo".into());
    builds
        .iter()
        .map(|build| {
            let mut cmd = Command::new(&cargo);
            cmd.current_dir(&root)
                .args([
                    "build",
                    "--quiet",
                    "--target",
                    TARGET,
                    "--profile",
                    PROFILE,
                    "-p",
                    build.package,
                ])
                .arg("--target-dir")
                .arg(&target_dir);
            if !build.features.is_empty() {
                cmd.arg("--features").arg(build.features.join(","));
            }
            // The outer build's settings are for the host, not for wasm.
            for var in [
                "CARGO_TARGET_DIR",
                "CARGO_BUILD_TARGET",
                "RUSTFLAGS",
                "CARGO_ENCODED_RUSTFLAGS",
                "CARGO_BUILD_RUSTFLAGS",
                "RUSTC_WORKSPACE_WRAPPER",
            ] {
                cmd.env_remove(var);
            }
            if std::env::var_os("WRPC_COMPONENT_CARGO").is_some() {
                // That cargo's own toolchain (rust-toolchain.toml), not the outer one's.
                cmd.env_remove("RUSTUP_TOOLCHAIN").env_remove("RUSTC");
            }
            let output = cmd.output().expect("running cargo for a component");
            if !output.status.success() {
                panic!(
                    "building component {} ({}) failed:\n{}",
                    build.name,
                    build.package,
                    String::from_utf8_lossy(&output.stderr)
                );
            }
            let artifact = target_dir
                .join(TARGET)
                .join(PROFILE)
                .join(format!("{}.wasm", build.package.replace('-', "_")));
            let dest = out_dir.join(format!("{}.wasm", build.name));
            std::fs::copy(&artifact, &dest).unwrap_or_else(|e| {
                panic!("copying {} to {}: {e}", artifact.display(), dest.display())
            });
            dest
        })
        .collect()
}
