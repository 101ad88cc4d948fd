//! The native side of the bench (later).
pub(crate) struct Native;
