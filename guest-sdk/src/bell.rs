//! How a [`signal`](crate::signal) wakes a task of another export call: a waiter arms a bell (a
//! unit stream whose read its task awaits), and a notifier polled by another task rings it (one
//! stream write, which wakes the waiter's task through the component model); a notifier polled
//! by the waiter's own task wakes it as any Rust waker does.
//!
//! wit-bindgen's `inter-task-wakeup` feature does this for every task, whatever it waits for: it
//! arms such a stream read each time a task sleeps and cancels it each time the task wakes, with
//! a stream made and dropped per export call — about ten host calls for a Kafka append, which
//! awaits one import (wasmtime's trace: a stream made and its two ends dropped, two reads, four
//! joins, a cancel). Here only a wait on a signal pays for a bell, a task keeps its bell armed
//! while any of its futures waits, and an idle bell stays armed for the next task to wait;
//! this crate leaves the feature off.

use std::task::Waker;

/// The task being polled: its wit-bindgen state's address (`wasip3_task.ptr`, the documented ABI
/// by which wit-bindgen's executor tells libraries the current task); 0 outside a task and on
/// native targets.
pub(crate) fn current_task() -> usize {
    #[cfg(target_family = "wasm")]
    {
        /// The prefix of wit-bindgen's `wasip3_task` (versions 1 and 2 begin alike).
        #[repr(C)]
        struct Wasip3Task {
            version: u32,
            ptr: *mut u8,
        }
        unsafe extern "C" {
            /// Sets the current task and answers the previous one (wit-bindgen's cabi).
            fn wasip3_task_set(task: *mut Wasip3Task) -> *mut Wasip3Task;
        }
        // SAFETY: the documented getter idiom (set null, then put the answer back); a non-null
        // answer points at the executor's live task structure until it is put back.
        unsafe {
            let task = wasip3_task_set(std::ptr::null_mut());
            wasip3_task_set(task);
            if task.is_null() {
                0
            } else {
                (*task).ptr as usize
            }
        }
    }
    #[cfg(not(target_family = "wasm"))]
    {
        0
    }
}

/// A future of `task` (the task being polled, [`current_task`]) starts waiting on a signal:
/// the task keeps a bell armed while any of its futures waits, so a notifier polled by another
/// task can [`ring`] it. Outside a task (0) no bell is armed.
pub(crate) fn park(task: usize) {
    if task != 0 {
        armed::park(task);
    }
}

/// A future parked by `task` is polled again by it while it waits: a bell that rang is armed
/// again.
pub(crate) fn repark(task: usize) {
    if task != 0 {
        armed::rearm(task);
    }
}

/// A future parked by `task` waits no longer; once none of the task's does, its bell goes idle
/// (still armed) for the next task to wait.
pub(crate) fn leave(task: usize) {
    if task != 0 {
        armed::leave(task);
    }
}

/// Wake `waker`, of a future `task` parked, from another task: the task's bell rings (one
/// stream write, once until it is armed again) and, as the ring is delivered to that task,
/// `waker` is woken there. `Err(waker)` when the task has no bell.
pub(crate) fn ring(task: usize, waker: Waker) -> Result<(), Waker> {
    armed::ring(task, waker)
}

#[cfg(not(target_family = "wasm"))]
mod armed {
    //! No bells on a native target (the crate's own tests): every waiter is woken by its waker.

    use std::task::Waker;

    pub(super) fn park(_task: usize) {}
    pub(super) fn rearm(_task: usize) {}
    pub(super) fn leave(_task: usize) {}
    pub(super) fn ring(_task: usize, waker: Waker) -> Result<(), Waker> {
        Err(waker)
    }
}

#[cfg(target_family = "wasm")]
mod armed {
    //! The bells in use, one per task with a future waiting on a signal (a handful at a time,
    //! so a list); the idle ones, still armed, which the next task to wait takes over (no host
    //! call when it is the task that left it, one join when another).

    use std::cell::{Cell, RefCell};
    use std::future::Future;
    use std::pin::Pin;
    use std::rc::Rc;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Wake, Waker};

    use wit_bindgen::rt::async_support::{RawStreamReader, RawStreamWriter, raw_stream_new};

    use super::unit::{self, Unit};

    /// How many idle bells stay armed; the oldest beyond is disarmed. An idle bell keeps its
    /// last task's wit-bindgen state (and waitable set) alive until it is taken over or
    /// disarmed.
    const IDLE_BELLS: usize = 8;

    /// A task's bell.
    struct TaskBell {
        /// The task it is armed in (what [`Rang`] holds too).
        task: usize,
        /// Reads its stream over and over, counting each read that ended in `reads` (taken out
        /// while polled; dropped, it cancels the read pending).
        reading: Option<Pin<Box<dyn Future<Output = ()>>>>,
        reads: Rc<Cell<u64>>,
        /// The write end a notifier rings (dropped after `reading`, which holds the read end).
        writer: RawStreamWriter<Unit>,
        /// What the read wakes when it ends.
        rang: Arc<Rang>,
        /// How many of this task's futures wait on a signal.
        users: usize,
        /// Its read must be polled: not started yet, ended by a ring, or its task changed.
        stale: bool,
        /// Written to since the read was last started.
        rung: bool,
        /// The futures notifiers of other tasks woke since the bell was last delivered.
        woken: Vec<Waker>,
    }

    thread_local! {
        static BELLS: RefCell<Vec<TaskBell>> = const { RefCell::new(Vec::new()) };
        static IDLE: RefCell<Vec<TaskBell>> = const { RefCell::new(Vec::new()) };
    }

    fn with_bell<R>(task: usize, f: impl FnOnce(&mut TaskBell) -> R) -> Option<R> {
        BELLS.with_borrow_mut(|bells| bells.iter_mut().find(|b| b.task == task).map(f))
    }

    /// What a bell's read wakes when it ends (in its task, as the event is delivered): the
    /// futures of that task the notifiers woke; polled, they start the next read.
    struct Rang(AtomicUsize);

    impl Wake for Rang {
        fn wake(self: Arc<Self>) {
            let task = self.0.load(Ordering::Relaxed);
            let Some(mut woken) = with_bell(task, |bell| std::mem::take(&mut bell.woken)) else {
                return;
            };
            woken.drain(..).for_each(Waker::wake);
            // The list goes back with its room, so the next ring does not allocate.
            with_bell(task, |bell| {
                if bell.woken.is_empty() {
                    bell.woken = woken;
                }
            });
        }
    }

    /// Read `reader` one unit at a time for as long as this future lives, counting the reads.
    fn reading(
        mut reader: RawStreamReader<Unit>,
        reads: Rc<Cell<u64>>,
    ) -> Pin<Box<dyn Future<Output = ()>>> {
        Box::pin(async move {
            loop {
                let _ = reader.read(Vec::new()).await;
                reads.set(reads.get() + 1);
            }
        })
    }

    /// A bell for `task`: an idle one taken over (its own first), else a new one.
    fn bell_for(task: usize) -> TaskBell {
        let idle = IDLE.with_borrow_mut(|idle| {
            let i = idle.iter().rposition(|b| b.task == task);
            match i {
                Some(i) => Some(idle.remove(i)),
                None => idle.pop(),
            }
        });
        if let Some(mut bell) = idle {
            if bell.task != task {
                // Its read moves to this task's waitable set on the next poll.
                bell.task = task;
                bell.rang.0.store(task, Ordering::Relaxed);
                bell.stale = true;
            }
            return bell;
        }
        // SAFETY: `Unit`'s operations are the unit stream's intrinsics.
        let (writer, reader) = unsafe { raw_stream_new(Unit) };
        let reads = Rc::new(Cell::new(0));
        TaskBell {
            task,
            reading: Some(reading(reader, reads.clone())),
            reads,
            writer,
            rang: Arc::new(Rang(AtomicUsize::new(task))),
            users: 0,
            stale: true,
            rung: false,
            woken: Vec::new(),
        }
    }

    pub(super) fn park(task: usize) {
        let known = with_bell(task, |bell| bell.users += 1).is_some();
        if !known {
            let mut bell = bell_for(task);
            bell.users = 1;
            BELLS.with_borrow_mut(|bells| bells.push(bell));
        }
        rearm(task);
    }

    /// Poll `task`'s read when it must be: to start it, to start the next once a ring ended
    /// the last, or to move it to this task.
    pub(super) fn rearm(task: usize) {
        let taken = with_bell(task, |b| {
            if b.stale || b.rung {
                let waker = Waker::from(b.rang.clone());
                Some((b.reading.take()?, waker, b.reads.get()))
            } else {
                None
            }
        });
        let Some((mut reading, waker, reads)) = taken.flatten() else {
            return;
        };
        let _ = reading.as_mut().poll(&mut Context::from_waker(&waker));
        with_bell(task, |b| {
            b.reading = Some(reading);
            b.stale = false;
            if b.reads.get() != reads {
                b.rung = false;
            }
        });
    }

    pub(super) fn leave(task: usize) {
        let mut rung = false;
        let idle = BELLS.with_borrow_mut(|bells| {
            let i = bells.iter().position(|b| b.task == task)?;
            bells[i].users -= 1;
            rung = bells[i].rung;
            (bells[i].users == 0).then(|| bells.swap_remove(i))
        });
        match idle {
            Some(mut bell) => {
                // Still armed, for the next task to wait; the oldest beyond the bound is
                // dropped (its reading first, which cancels the read). The
                // wakers rung for are dropped: their futures wait no more, and woken later from
                // another task (the one that takes the bell over) they could reach a sleeping
                // task, which wit-bindgen does not allow.
                bell.woken.clear();
                let oldest = IDLE.with_borrow_mut(|idle| {
                    idle.push(bell);
                    (idle.len() > IDLE_BELLS).then(|| idle.remove(0))
                });
                drop(oldest);
            }
            // The others still wait: a bell that rang for this one is armed again for them.
            None if rung && super::current_task() == task => rearm(task),
            None => {}
        }
    }

    pub(super) fn ring(task: usize, waker: Waker) -> Result<(), Waker> {
        let handle = BELLS.with_borrow_mut(|bells| {
            let Some(bell) = bells.iter_mut().find(|b| b.task == task) else {
                return Err(waker);
            };
            bell.woken.push(waker);
            // Rung already: the read's event is on its way, and wakes this one too.
            Ok((!std::mem::replace(&mut bell.rung, true)).then(|| bell.writer.handle()))
        })?;
        if let Some(handle) = handle {
            unit::ring(handle);
        }
        Ok(())
    }
}

#[cfg(target_family = "wasm")]
mod unit {
    //! The unit stream's intrinsics, as wit-bindgen declares them for its own wake-ups.

    use std::alloc::Layout;
    use wit_bindgen::rt::async_support::StreamOps;

    #[link(wasm_import_module = "$root")]
    unsafe extern "C" {
        #[link_name = "[stream-new-unit]"]
        fn unit_new() -> u64;
        #[link_name = "[async-lower][stream-write-unit]"]
        fn unit_write(stream: u32, val: *const u8, amt: usize) -> u32;
        #[link_name = "[async-lower][stream-read-unit]"]
        fn unit_read(stream: u32, val: *mut u8, amt: usize) -> u32;
        #[link_name = "[stream-cancel-read-unit]"]
        fn unit_cancel_read(stream: u32) -> u32;
        #[link_name = "[stream-cancel-write-unit]"]
        fn unit_cancel_write(stream: u32) -> u32;
        #[link_name = "[stream-drop-readable-unit]"]
        fn unit_drop_readable(stream: u32);
        #[link_name = "[stream-drop-writable-unit]"]
        fn unit_drop_writable(stream: u32);
    }

    /// The return code of a copy that could not finish at once.
    const BLOCKED: u32 = 0xffff_ffff;

    /// Write one unit to `handle`. The waiter's read is pending, so it completes at once; were
    /// it not, the write is cancelled rather than left waiting.
    pub(super) fn ring(handle: u32) {
        // SAFETY: `handle` is a live write end (its bell outlives its entry in `Waiters`); a
        // unit copies no memory.
        unsafe {
            if unit_write(handle, std::ptr::NonNull::<u8>::dangling().as_ptr(), 1) == BLOCKED {
                unit_cancel_write(handle);
            }
        }
    }

    /// A stream of units (`stream` with no payload).
    #[derive(Clone, Copy)]
    pub(super) struct Unit;

    // SAFETY: the intrinsics are the unit stream's; a unit has no representation to lower.
    unsafe impl StreamOps for Unit {
        type Payload = ();

        fn new(&mut self) -> u64 {
            unsafe { unit_new() }
        }
        fn elem_layout(&self) -> Layout {
            Layout::new::<()>()
        }
        fn native_abi_matches_canonical_abi(&self) -> bool {
            true
        }
        fn contains_lists(&self) -> bool {
            false
        }
        unsafe fn lower(&mut self, (): (), _dst: *mut u8) {}
        unsafe fn dealloc_lists(&mut self, _dst: *mut u8) {}
        unsafe fn lift(&mut self, _dst: *mut u8) -> Self::Payload {}
        unsafe fn start_write(&mut self, stream: u32, val: *const u8, amt: usize) -> u32 {
            unsafe { unit_write(stream, val, amt) }
        }
        unsafe fn start_read(&mut self, stream: u32, val: *mut u8, amt: usize) -> u32 {
            unsafe { unit_read(stream, val, amt) }
        }
        unsafe fn cancel_read(&mut self, stream: u32) -> u32 {
            unsafe { unit_cancel_read(stream) }
        }
        unsafe fn cancel_write(&mut self, stream: u32) -> u32 {
            unsafe { unit_cancel_write(stream) }
        }
        unsafe fn drop_readable(&mut self, stream: u32) {
            unsafe { unit_drop_readable(stream) }
        }
        unsafe fn drop_writable(&mut self, stream: u32) {
            unsafe { unit_drop_writable(stream) }
        }
    }
}
