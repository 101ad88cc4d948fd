//! Logging to the host: lines land in `tracing` with target `broker.<adapter name>`.

use crate::{Level, host};

/// Write one line at `level`.
pub fn write(level: Level, message: &str) {
    host::log(level, message);
}

/// Log at debug level with `format!` syntax.
#[macro_export]
macro_rules! debug {
    ($($arg:tt)*) => { $crate::log::write($crate::Level::Debug, &format!($($arg)*)) };
}

/// Log at info level with `format!` syntax.
#[macro_export]
macro_rules! info {
    ($($arg:tt)*) => { $crate::log::write($crate::Level::Info, &format!($($arg)*)) };
}

/// Log at warn level with `format!` syntax.
#[macro_export]
macro_rules! warn {
    ($($arg:tt)*) => { $crate::log::write($crate::Level::Warn, &format!($($arg)*)) };
}

/// Log at error level with `format!` syntax.
#[macro_export]
macro_rules! error {
    ($($arg:tt)*) => { $crate::log::write($crate::Level::Error, &format!($($arg)*)) };
}
