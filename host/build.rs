//! Builds the adapter components that ship inside the host: memory always, and for each driver
//! feature (`redis`, `nats`, …) the adapter crate `wrpc-adapter-<feature>`. Each path is exported
//! as `WRPC_<NAME>_COMPONENT`. A new broker needs no line here: its feature names its adapter.

use wrpc_build_support::{Build, build_all, rerun_if_sources_change};

fn main() {
    rerun_if_sources_change();
    let mut names = vec!["memory".to_string()];
    let mut features: Vec<String> = std::env::vars()
        .filter_map(|(key, _)| key.strip_prefix("CARGO_FEATURE_").map(str::to_lowercase))
        .filter(|feature| feature != "default")
        .map(|feature| feature.replace('_', "-"))
        .collect();
    features.sort();
    names.extend(features);
    let packages: Vec<String> = names.iter().map(|n| format!("wrpc-adapter-{n}")).collect();
    let builds: Vec<Build> = names
        .iter()
        .zip(&packages)
        .map(|(name, package)| Build {
            package,
            features: &[],
            name,
        })
        .collect();
    for (build, path) in builds.iter().zip(build_all(&builds)) {
        println!(
            "cargo:rustc-env=WRPC_{}_COMPONENT={}",
            build.name.to_uppercase().replace('-', "_"),
            path.display()
        );
    }
}
