//! Names the adapter mints (consumer names, inboxes, groups, message ids) come from the host's
//! generator, used verbatim: never truncated, never re-encoded.

use std::cell::RefCell;
use std::collections::BTreeMap;

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
///
/// Answers are remembered (at most [`TOKENS_REMEMBERED`] names of at most
/// [`TOKEN_NAME_REMEMBERED`] bytes, forgotten all at once when full): an adapter encodes the
/// same topic on every operation, and each import call costs a crossing of the boundary. The
/// encoding is a pure function of its arguments, so a remembered answer is the host's answer.
pub fn encode_token(name: &str, safe: &str, escape: char, max_len: u32) -> Result<String, Error> {
    let ask = || host::encode_token(name, safe, escape.encode_utf8(&mut [0; 4]), max_len);
    if name.len() > TOKEN_NAME_REMEMBERED {
        return ask();
    }
    TOKENS.with_borrow_mut(|alphabets| {
        let at = match alphabets
            .iter()
            .position(|(s, e, m, _)| s == safe && *e == escape && *m == max_len)
        {
            Some(at) => at,
            None => {
                alphabets.push((safe.to_string(), escape, max_len, BTreeMap::new()));
                alphabets.len() - 1
            }
        };
        let tokens = &mut alphabets[at].3;
        if let Some(token) = tokens.get(name) {
            return Ok(token.clone());
        }
        let token = ask()?;
        if tokens.len() >= TOKENS_REMEMBERED {
            tokens.clear();
        }
        tokens.insert(name.to_string(), token.clone());
        Ok(token)
    })
}

/// How many encoded names [`encode_token`] remembers per alphabet.
pub const TOKENS_REMEMBERED: usize = 256;
/// The longest name (in bytes) [`encode_token`] remembers.
pub const TOKEN_NAME_REMEMBERED: usize = 256;

/// Per alphabet (safe bytes, escape, longest encoding): the names encoded in it.
type Tokens = Vec<(String, char, u32, BTreeMap<String, String>)>;

thread_local! {
    /// What [`encode_token`] remembers.
    static TOKENS: RefCell<Tokens> = const { RefCell::new(Vec::new()) };
}

/// Whether `text` is a valid log epoch: `[A-Za-z0-9_-]+`.
pub fn is_epoch(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The id `{epoch}:{n}` of a log entry, `n` in canonical decimal. Built without `core::fmt`: a
/// catch-up page mints one per entry, and formatting was a visible part of its cost in a guest.
pub fn log_id(epoch: &str, n: u64) -> String {
    let mut id = String::with_capacity(epoch.len() + 1 + MAX_DIGITS);
    id.push_str(epoch);
    id.push(':');
    push_decimal(&mut id, n);
    id
}

/// The most decimal digits of a `u64`.
pub const MAX_DIGITS: usize = 20;

/// Append `n` to `out` in canonical decimal (no leading zero), without `core::fmt`.
pub fn push_decimal(out: &mut String, n: u64) {
    let mut digits = [0u8; MAX_DIGITS];
    let mut start = digits.len();
    let mut rest = n;
    loop {
        start -= 1;
        digits[start] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    out.push_str(std::str::from_utf8(&digits[start..]).expect("ASCII digits"));
}

/// Split a log id `{epoch}:{n}`, `n` a canonical decimal (`0`, or no leading zero); anything
/// else is a bad request saying it expected `epoch:{part}`.
pub fn parse_log_id<'a>(id: &'a str, part: &str) -> Result<(&'a str, u64), Error> {
    let malformed = || Error::bad_request(format!("malformed id `{id}`: expected `epoch:{part}`"));
    let (epoch, n) = id.rsplit_once(':').ok_or_else(malformed)?;
    let canonical =
        !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && (n == "0" || !n.starts_with('0'));
    if !is_epoch(epoch) || !canonical {
        return Err(malformed());
    }
    Ok((epoch, n.parse().map_err(|_| malformed())?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_id_is_canonical_decimal_and_parses_back() {
        for n in [0, 7, 10, 99, 1_000_000, u64::MAX] {
            let id = log_id("ep-1", n);
            assert_eq!(id, format!("ep-1:{n}"));
            assert_eq!(parse_log_id(&id, "offset").unwrap(), ("ep-1", n));
        }
    }
}
