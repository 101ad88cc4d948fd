//! Builds every component the tests load from a file: the adapters, their mutants and the
//! runtime's probe components. Each path is exported as `WRPC_COMPONENT_<NAME>`.

use wrpc_build_support::{Build, build_all, rerun_if_sources_change};

const BUILDS: &[Build<'static>] = &[
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
        package: "wrpc-adapter-memory",
        features: &["mutant-skip-entry"],
        name: "mutant_skip_entry",
    },
    Build {
        package: "wrpc-adapter-memory",
        features: &["mutant-duplicate-entry"],
        name: "mutant_duplicate_entry",
    },
    Build {
        package: "wrpc-adapter-memory",
        features: &["mutant-reorder"],
        name: "mutant_reorder",
    },
    Build {
        package: "wrpc-adapter-memory",
        features: &["mutant-pattern-channel"],
        name: "mutant_pattern_channel",
    },
    Build {
        package: "wrpc-adapter-memory",
        features: &["mutant-replay-backplane"],
        name: "mutant_replay_backplane",
    },
];

fn main() {
    rerun_if_sources_change();
    for (build, path) in BUILDS.iter().zip(build_all(BUILDS)) {
        println!(
            "cargo:rustc-env=WRPC_COMPONENT_{}={}",
            build.name.to_uppercase(),
            path.display()
        );
    }
}
