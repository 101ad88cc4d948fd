//! Builds the memory adapter component (`adapters/memory`) this driver ships for its URLs.

fn main() {
    wrpc_build_support::embed_adapter("memory");
}
