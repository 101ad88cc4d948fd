//! Names the adapter mints (consumer names, inboxes, groups, message ids) come from the host's
//! generator, used verbatim: never truncated, never re-encoded.

use crate::{Error, host};

/// A fresh unique id from the operator's generator.
pub fn generate() -> String {
    host::generate_id()
}

/// `prefix` followed by a fresh id, e.g. `inbox.` + id.
pub fn prefixed(prefix: &str) -> String {
    format!("{prefix}{}", host::generate_id())
}

/// Encode `name` into a broker alphabet injectively (the host's one implementation).
pub fn encode_token(name: &str, safe: &str, escape: char, max_len: u32) -> Result<String, Error> {
    host::encode_token(name, safe, &escape.to_string(), max_len)
}
