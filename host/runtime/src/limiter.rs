//! One memory cap per instance: the sum of every linear memory and table of every core instance
//! inside a component's Store, counted as they are created and grown. Going over it traps with
//! an error naming the limit.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use wasmtime::ResourceLimiter;

/// What one table entry is counted as: wasmtime documents a pointer per entry (8 bytes); this
/// counts twice that, to be on the safe side.
pub const TABLE_ENTRY_BYTES: usize = 16;
/// The most core instances a component may create in its Store.
pub const MAX_INSTANCES: usize = 1_000;
/// The most tables a component may create in its Store.
pub const MAX_TABLES: usize = 1_000;
/// The most linear memories a component may create in its Store.
pub const MAX_MEMORIES: usize = 100;

/// Counts an instance's memories and tables against one cap (`Limits::memory_bytes`).
#[derive(Debug)]
pub struct InstanceLimiter {
    cap: usize,
    memories: usize,
    tables: usize,
    /// The current total, readable from outside the Store.
    total: Arc<AtomicUsize>,
    /// The growth last allowed (memory?, bytes added): taken back if wasmtime then fails it.
    last: (bool, usize),
}

impl InstanceLimiter {
    /// A limiter allowing `cap` bytes in all.
    pub fn new(cap: usize) -> Self {
        Self {
            cap,
            memories: 0,
            tables: 0,
            total: Arc::new(AtomicUsize::new(0)),
            last: (true, 0),
        }
    }

    /// The bytes of memory and tables the instance holds now (shared: readable after the
    /// Store moved to its owner task).
    pub fn total(&self) -> Arc<AtomicUsize> {
        self.total.clone()
    }

    fn grow(&mut self, what: &str, current: usize, desired: usize) -> wasmtime::Result<()> {
        let held = self.memories + self.tables;
        let after = held - current.min(held) + desired;
        if after > self.cap {
            return Err(wasmtime::format_err!(
                "memory limit: growing a {what} from {} to {} would bring the instance to {} \
                 (linear memories and tables together), over its cap of {} (Limits::memory_bytes)",
                mib(current),
                mib(desired),
                mib(after),
                mib(self.cap)
            ));
        }
        Ok(())
    }

    fn publish(&self) {
        self.total
            .store(self.memories + self.tables, Ordering::Relaxed);
    }
}

/// Bytes as MiB with one decimal (e.g. `256.0 MiB`).
fn mib(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

impl ResourceLimiter for InstanceLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if maximum.is_some_and(|max| desired > max) {
            return Ok(false);
        }
        self.grow("linear memory", current, desired)?;
        let added = desired.saturating_sub(current);
        self.memories += added;
        self.last = (true, added);
        self.publish();
        Ok(true)
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        if self.last.0 {
            self.memories -= self.last.1.min(self.memories);
            self.last.1 = 0;
            self.publish();
        }
        Err(error.context("memory limit: the host could not grow a linear memory"))
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if maximum.is_some_and(|max| desired > max) {
            return Ok(false);
        }
        let (current, desired) = (
            current.saturating_mul(TABLE_ENTRY_BYTES),
            desired.saturating_mul(TABLE_ENTRY_BYTES),
        );
        self.grow("table", current, desired)?;
        let added = desired.saturating_sub(current);
        self.tables += added;
        self.last = (false, added);
        self.publish();
        Ok(true)
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        if !self.last.0 {
            self.tables -= self.last.1.min(self.tables);
            self.last.1 = 0;
            self.publish();
        }
        Err(error.context("memory limit: the host could not grow a table"))
    }

    fn instances(&self) -> usize {
        MAX_INSTANCES
    }

    fn tables(&self) -> usize {
        MAX_TABLES
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memories_and_tables_count_against_one_cap() {
        let mut limiter = InstanceLimiter::new(100 << 20);
        // Two memories of 40 MiB fit, a third does not.
        assert!(limiter.memory_growing(0, 40 << 20, None).unwrap());
        assert!(limiter.memory_growing(0, 40 << 20, None).unwrap());
        let e = limiter.memory_growing(0, 40 << 20, None).unwrap_err();
        assert!(e.to_string().contains("memory limit"), "{e}");
        assert!(e.to_string().contains("100.0 MiB"), "{e}");
        // Growing one of them counts only the difference.
        assert!(limiter.memory_growing(40 << 20, 50 << 20, None).unwrap());
        assert_eq!(limiter.total().load(Ordering::Relaxed), 90 << 20);
        // A table of 1 M entries is 16 MiB: over what is left.
        let e = limiter.table_growing(0, 1 << 20, None).unwrap_err();
        assert!(e.to_string().contains("table"), "{e}");
        assert!(limiter.table_growing(0, 1 << 16, None).unwrap());
        assert_eq!(
            limiter.total().load(Ordering::Relaxed),
            (90 << 20) + (1 << 20)
        );
    }
}
