//! `encode-token`: the one injective encoding of names into a broker's alphabet, shared by every
//! adapter language through the `host` import.

use sha2::{Digest, Sha256};

/// The shortest `max_len` that leaves room for a digest form.
pub const MIN_MAX_LEN: u32 = 40;
/// Hex digits of the SHA-256 kept in a digest form.
const DIGEST_HEX: usize = 32;

/// Why a token could not be encoded (a mistake of the calling adapter, not of the name).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// `escape` is not exactly one ASCII character.
    #[error("escape must be one ASCII character, got {0:?}")]
    BadEscape(String),
    /// `safe` is malformed (non-ASCII, a reversed range) or misses what the encoding needs.
    #[error("safe alphabet {0:?}: {1}")]
    BadSafe(String, String),
    /// `max_len` is below [`MIN_MAX_LEN`].
    #[error("max-len {0} is below the minimum of {MIN_MAX_LEN}")]
    MaxLenTooSmall(u32),
}

/// Parse a `safe` specification (`a-z` ranges, a `-` first or last is literal) into a table.
fn safe_table(safe: &str) -> Result<[bool; 128], TokenError> {
    let bad = |why: &str| TokenError::BadSafe(safe.to_string(), why.to_string());
    if !safe.is_ascii() {
        return Err(bad("must be ASCII"));
    }
    let bytes = safe.as_bytes();
    let mut table = [false; 128];
    let mut i = 0;
    while i < bytes.len() {
        if i + 2 < bytes.len() && bytes[i + 1] == b'-' {
            let (lo, hi) = (bytes[i], bytes[i + 2]);
            if lo > hi {
                return Err(bad("reversed range"));
            }
            for c in lo..=hi {
                table[c as usize] = true;
            }
            i += 3;
        } else {
            table[bytes[i] as usize] = true;
            i += 1;
        }
    }
    Ok(table)
}

/// Encode `name` so that only characters of `safe` appear; see the WIT `host.encode-token`.
pub fn encode_token(
    name: &str,
    safe: &str,
    escape: &str,
    max_len: u32,
) -> Result<String, TokenError> {
    let esc = match escape.as_bytes() {
        [c] if c.is_ascii() => *c,
        _ => return Err(TokenError::BadEscape(escape.to_string())),
    };
    let table = safe_table(safe)?;
    if table[esc as usize] {
        return Err(TokenError::BadSafe(
            safe.to_string(),
            "must not contain the escape".into(),
        ));
    }
    if !b"0123456789abcdef".iter().all(|c| table[*c as usize]) {
        return Err(TokenError::BadSafe(
            safe.to_string(),
            "must contain 0-9a-f".into(),
        ));
    }
    if max_len < MIN_MAX_LEN {
        return Err(TokenError::MaxLenTooSmall(max_len));
    }
    let escape = esc as char;
    // Encode byte by byte, remembering where each source character's encoding ends so a cut
    // never splits an escape sequence.
    let mut out = String::with_capacity(name.len());
    let mut boundaries = Vec::with_capacity(name.len());
    for ch in name.chars() {
        let mut buf = [0u8; 4];
        for b in ch.encode_utf8(&mut buf).bytes() {
            if b < 128 && table[b as usize] {
                out.push(b as char);
            } else {
                out.push(escape);
                out.push_str(&format!("{b:02x}"));
            }
        }
        boundaries.push(out.len());
    }
    let max = max_len as usize;
    if out.len() <= max {
        return Ok(out);
    }
    let digest = hex::encode(Sha256::digest(name.as_bytes()));
    let room = max - 2 - DIGEST_HEX;
    let cut = boundaries
        .iter()
        .rev()
        .find(|&&b| b <= room)
        .copied()
        .unwrap_or(0);
    out.truncate(cut);
    out.push(escape);
    out.push(escape);
    out.push_str(&digest[..DIGEST_HEX]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SAFE: &str = "a-zA-Z0-9_-";

    #[test]
    fn plain_names_pass_through() {
        assert_eq!(encode_token("room_1", SAFE, "~", 64).unwrap(), "room_1");
    }

    #[test]
    fn wildcards_and_separators_are_escaped() {
        assert_eq!(encode_token("a.>", SAFE, "~", 64).unwrap(), "a~2e~3e");
        assert_eq!(encode_token("room:*", SAFE, "~", 64).unwrap(), "room~3a~2a");
        assert_eq!(encode_token("~", SAFE, "~", 64).unwrap(), "~7e");
    }

    #[test]
    fn bad_arguments_are_refused() {
        assert!(matches!(
            encode_token("x", SAFE, "~~", 64),
            Err(TokenError::BadEscape(_))
        ));
        assert!(matches!(
            encode_token("x", "a-z~", "~", 64),
            Err(TokenError::BadSafe(..))
        ));
        assert!(matches!(
            encode_token("x", "g-z", "~", 64),
            Err(TokenError::BadSafe(..))
        ));
        assert!(matches!(
            encode_token("x", SAFE, "~", 39),
            Err(TokenError::MaxLenTooSmall(39))
        ));
    }

    proptest! {
        #[test]
        fn injective(a in "\\PC{0,60}", b in "\\PC{0,60}", max in 40u32..80) {
            let ea = encode_token(&a, SAFE, "~", max).unwrap();
            let eb = encode_token(&b, SAFE, "~", max).unwrap();
            prop_assert_eq!(a == b, ea == eb);
        }

        #[test]
        fn stays_in_the_alphabet_and_the_length(name in "\\PC{0,200}", max in 40u32..120) {
            let e = encode_token(&name, SAFE, "~", max).unwrap();
            prop_assert!(e.len() <= max as usize);
            prop_assert!(e.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-' || c == b'~'));
        }

        #[test]
        fn long_names_end_in_a_digest(name in "[a-z]{100,200}") {
            let e = encode_token(&name, SAFE, "~", 64).unwrap();
            prop_assert_eq!(e.len(), 64);
            let digest = hex::encode(Sha256::digest(name.as_bytes()));
            let tail = format!("~~{}", &digest[..32]);
            prop_assert!(e.ends_with(&tail));
        }

        #[test]
        fn near_collisions_past_the_cut_still_differ(prefix in "[a-z]{80}", x in "[a-z]{1,5}", y in "[a-z]{1,5}") {
            prop_assume!(x != y);
            let ea = encode_token(&format!("{prefix}{x}"), SAFE, "~", 48).unwrap();
            let eb = encode_token(&format!("{prefix}{y}"), SAFE, "~", 48).unwrap();
            prop_assert_ne!(ea, eb);
        }
    }
}
