//! The CPU slice of an instance, which a guest cannot renew by calling the host.
//!
//! While guest code runs, the engine's epoch ticker interrupts it every [`EPOCH_TICK`]; each
//! interruption counts one busy tick (and yields to the async runtime, so the thread is never
//! held and its timers fire). Only the host's event loop renews the slice: the Store-owner's future is wrapped in
//! [`heartbeat`], which renews it each time the event loop polls it, and wakes at least once per
//! tick. A guest that keeps the instance — spinning, calling the host's synchronous imports in a
//! loop, or blocked in a synchronous WASI wait — never lets the event loop run, so its ticks add
//! up until it traps. A blocking `wasi:io/poll` wait (`poll`, `pollable.block`: what
//! `std::thread::sleep` uses) holds every task of the instance, so it counts against the same
//! slice: it may last what is left of the slice, then traps.

use std::future::Future;
use std::pin::pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use wasmtime::component::{Accessor, HasData, Linker, Resource, ResourceTable};
use wasmtime::{Store, UpdateDeadline};
use wasmtime_wasi_io::bindings::wasi::io::poll;
use wasmtime_wasi_io::poll::DynPollable;

use super::sandbox::Ctx;

/// How long one epoch tick lasts; the CPU slice is counted in ticks.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// The slice of one instance: busy ticks since the host's event loop last ran.
#[derive(Debug)]
pub struct Budget {
    busy_ticks: u64,
    slice_ticks: u64,
    slice: Duration,
}

impl Budget {
    /// A budget of `slice` (at least one tick).
    pub fn new(slice: Duration) -> Self {
        Self {
            busy_ticks: 0,
            slice_ticks: (slice.as_millis() / EPOCH_TICK.as_millis()).max(1) as u64,
            slice,
        }
    }

    /// The host's event loop ran: a fresh slice.
    pub(crate) fn renew(&mut self) {
        self.busy_ticks = 0;
    }

    /// One more tick with guest code running; past the slice, the error that traps it.
    fn tick(&mut self) -> wasmtime::Result<()> {
        self.busy_ticks += 1;
        if self.busy_ticks > self.slice_ticks {
            return Err(wasmtime::format_err!(
                "CPU slice exhausted: the adapter held its instance for more than {:?} without \
                 letting the host run (Limits::cpu_slice; calls into the host do not renew it)",
                self.slice
            ));
        }
        Ok(())
    }

    /// How long a blocking wait may last: what is left of the slice.
    fn left(&self) -> Duration {
        self.slice
            .saturating_sub(EPOCH_TICK.saturating_mul(self.busy_ticks as u32))
    }

    /// A blocking wait of `waited` held the instance: count it.
    fn blocked(&mut self, waited: Duration) {
        self.busy_ticks += waited.as_millis().div_ceil(EPOCH_TICK.as_millis()) as u64;
    }

    fn blocked_too_long(&self, what: &str, allowed: Duration) -> wasmtime::Error {
        wasmtime::format_err!(
            "CPU slice exhausted: the adapter blocked its instance in {what} for {allowed:?}, \
             what was left of its {:?} slice (a blocking wait holds every call of the \
             instance: await the host's `sleep` instead)",
            self.slice
        )
    }
}

/// Count busy ticks on `store` and trap it past its slice.
pub fn install(store: &mut Store<Ctx>) {
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(|mut ctx| {
        ctx.data_mut().budget.tick()?;
        // Tokio's yield lets the runtime poll its timers and I/O before this task runs again
        // (wasmtime's own yield would not, on a current-thread runtime).
        Ok(UpdateDeadline::YieldCustom(
            1,
            Box::pin(tokio::task::yield_now()),
        ))
    });
}

/// Run `fut` as the host's side of `run_concurrent`: each poll (the event loop ran) renews the
/// slice, and a timer makes sure it is polled at least once per tick when the loop is free.
pub async fn heartbeat<F: Future>(accessor: &Accessor<Ctx>, fut: F) -> F::Output {
    let mut fut = pin!(fut);
    let mut beat = tokio::time::interval(EPOCH_TICK);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    std::future::poll_fn(|cx| {
        accessor.with(|mut access| access.get().budget.renew());
        while beat.poll_tick(cx).is_ready() {}
        match fut.as_mut().poll(cx) {
            Poll::Ready(out) => Poll::Ready(out),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

/// `wasi:io/poll` with its blocking waits bounded by the slice (replaces wasmtime-wasi's).
pub fn add_guarded_poll(linker: &mut Linker<Ctx>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    poll::add_to_linker::<Ctx, GuardedPoll>(linker, |ctx| GuardedIo {
        table: &mut ctx.table,
        budget: &mut ctx.budget,
    })?;
    linker.allow_shadowing(false);
    Ok(())
}

struct GuardedPoll;

impl HasData for GuardedPoll {
    type Data<'a> = GuardedIo<'a>;
}

/// The resource table and the slice, for one `wasi:io/poll` call.
pub struct GuardedIo<'a> {
    table: &'a mut ResourceTable,
    budget: &'a mut Budget,
}

impl GuardedIo<'_> {
    /// Wait for `wait` at most what is left of the slice, counting the time waited.
    async fn bounded<T>(
        budget: &mut Budget,
        what: &str,
        wait: impl Future<Output = wasmtime::Result<T>>,
    ) -> wasmtime::Result<T> {
        let allowed = budget.left();
        let started = Instant::now();
        let outcome = tokio::time::timeout(allowed, wait).await;
        budget.blocked(started.elapsed());
        match outcome {
            Ok(result) => result,
            Err(_) => Err(budget.blocked_too_long(what, allowed)),
        }
    }
}

impl poll::Host for GuardedIo<'_> {
    async fn poll(&mut self, pollables: Vec<Resource<DynPollable>>) -> wasmtime::Result<Vec<u32>> {
        let wait = poll::Host::poll(&mut *self.table, pollables);
        Self::bounded(self.budget, "wasi:io/poll.poll", wait).await
    }
}

impl poll::HostPollable for GuardedIo<'_> {
    async fn block(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        let wait = poll::HostPollable::block(&mut *self.table, pollable);
        Self::bounded(self.budget, "wasi:io/poll.pollable.block", wait).await
    }

    async fn ready(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<bool> {
        poll::HostPollable::ready(&mut *self.table, pollable).await
    }

    fn drop(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        poll::HostPollable::drop(&mut *self.table, pollable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slice_is_counted_in_ticks_and_renewed_only_by_the_host() {
        let mut budget = Budget::new(Duration::from_millis(50));
        for _ in 0..5 {
            budget.tick().unwrap();
        }
        let e = budget.tick().unwrap_err();
        assert!(e.to_string().contains("CPU slice exhausted"), "{e}");
        budget.renew();
        budget.tick().unwrap();
        // A blocking wait counts: 30 ms leaves 10 ms of the slice.
        budget.blocked(Duration::from_millis(30));
        assert_eq!(budget.left(), Duration::from_millis(10));
    }
}
