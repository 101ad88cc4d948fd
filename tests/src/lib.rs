//! The contract suite every wrpc-broker adapter must pass.
pub mod components;
