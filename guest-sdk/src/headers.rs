//! The headers the adapters themselves add to messages, and the rules for their values.

use crate::Headers;

/// The delivery attempt, as decimal text: `1` on the first delivery.
pub const ATTEMPT: &str = "x-wrpc-attempt";
/// Why a message was dead-lettered: one line of at most [`MAX_DEAD_REASON`] characters.
pub const DEAD_REASON: &str = "x-wrpc-dead-reason";
/// The most characters a dead-letter reason keeps.
pub const MAX_DEAD_REASON: usize = 512;

/// The attempt a message carries in [`ATTEMPT`]; 1 when absent or unreadable.
pub fn attempt(headers: &Headers) -> u32 {
    get(headers, ATTEMPT)
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|s| s.trim().parse::<u32>().ok())
        .filter(|n| *n >= 1)
        .unwrap_or(1)
}

/// The first value of header `name`, if any.
pub fn get<'a>(headers: &'a Headers, name: &str) -> Option<&'a [u8]> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_slice())
}

/// Replace every value of `name` by one `value`.
pub fn set(headers: &mut Headers, name: &str, value: impl Into<Vec<u8>>) {
    headers.retain(|(k, _)| !k.eq_ignore_ascii_case(name));
    headers.push((name.to_string(), value.into()));
}

/// The headers without the adapter's own [`ATTEMPT`] (what a handler sees).
pub fn without_attempt(headers: Headers) -> Headers {
    headers
        .into_iter()
        .filter(|(k, _)| !k.eq_ignore_ascii_case(ATTEMPT))
        .collect()
}

/// The headers with [`ATTEMPT`] set to `attempt`.
pub fn with_attempt(mut headers: Headers, attempt: u32) -> Headers {
    set(&mut headers, ATTEMPT, attempt.to_string());
    headers
}

/// A dead-letter reason made fit for [`DEAD_REASON`]: line breaks and other control characters
/// become spaces, and it is cut to [`MAX_DEAD_REASON`] characters (ending in `…` when cut).
pub fn dead_reason(reason: &str) -> String {
    let line: String = reason
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let line = line.trim();
    if line.chars().count() <= MAX_DEAD_REASON {
        return line.to_string();
    }
    let mut cut: String = line.chars().take(MAX_DEAD_REASON - 1).collect();
    cut.push('…');
    cut
}

/// The headers of a dead-lettered copy: the original's, plus the reason and the attempt.
pub fn dead_letter(headers: Headers, reason: &str, attempt: u32) -> Headers {
    let mut headers = with_attempt(headers, attempt);
    set(&mut headers, DEAD_REASON, dead_reason(reason));
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_reason_is_one_line_and_bounded() {
        assert_eq!(dead_reason("a\nb\r\tc"), "a b  c");
        let long = "x".repeat(600);
        let r = dead_reason(&long);
        assert_eq!(r.chars().count(), MAX_DEAD_REASON);
        assert!(r.ends_with('…'));
        assert_eq!(dead_reason(&"y".repeat(512)), "y".repeat(512));
    }

    #[test]
    fn attempt_round_trips() {
        let h = with_attempt(vec![("a".into(), b"1".to_vec())], 3);
        assert_eq!(attempt(&h), 3);
        assert_eq!(attempt(&without_attempt(h)), 1);
        assert_eq!(attempt(&vec![(ATTEMPT.into(), b"zero".to_vec())]), 1);
    }
}
