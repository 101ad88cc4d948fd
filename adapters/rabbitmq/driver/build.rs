//! Builds the rabbitmq adapter component (`adapters/rabbitmq`) this driver ships for its URLs.

fn main() {
    wrpc_build_support::embed_adapter("rabbitmq");
}
