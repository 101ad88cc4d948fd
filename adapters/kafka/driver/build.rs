//! Builds the kafka adapter component (`adapters/kafka`) this driver ships for its URLs.

fn main() {
    wrpc_build_support::embed_adapter("kafka");
}
