//! `encode-token` (the host's `token::encode_token`): never panics; with the adapters' real
//! alphabets, injective, in the alphabet (plus the escape) and within the length.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;

#[path = "../../host/runtime/src/token.rs"]
#[allow(dead_code)]
mod token;

/// The (safe, escape) pairs the adapters pass (NATS subjects, Redis keys, a plain one).
const ALPHABETS: &[(&str, &str)] = &[
    ("A-Za-z0-9-", "_"),
    ("!-$&-9;-~", "%"),
    ("a-zA-Z0-9_-", "~"),
];

#[derive(Arbitrary, Debug)]
struct Input {
    a: String,
    b: String,
    alphabet: u8,
    max_len: u8,
    /// Anything at all as the alphabet and escape: must be refused or work, never panic.
    wild_safe: String,
    wild_escape: String,
}

fuzz_target!(|input: Input| {
    let (safe, escape) = ALPHABETS[input.alphabet as usize % ALPHABETS.len()];
    let max = token::MIN_MAX_LEN + u32::from(input.max_len);
    let ea = token::encode_token(&input.a, safe, escape, max).unwrap();
    let eb = token::encode_token(&input.b, safe, escape, max).unwrap();
    assert_eq!(
        input.a == input.b,
        ea == eb,
        "{:?} {:?} -> {ea:?} {eb:?}",
        input.a,
        input.b
    );
    assert!(ea.len() <= max as usize, "{ea:?} longer than {max}");
    let esc = escape.as_bytes()[0];
    let allowed = |c: u8| {
        c == esc
            || safe
                .as_bytes()
                .windows(3)
                .any(|w| w[1] == b'-' && w[0] <= c && c <= w[2])
            || safe.as_bytes().contains(&c)
    };
    assert!(ea.bytes().all(allowed), "{ea:?} leaves {safe:?}");
    let _ = token::encode_token(&input.a, &input.wild_safe, &input.wild_escape, max);
});
