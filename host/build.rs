//! Builds the memory adapter component, which ships inside the host (`Broker::memory()`).

fn main() {
    wrpc_build_support::rerun_if_sources_change();
    let built = wrpc_build_support::build_all(&[wrpc_build_support::Build {
        package: "wrpc-adapter-memory",
        features: &[],
        name: "memory",
    }]);
    println!(
        "cargo:rustc-env=WRPC_MEMORY_COMPONENT={}",
        built[0].display()
    );
}
