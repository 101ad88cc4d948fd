//! Paths of the components this workspace builds for its tests (see `tests/build.rs`).

/// The memory adapter.
pub const MEMORY: &str = env!("WRPC_COMPONENT_MEMORY");
/// The memory adapter written in Python (`adapters/memory-python`, built with componentize-py).
#[cfg(feature = "python")]
pub const MEMORY_PYTHON: &str = env!("WRPC_COMPONENT_MEMORY_PYTHON");
/// The memory adapter naming its store objects its own way (`<name>#<kind>@<prefix>`).
pub const MEMORY_OTHER_NAMES: &str = env!("WRPC_COMPONENT_MEMORY_OTHER_NAMES");
/// The memory adapter settling a batch one settlement after the other (the SDK's default path).
pub const MEMORY_SEQUENTIAL_SETTLES: &str = env!("WRPC_COMPONENT_MEMORY_SEQUENTIAL_SETTLES");
/// The memory adapter trapping on every 500th call (chaos for the recovery tests).
pub const MEMORY_CHAOS: &str = env!("WRPC_COMPONENT_MEMORY_CHAOS");
/// The runtime probe exporting all four capabilities.
pub const PROBE: &str = env!("WRPC_COMPONENT_PROBE");
/// The runtime probe exporting only `log`.
pub const PROBE_ONLY_LOG: &str = env!("WRPC_COMPONENT_PROBE_ONLY_LOG");
/// The runtime probe importing an interface no host provides.
pub const PROBE_FORBIDDEN_IMPORT: &str = env!("WRPC_COMPONENT_PROBE_FORBIDDEN_IMPORT");
/// The runtime probe whose `describe` spins calling the host and never returns.
pub const PROBE_HOSTILE_DESCRIBE: &str = env!("WRPC_COMPONENT_PROBE_HOSTILE_DESCRIBE");

/// Memory adapters that each break one contract on purpose: (name, path).
pub const MUTANTS: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/mutants.rs"));
