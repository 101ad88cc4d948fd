//! Builds the nats adapter component (`adapters/nats`) this driver ships for its URLs.

fn main() {
    wrpc_build_support::embed_adapter("nats");
}
