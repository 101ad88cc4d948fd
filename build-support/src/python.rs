//! Builds adapter components written in Python with componentize-py, from a build script.
//!
//! componentize-py is pinned ([`COMPONENTIZE_PY`]): it pairs with the host's wasmtime, and the
//! component model's async ABI still moves between releases. It is run through `python3` (the
//! interpreter `pip` installed it for), so a fresh install needs no `PATH` change. A missing or
//! other version fails the build, saying how to install the pinned one.
//!
//! The sources (the adapter folder, symlinks followed, `__pycache__` left out) are staged in
//! the component target dir and the component is rebuilt only when they change: a build takes
//! ten seconds or more.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The componentize-py version the host's wasmtime is tested with.
pub const COMPONENTIZE_PY: &str = "0.25.1";

/// One Python component: the adapter folder, its world and its app module.
pub struct PythonBuild<'a> {
    /// The folder holding the app module, its packages and `wit/` (symlinks allowed).
    pub dir: &'a Path,
    /// The world in `wit/` the component targets.
    pub world: &'a str,
    /// The Python module holding the exported classes, e.g. `app`.
    pub app: &'a str,
    /// The file name (without `.wasm`) the component is saved as.
    pub name: &'a str,
}

/// The interpreter to run componentize-py with: `$WRPC_PYTHON`, else `python3`.
fn python() -> String {
    std::env::var("WRPC_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// How to get the pinned componentize-py, for error messages.
fn install_hint() -> String {
    format!(
        "install it with `{} -m pip install componentize-py=={COMPONENTIZE_PY}` \
         (scripts/test.sh does), or point WRPC_PYTHON at an interpreter that has it",
        python()
    )
}

/// Fail unless the pinned componentize-py is installed for [`python`].
fn check_componentize_py() {
    let output = Command::new(python())
        .args([
            "-c",
            "import importlib.metadata as m; print(m.version('componentize-py'))",
        ])
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "building the Python adapters needs {} ({e}); {}",
                python(),
                install_hint()
            )
        });
    let version = String::from_utf8_lossy(&output.stdout).trim().to_string();
    if !output.status.success() {
        panic!(
            "componentize-py is not installed for {}: {}",
            python(),
            install_hint()
        );
    }
    if version != COMPONENTIZE_PY {
        panic!(
            "componentize-py {version} is installed, the host is tested with {COMPONENTIZE_PY}: {}",
            install_hint()
        );
    }
}

/// Every source file under `dir` (symlinks followed, `__pycache__` skipped), as (relative
/// path, contents), sorted.
fn sources(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(PathBuf, Vec<u8>)>) {
        let entries =
            std::fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("a folder entry").path();
            if path.file_name().is_some_and(|n| n == "__pycache__") {
                continue;
            }
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let bytes = std::fs::read(&path)
                    .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
                let relative = path
                    .strip_prefix(root)
                    .expect("under the root")
                    .to_path_buf();
                out.push((relative, bytes));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// The sources as one record, to tell whether they changed since the last build.
fn fingerprint(files: &[(PathBuf, Vec<u8>)], build: &PythonBuild<'_>) -> Vec<u8> {
    let mut record = format!(
        "componentize-py {COMPONENTIZE_PY} world {} app {}\n",
        build.world, build.app
    )
    .into_bytes();
    for (path, bytes) in files {
        record.extend(format!("{} {}\n", path.display(), bytes.len()).bytes());
        record.extend(bytes);
    }
    record
}

/// Build the component of `build` into `out_dir` (staging it under `stage_root`) and return
/// its path; a no-op when its sources are unchanged since the last build.
pub fn build_python(build: &PythonBuild<'_>, stage_root: &Path, out_dir: &Path) -> PathBuf {
    let dest = out_dir.join(format!("{}.wasm", build.name));
    let files = sources(build.dir);
    let record = fingerprint(&files, build);
    let stamp = out_dir.join(format!("{}.sources", build.name));
    if dest.is_file() && std::fs::read(&stamp).is_ok_and(|old| old == record) {
        return dest;
    }
    check_componentize_py();
    let stage = stage_root.join(build.name);
    if stage.exists() {
        std::fs::remove_dir_all(&stage)
            .unwrap_or_else(|e| panic!("clearing {}: {e}", stage.display()));
    }
    for (path, bytes) in &files {
        let to = stage.join(path);
        std::fs::create_dir_all(to.parent().expect("a parent")).expect("creating the stage");
        std::fs::write(&to, bytes).unwrap_or_else(|e| panic!("writing {}: {e}", to.display()));
    }
    // componentize-py's entry point, run by the interpreter pip installed it for.
    let script = "import sys, componentize_py; sys.argv[0] = 'componentize-py'; \
                  sys.exit(componentize_py.script())";
    let output = Command::new(python())
        .current_dir(&stage)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .args(["-c", script, "-q", "-d", "wit", "-w", build.world])
        .args(["componentize", build.app, "-o"])
        .arg(&dest)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}; {}", python(), install_hint()));
    if !output.status.success() {
        panic!(
            "building the Python component {} (componentize-py {COMPONENTIZE_PY}) failed:\n{}{}",
            build.name,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    std::fs::write(&stamp, record).unwrap_or_else(|e| panic!("writing {}: {e}", stamp.display()));
    dest
}
