//! `wrpc-broker new-adapter <dir>`: write a new adapter crate a third party builds anywhere.
//!
//! The files are embedded in this binary: the template crate `adapters/template/` (its one copy;
//! this module includes it) and the WIT packages it needs, from this host's own `wit/`, so the
//! WIT an adapter is built against is always the WIT of the host that will load it.

use std::path::Path;

use anyhow::{Context as _, bail};

/// The template's crate name, replaced by the new crate's in `Cargo.toml` and `Cargo.lock`.
const TEMPLATE_NAME: &str = "wrpc-adapter-template";

/// `(path in the new folder, contents)` for each `file` of each group `into <= from [file, …]`,
/// the contents included at build time from `from` (a folder of the repository).
macro_rules! embed {
    ($($into:literal <= $from:literal [$($file:literal),* $(,)?]),* $(,)?) => {
        &[$($((concat!($into, $file), include_str!(concat!("../../", $from, $file))),)*)*]
    };
}

/// The template crate. Its `wit/deps/` is not among these files: in the repository it links to
/// the host's WIT, which [`WIT_DEPS`] embeds.
const TEMPLATE: &[(&str, &str)] = embed!(
    "" <= "adapters/template/" [
        ".gitignore", "Cargo.toml", "Cargo.lock",
        "src/lib.rs", "src/log.rs", "src/backplane.rs",
        "wit/world.wit",
    ],
);

/// The WIT packages the template's world uses: `wrpc:broker@0.1.0` (every file: it is one
/// package) and the memory driver's `wrpc:memory@0.1.0`.
const WIT_DEPS: &[(&str, &str)] = embed!(
    "wit/deps/broker/" <= "wit/broker/" [
        "adapter.wit", "backplane.wit", "direct.wit", "host.wit",
        "log.wit", "queue.wit", "types.wit", "worlds.wit",
    ],
    "wit/deps/memory/" <= "adapters/memory/wit/" ["store.wit"],
);

/// Write the template into `dir` (created if missing; an existing one must be empty) as crate
/// `name` (default: the folder's name), then say what to do next.
pub fn run(dir: &Path, name: Option<&str>) -> anyhow::Result<()> {
    let name = write(dir, name)?;
    println!("wrote crate `{name}` in {}:", dir.display());
    for (path, _) in TEMPLATE.iter().chain(WIT_DEPS) {
        println!("  {path}");
    }
    println!(
        "next (edit src/ and wit/world.wit as you need):\n  \
         rustup target add wasm32-wasip2\n  \
         cd {}\n  \
         cargo build --target wasm32-wasip2 --release\n  \
         wrpc-broker check target/wasm32-wasip2/release/{}.wasm",
        dir.display(),
        name.replace('-', "_")
    );
    Ok(())
}

/// Write the files and return the crate name used.
pub fn write(dir: &Path, name: Option<&str>) -> anyhow::Result<String> {
    let name = match name {
        Some(name) => name.to_string(),
        None => default_name(dir)?,
    };
    check_name(&name)?;
    if dir.exists() {
        let mut entries = std::fs::read_dir(dir)
            .with_context(|| format!("{} exists and is not a readable folder", dir.display()))?;
        if entries.next().is_some() {
            bail!(
                "{} is not empty: new-adapter writes into a new or an empty folder only",
                dir.display()
            );
        }
    }
    for (path, text) in TEMPLATE.iter().chain(WIT_DEPS) {
        let file = dir.join(path);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        let text = match *path {
            "Cargo.toml" => rename(text, &name),
            "Cargo.lock" => rename_in_lock(text, &name),
            _ => text.to_string(),
        };
        std::fs::write(&file, text).with_context(|| format!("writing {}", file.display()))?;
    }
    Ok(name)
}

/// The template's `Cargo.toml` with the crate named `name`.
fn rename(text: &str, name: &str) -> String {
    text.replace(
        &format!("name = \"{TEMPLATE_NAME}\""),
        &format!("name = \"{name}\""),
    )
}

/// The template's `Cargo.lock` with the crate named `name`, its entry moved to where Cargo
/// keeps it (packages sorted by name), so the first build finds the file as it would write it.
fn rename_in_lock(text: &str, name: &str) -> String {
    let mut blocks: Vec<String> = text
        .split("\n\n")
        .map(|b| b.trim_end().to_string())
        .collect();
    let template = format!("[[package]]\nname = \"{TEMPLATE_NAME}\"\n");
    let Some(at) = blocks.iter().position(|b| b.starts_with(&template)) else {
        return text.to_string();
    };
    let entry = rename(&blocks.remove(at), name);
    let package = |block: &str| block.lines().nth(1).map(str::to_string);
    let new = package(&entry);
    // Block 0 is the header; then one block per package.
    let at = (1..blocks.len())
        .find(|&i| package(&blocks[i]) > new)
        .unwrap_or(blocks.len());
    blocks.insert(at, entry);
    blocks.join("\n\n") + "\n"
}

/// The crate name a folder gives: its last component (of the absolute path for `.`).
fn default_name(dir: &Path) -> anyhow::Result<String> {
    let absolute = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    let last = absolute
        .components()
        .rev()
        .find(|c| !matches!(c, std::path::Component::CurDir))
        .and_then(|c| c.as_os_str().to_str().map(str::to_string));
    match last {
        Some(name) if name != ".." && name != "/" => Ok(name),
        _ => bail!(
            "cannot name the crate after {}: give one with --name",
            dir.display()
        ),
    }
}

/// A crate name Cargo takes that is also an adapter name (`describe` uses it): an ASCII letter,
/// then letters, digits, `-` and `_`, at most 64 in all.
fn check_name(name: &str) -> anyhow::Result<()> {
    let mut bytes = name.bytes();
    let first_ok = bytes.next().is_some_and(|b| b.is_ascii_alphabetic());
    let rest_ok = bytes.all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !first_ok || !rest_ok || name.len() > 64 {
        bail!(
            "`{name}` cannot name the crate: use an ASCII letter, then letters, digits, `-` or `_` \
             (at most 64), with --name if the folder's name is not one"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// Every file below `dir`, as a path relative to it, skipping `skip` (relative paths).
    fn files_below(dir: &Path, skip: &[&str]) -> Vec<String> {
        let mut out = Vec::new();
        let mut pending = vec![PathBuf::new()];
        while let Some(relative) = pending.pop() {
            for entry in std::fs::read_dir(dir.join(&relative)).unwrap() {
                let path = relative.join(entry.unwrap().file_name());
                let text = path.to_str().unwrap().to_string();
                if skip.contains(&text.as_str()) {
                    continue;
                }
                if dir.join(&path).is_dir() {
                    pending.push(path);
                } else {
                    out.push(text);
                }
            }
        }
        out.sort();
        out
    }

    /// Adding a file to the template or to the WIT it needs, without embedding it, fails here.
    #[test]
    fn every_file_of_the_template_and_its_wit_is_embedded() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let embedded = |list: &[(&str, &str)], prefix: &str| -> Vec<String> {
            let mut paths: Vec<String> = list
                .iter()
                .filter_map(|(p, _)| p.strip_prefix(prefix).map(str::to_string))
                .collect();
            paths.sort();
            paths
        };
        let template = root.join("adapters/template");
        assert_eq!(
            files_below(&template, &["target", "wit/deps"]),
            embedded(TEMPLATE, "")
        );
        for (package, dir) in [("broker", "wit/broker"), ("memory", "adapters/memory/wit")] {
            assert_eq!(
                files_below(&root.join(dir), &[]),
                embedded(WIT_DEPS, &format!("wit/deps/{package}/")),
                "{dir}"
            );
        }
    }

    #[test]
    fn the_template_is_renamed_in_its_manifest_and_lock() {
        let text = |path: &str| TEMPLATE.iter().find(|(p, _)| *p == path).unwrap().1;
        let manifest = rename(text("Cargo.toml"), "my-adapter");
        let lock = rename_in_lock(text("Cargo.lock"), "my-adapter");
        for (path, renamed) in [("Cargo.toml", &manifest), ("Cargo.lock", &lock)] {
            assert_eq!(
                renamed.matches("name = \"my-adapter\"").count(),
                1,
                "{path}"
            );
            assert!(!renamed.contains(TEMPLATE_NAME), "{path}");
        }
        // Same lines, the entry moved to its place by name.
        let sorted = |text: &str| {
            let mut lines: Vec<String> = text
                .lines()
                .map(|l| l.replace(TEMPLATE_NAME, "my-adapter"))
                .collect();
            lines.sort();
            lines
        };
        assert_eq!(sorted(&lock), sorted(text("Cargo.lock")));
        let names: Vec<&str> = lock.lines().filter(|l| l.starts_with("name = ")).collect();
        assert!(names.is_sorted(), "{names:?}");
        assert!(lock.ends_with("\"\n") && !lock.ends_with("\n\n"));
    }

    #[test]
    fn names_are_checked_and_taken_from_the_folder() {
        assert_eq!(
            default_name(Path::new("/tmp/x/my-adapter")).unwrap(),
            "my-adapter"
        );
        assert_eq!(
            default_name(Path::new("my_adapter/")).unwrap(),
            "my_adapter"
        );
        assert!(check_name("my-adapter2").is_ok());
        for bad in ["", "2fast", "my adapter", "my.adapter", "é"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
