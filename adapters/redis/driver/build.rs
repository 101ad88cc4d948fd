//! Builds the redis adapter component (`adapters/redis`) this driver ships for its URLs.

fn main() {
    wrpc_build_support::embed_adapter("redis");
}
