//! Where a component's words go: `host.log` and its stdout/stderr become `tracing` lines under
//! `broker.<adapter name>`, each line capped at [`MAX_LINE`] bytes. Lines written before
//! `describe` names the adapter (its first instance, while instantiating) wait and go out under
//! that name once it is known. The last bytes of stderr are kept so that a trap can quote the
//! guest's panic message.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};

use super::trace::TargetLogger;

/// The longest line logged for a component (`host.log` or stdout/stderr); the rest is cut.
pub const MAX_LINE: usize = 64 * 1024;
/// Lines kept while the adapter has no name yet; more are dropped (and counted).
const MAX_PENDING: usize = 256;
/// How much of stderr is kept for the panic message of a trap.
const STDERR_TAIL: usize = 4 * 1024;

/// The log target of one instance: `broker.<name>` once known, lines held until then.
pub struct InstanceLog {
    target: OnceLock<TargetLogger>,
    pending: Mutex<Pending>,
    stderr_tail: Mutex<VecDeque<u8>>,
}

#[derive(Default)]
struct Pending {
    lines: Vec<(tracing::Level, String)>,
    dropped: usize,
}

impl InstanceLog {
    /// A log whose target is already known (a replacement instance).
    pub fn named(logger: TargetLogger) -> Arc<Self> {
        let log = Self::unnamed();
        let _ = log.target.set(logger);
        log
    }

    /// A log waiting for `describe` to name the adapter.
    pub fn unnamed() -> Arc<Self> {
        Arc::new(Self {
            target: OnceLock::new(),
            pending: Mutex::new(Pending::default()),
            stderr_tail: Mutex::new(VecDeque::with_capacity(STDERR_TAIL)),
        })
    }

    /// Name the target; lines held so far go out under it, in order.
    pub fn name(&self, logger: TargetLogger) {
        if self.target.set(logger).is_err() {
            return;
        }
        self.flush_to(logger);
    }

    fn flush_to(&self, logger: TargetLogger) {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        for (level, line) in pending.lines {
            logger.log(level, &line);
        }
        if pending.dropped > 0 {
            logger.log(
                tracing::Level::WARN,
                &format!(
                    "{} lines written before describe() were dropped",
                    pending.dropped
                ),
            );
        }
    }

    /// Log one line (cut at [`MAX_LINE`]).
    pub fn log(&self, level: tracing::Level, message: &str) {
        let line = cap_line(message);
        match self.target.get() {
            Some(logger) => logger.log(level, &line),
            None => {
                let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
                if pending.lines.len() < MAX_PENDING {
                    pending.lines.push((level, line.into_owned()));
                } else {
                    pending.dropped += 1;
                }
            }
        }
    }

    /// Remember the end of what the component wrote to stderr.
    fn keep_stderr(&self, bytes: &[u8]) {
        let mut tail = self.stderr_tail.lock().unwrap_or_else(|e| e.into_inner());
        let bytes = &bytes[bytes.len().saturating_sub(STDERR_TAIL)..];
        let overflow = (tail.len() + bytes.len()).saturating_sub(STDERR_TAIL);
        tail.drain(..overflow);
        tail.extend(bytes);
    }

    /// The last few KiB the component wrote to stderr.
    pub fn stderr_tail(&self) -> String {
        let tail = self.stderr_tail.lock().unwrap_or_else(|e| e.into_inner());
        String::from_utf8_lossy(&tail.iter().copied().collect::<Vec<u8>>()).into_owned()
    }
}

impl Drop for InstanceLog {
    fn drop(&mut self) {
        // Never named (describe failed): what it wrote still goes out.
        if self.target.get().is_none() {
            self.flush_to(TargetLogger::new("broker.starting"));
        }
    }
}

/// `message` cut at [`MAX_LINE`] bytes (on a character boundary), saying how much was cut.
pub fn cap_line(message: &str) -> std::borrow::Cow<'_, str> {
    if message.len() <= MAX_LINE {
        return message.into();
    }
    let mut end = MAX_LINE;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}… [{} more bytes cut]",
        &message[..end],
        message.len() - end
    )
    .into()
}

/// A component's stdout or stderr: each line becomes a `tracing` event.
#[derive(Clone)]
pub struct TracingOutput {
    log: Arc<InstanceLog>,
    level: tracing::Level,
    stderr: bool,
}

impl TracingOutput {
    /// Stdout, logged at INFO.
    pub fn stdout(log: Arc<InstanceLog>) -> Self {
        Self {
            log,
            level: tracing::Level::INFO,
            stderr: false,
        }
    }

    /// Stderr, logged at WARN; its tail is kept for trap messages.
    pub fn stderr(log: Arc<InstanceLog>) -> Self {
        Self {
            log,
            level: tracing::Level::WARN,
            stderr: true,
        }
    }
}

impl IsTerminal for TracingOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for TracingOutput {
    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(LineWriter {
            out: self.clone(),
            line: Vec::new(),
            cut: 0,
        })
    }
}

/// Buffers bytes until a newline, then logs the line.
struct LineWriter {
    out: TracingOutput,
    line: Vec<u8>,
    /// Bytes of the current line past [`MAX_LINE`], dropped.
    cut: usize,
}

impl LineWriter {
    fn emit(&mut self) {
        if !self.line.is_empty() || self.cut > 0 {
            let text = String::from_utf8_lossy(&self.line);
            let text = text.trim_end();
            if self.cut > 0 {
                let line = format!("{text}… [{} more bytes cut]", self.cut);
                self.out.log.log(self.out.level, &line);
            } else {
                self.out.log.log(self.out.level, text);
            }
            self.line.clear();
            self.cut = 0;
        }
    }
}

impl AsyncWrite for LineWriter {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.out.stderr {
            self.out.log.keep_stderr(buf);
        }
        for &b in buf {
            if b == b'\n' {
                self.emit();
            } else if self.line.len() < MAX_LINE {
                self.line.push(b);
            } else {
                self.cut += 1;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_line_is_cut_on_a_character_boundary() {
        let short = "é".repeat(10);
        assert_eq!(cap_line(&short), short);
        let long = "é".repeat(MAX_LINE);
        let cut = cap_line(&long);
        assert!(cut.len() < MAX_LINE + 40, "{}", cut.len());
        assert!(cut.ends_with(&format!("[{} more bytes cut]", long.len() - MAX_LINE)));
    }

    #[test]
    fn the_stderr_tail_keeps_the_last_bytes() {
        let log = InstanceLog::named(TargetLogger::new("broker.test-tail"));
        log.keep_stderr(&vec![b'a'; STDERR_TAIL * 2]);
        log.keep_stderr(b"panicked at x:1:1:\nboom\n");
        let tail = log.stderr_tail();
        assert_eq!(tail.len(), STDERR_TAIL);
        assert!(tail.ends_with("boom\n"));
    }
}
