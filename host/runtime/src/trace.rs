//! Log lines from a component go to `tracing` under the target `broker.<adapter name>`.
//!
//! `tracing` targets are `&'static str` fixed at each macro call site, so this module makes one
//! call site per (target, level) at run time and leaks it: a handful per adapter name, made once.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use tracing::callsite::{Callsite, Identifier};
use tracing::field::{FieldSet, Value};
use tracing::metadata::Kind;
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata};

/// A call site made at run time for one target and level.
struct DynamicCallsite {
    metadata: OnceLock<Metadata<'static>>,
}

impl Callsite for DynamicCallsite {
    fn set_interest(&self, _interest: Interest) {}

    fn metadata(&self) -> &Metadata<'_> {
        self.metadata
            .get()
            .expect("call site initialised before use")
    }
}

const LEVELS: [Level; 5] = [
    Level::TRACE,
    Level::DEBUG,
    Level::INFO,
    Level::WARN,
    Level::ERROR,
];

fn level_index(level: Level) -> usize {
    LEVELS.iter().position(|l| *l == level).unwrap_or(2)
}

/// Writes events with one dynamic target (e.g. `broker.memory` or `broker.memory.settle`).
#[derive(Clone, Copy)]
pub struct TargetLogger {
    callsites: [&'static DynamicCallsite; 5],
}

impl std::fmt::Debug for TargetLogger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TargetLogger")
            .field("target", &self.target())
            .finish()
    }
}

impl TargetLogger {
    /// The logger for `target`; call sites are made once per target and kept for the process.
    pub fn new(target: &str) -> Self {
        static REGISTRY: OnceLock<Mutex<HashMap<String, TargetLogger>>> = OnceLock::new();
        let mut registry = REGISTRY
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(logger) = registry.get(target) {
            return *logger;
        }
        let leaked_target: &'static str = Box::leak(target.to_string().into_boxed_str());
        let callsites = LEVELS.map(|level| {
            let callsite: &'static DynamicCallsite = Box::leak(Box::new(DynamicCallsite {
                metadata: OnceLock::new(),
            }));
            let _ = callsite.metadata.set(Metadata::new(
                "component log",
                leaked_target,
                level,
                None,
                None,
                None,
                FieldSet::new(&["message"], Identifier(callsite)),
                Kind::EVENT,
            ));
            tracing::callsite::register(callsite);
            callsite
        });
        let logger = TargetLogger { callsites };
        registry.insert(target.to_string(), logger);
        logger
    }

    /// The target this logger writes to.
    pub fn target(&self) -> &'static str {
        self.callsites[0].metadata().target()
    }

    /// Emit `message` at `level` if a subscriber wants it.
    pub fn log(&self, level: Level, message: &str) {
        let Some(metadata) = self.callsites[level_index(level)].metadata.get() else {
            return;
        };
        if !tracing::dispatcher::get_default(|d| d.enabled(metadata)) {
            return;
        }
        let fields = metadata.fields();
        let field = fields.field("message").expect("message field");
        let values = [(&field, Some(&message as &dyn Value))];
        Event::dispatch(metadata, &fields.value_set(&values));
    }
}
