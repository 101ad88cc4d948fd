//! Builds the adapter components that ship inside the host: memory always, Redis and NATS with
//! their cargo features. Each path is exported as `WRPC_<NAME>_COMPONENT`.

use wrpc_build_support::{Build, build_all, rerun_if_sources_change};

fn main() {
    rerun_if_sources_change();
    let mut builds = vec![Build {
        package: "wrpc-adapter-memory",
        features: &[],
        name: "memory",
    }];
    if std::env::var_os("CARGO_FEATURE_REDIS").is_some() {
        builds.push(Build {
            package: "wrpc-adapter-redis",
            features: &[],
            name: "redis",
        });
    }
    if std::env::var_os("CARGO_FEATURE_NATS").is_some() {
        builds.push(Build {
            package: "wrpc-adapter-nats",
            features: &[],
            name: "nats",
        });
    }
    for (build, path) in builds.iter().zip(build_all(&builds)) {
        println!(
            "cargo:rustc-env=WRPC_{}_COMPONENT={}",
            build.name.to_uppercase(),
            path.display()
        );
    }
}
