//! Builds every component the tests load from a file: the adapters (with the `python` feature,
//! the Python memory adapter, with componentize-py), the mutant memory adapters and the
//! runtime's probe components. Each path is exported as `WRPC_COMPONENT_<NAME>`, and the
//! mutants are listed in `$OUT_DIR/mutants.rs` (name, path).

use std::fmt::Write as _;

use wrpc_build_support::{Build, build_all, build_python_adapter, rerun_if_sources_change};

/// Memory adapters that each break one contract on purpose (feature `mutant-<name>`).
const MUTANTS: &[&str] = &[
    "skip-entry",
    "duplicate-entry",
    "reorder",
    "pattern-channel",
    "replay-backplane",
    "deliver-twice",
    "ignore-group",
    "lose-retry",
    "second-settlement-wins",
    "drop-on-stop",
    "drop-empty",
];

fn main() {
    rerun_if_sources_change();
    let features: Vec<[String; 1]> = MUTANTS.iter().map(|m| [format!("mutant-{m}")]).collect();
    let names: Vec<String> = MUTANTS
        .iter()
        .map(|m| format!("mutant_{}", m.replace('-', "_")))
        .collect();
    let feature_refs: Vec<[&str; 1]> = features.iter().map(|[f]| [f.as_str()]).collect();
    let mut builds = vec![
        Build {
            package: "wrpc-adapter-memory",
            features: &[],
            name: "memory",
        },
        Build {
            package: "wrpc-test-probe",
            features: &[],
            name: "probe",
        },
        Build {
            package: "wrpc-test-probe",
            features: &["only-log"],
            name: "probe_only_log",
        },
        Build {
            package: "wrpc-test-probe",
            features: &["forbidden-import"],
            name: "probe_forbidden_import",
        },
        Build {
            package: "wrpc-test-probe",
            features: &["hostile-describe"],
            name: "probe_hostile_describe",
        },
        Build {
            package: "wrpc-adapter-memory",
            features: &["other-names"],
            name: "memory_other_names",
        },
        Build {
            package: "wrpc-adapter-memory",
            features: &["chaos-trap-every-500"],
            name: "memory_chaos",
        },
        Build {
            package: "wrpc-adapter-memory",
            features: &["sequential-settles"],
            name: "memory_sequential_settles",
        },
    ];
    for (features, name) in feature_refs.iter().zip(&names) {
        builds.push(Build {
            package: "wrpc-adapter-memory",
            features,
            name,
        });
    }
    let paths = build_all(&builds);
    for (build, path) in builds.iter().zip(&paths) {
        println!(
            "cargo:rustc-env=WRPC_COMPONENT_{}={}",
            build.name.to_uppercase(),
            path.display()
        );
    }
    if std::env::var_os("CARGO_FEATURE_PYTHON").is_some() {
        let python = build_python_adapter("memory-python", "memory_python");
        println!(
            "cargo:rustc-env=WRPC_COMPONENT_MEMORY_PYTHON={}",
            python.display()
        );
    }
    let mut list = String::from("&[\n");
    for (mutant, path) in MUTANTS.iter().zip(&paths[builds.len() - MUTANTS.len()..]) {
        writeln!(list, "    ({mutant:?}, {:?}),", path.display().to_string()).unwrap();
    }
    list.push(']');
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("mutants.rs");
    std::fs::write(out, list).expect("writing mutants.rs");
}
