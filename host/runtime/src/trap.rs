//! What a trap says to a user: the cause first, on one line, with the guest's panic message
//! when it printed one; the wasm backtrace apart (logged at DEBUG).

use wasmtime::{Trap, WasmBacktrace};

/// A trap made readable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrapReport {
    /// One line: the cause (and the panic message, if any).
    pub message: String,
    /// The wasm backtrace, when wasmtime captured one.
    pub backtrace: Option<String>,
}

/// Longest panic message quoted in a trap.
const MAX_PANIC: usize = 1024;

/// Summarise `error` (from a call into the guest); `stderr_tail` is the end of what the guest
/// wrote to stderr, where a Rust guest prints its panic before it traps.
pub fn report(error: &wasmtime::Error, stderr_tail: &str) -> TrapReport {
    let backtrace = error.downcast_ref::<WasmBacktrace>().map(|b| b.to_string());
    let causes: Vec<String> = error
        .chain()
        .map(|cause| cause.to_string())
        .filter(|text| Some(text) != backtrace.as_ref())
        .map(|text| one_line(&text))
        .filter(|text| !text.is_empty())
        .fold(Vec::new(), |mut kept, text| {
            // A context that repeats its source says nothing new.
            if !kept
                .last()
                .is_some_and(|last: &String| last.contains(&text))
            {
                kept.push(text);
            }
            kept
        });
    let mut message = if causes.is_empty() {
        "the adapter stopped with no cause given".to_string()
    } else {
        causes.join(": ")
    };
    let unreachable = error.downcast_ref::<Trap>() == Some(&Trap::UnreachableCodeReached);
    if unreachable && let Some(panic) = panic_message(stderr_tail) {
        message = format!("the adapter panicked: {panic} ({message})");
    }
    TrapReport { message, backtrace }
}

/// Newlines and runs of spaces folded into single spaces.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The last panic a Rust guest printed: `panicked at <place>:\n<message>\nnote: …`.
pub fn panic_message(stderr: &str) -> Option<String> {
    let start = stderr.rfind("panicked at ")?;
    let rest = &stderr[start + "panicked at ".len()..];
    let (place, body) = rest.split_once(":\n").unwrap_or((rest, ""));
    let body = body
        .split("\nnote: run with `RUST_BACKTRACE")
        .next()
        .unwrap_or(body);
    let mut text = one_line(body);
    if text.is_empty() {
        text = "(no message)".into();
    }
    if text.len() > MAX_PANIC {
        let mut end = MAX_PANIC;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    Some(format!("{text} at {}", one_line(place)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rust_panic_is_read_from_stderr() {
        let stderr = "noise\n\nthread '<unnamed>' panicked at src/lib.rs:68:13:\nthe probe was \
                      asked to trap\nnote: run with `RUST_BACKTRACE=1` environment variable to \
                      display a backtrace\n";
        assert_eq!(
            panic_message(stderr).unwrap(),
            "the probe was asked to trap at src/lib.rs:68:13"
        );
        assert_eq!(panic_message("no panic here"), None);
    }

    #[test]
    fn the_cause_comes_first_on_one_line() {
        let e = wasmtime::Error::msg("CPU slice exhausted:\n  ran too long").context("describe");
        let report = report(&e, "");
        assert_eq!(
            report.message,
            "describe: CPU slice exhausted: ran too long"
        );
        assert_eq!(report.backtrace, None);
    }
}
