//! What one adapter instance may touch: the Store data (`Ctx`), its WASI context with no
//! filesystem, environment, arguments or network, its memory cap, the CPU slice, and the
//! component's stdout/stderr turned into `tracing` lines.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::AsyncWrite;
use wasmtime::component::ResourceTable;
use wasmtime::{StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::lent::DriverConnections;
use super::trace::TargetLogger;
use crate::ids::IdGenerator;

/// How long one epoch tick lasts; the CPU slice is counted in ticks.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Limits applied to every instance of an adapter.
#[derive(Debug, Clone)]
pub struct Limits {
    /// The most linear memory one instance may grow to.
    pub memory_bytes: usize,
    /// How long a guest may run without returning to the host before it traps.
    pub cpu_slice: Duration,
    /// How long the host waits for one call before answering `timeout`.
    pub call_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory_bytes: 256 << 20,
            cpu_slice: Duration::from_secs(2),
            call_timeout: Duration::from_secs(30),
        }
    }
}

/// The data of one instance's Store.
pub struct Ctx {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) limits: StoreLimits,
    /// `broker.<name>`: where `host.log` and stdout/stderr go.
    pub(crate) logger: TargetLogger,
    /// The operator's id generator.
    pub(crate) ids: Arc<dyn IdGenerator>,
    /// The broker connections lent to this component (only those it was configured with).
    pub(crate) drivers: DriverConnections,
    /// Epoch ticks the guest has run since it last returned to the host.
    pub(crate) busy_ticks: u64,
}

impl Ctx {
    /// A sandboxed context: no preopens, env or args; stdout/stderr to `tracing`.
    pub fn new(
        logger: TargetLogger,
        ids: Arc<dyn IdGenerator>,
        drivers: DriverConnections,
        limits: &Limits,
    ) -> Self {
        let wasi = WasiCtx::builder()
            .stdout(TracingOutput {
                logger,
                level: tracing::Level::INFO,
            })
            .stderr(TracingOutput {
                logger,
                level: tracing::Level::WARN,
            })
            .allow_blocking_current_thread(false)
            .build();
        Self {
            wasi,
            table: ResourceTable::new(),
            limits: StoreLimitsBuilder::new()
                .memory_size(limits.memory_bytes)
                .trap_on_grow_failure(true)
                .build(),
            logger,
            ids,
            drivers,
            busy_ticks: 0,
        }
    }

    /// The guest returned to the host: its CPU slice starts again.
    pub fn progress(&mut self) {
        self.busy_ticks = 0;
    }

    /// The connection of type `T` lent to this component, if it was configured with one; a
    /// driver's import calls this first (the guest returned to the host: a fresh CPU slice).
    pub fn lent<T: std::any::Any + Send + Sync>(&mut self) -> Option<&T> {
        self.progress();
        self.drivers.get::<T>()
    }
}

impl WasiView for Ctx {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// A component's stdout or stderr: each line becomes a `tracing` event.
#[derive(Clone, Copy)]
struct TracingOutput {
    logger: TargetLogger,
    level: tracing::Level,
}

impl IsTerminal for TracingOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for TracingOutput {
    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(LineWriter {
            out: *self,
            line: Vec::new(),
        })
    }
}

/// Buffers bytes until a newline, then logs the line.
struct LineWriter {
    out: TracingOutput,
    line: Vec<u8>,
}

impl LineWriter {
    fn emit(&mut self) {
        if !self.line.is_empty() {
            let text = String::from_utf8_lossy(&self.line);
            self.out.logger.log(self.out.level, text.trim_end());
            self.line.clear();
        }
    }
}

impl AsyncWrite for LineWriter {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        for &b in buf {
            if b == b'\n' {
                self.emit();
            } else if self.line.len() < 64 * 1024 {
                self.line.push(b);
            }
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.emit();
        Poll::Ready(Ok(()))
    }
}

impl Drop for LineWriter {
    fn drop(&mut self) {
        self.emit();
    }
}
