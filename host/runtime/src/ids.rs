//! The operator's id generator: every name an adapter mints (consumer names, inboxes, groups,
//! message ids, log epochs) comes from here, through `host.generate-id`.

use crate::error::{Error, Result};

/// Makes fresh unique ids. Ids must be non-empty ASCII letters, digits, `-` and `_`, and unique.
pub trait IdGenerator: Send + Sync + 'static {
    /// A fresh id.
    fn generate(&self) -> String;
}

/// The default generator: 128 random bits as 26 lowercase base32 characters.
#[derive(Debug, Default, Clone, Copy)]
pub struct RandomIds;

impl IdGenerator for RandomIds {
    fn generate(&self) -> String {
        const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
        let mut bits: u128 = rand::random();
        (0..26)
            .map(|_| {
                let c = ALPHABET[(bits & 31) as usize] as char;
                bits >>= 5;
                c
            })
            .collect()
    }
}

impl<F: Fn() -> String + Send + Sync + 'static> IdGenerator for F {
    fn generate(&self) -> String {
        self()
    }
}

/// Check a generator before any adapter uses it: a bad generator fails at construction.
pub fn validate(ids: &dyn IdGenerator) -> Result<()> {
    let samples: Vec<String> = (0..16).map(|_| ids.generate()).collect();
    for id in &samples {
        if id.is_empty()
            || !id
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
        {
            return Err(Error::BadRequest(format!(
                "id generator produced {id:?}: ids must be non-empty ASCII letters, digits, `-` or `_`"
            )));
        }
    }
    let mut unique = samples.clone();
    unique.sort();
    unique.dedup();
    if unique.len() != samples.len() {
        return Err(Error::BadRequest(
            "id generator produced the same id twice in 16 calls".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_ids_pass_validation() {
        validate(&RandomIds).unwrap();
        assert_eq!(RandomIds.generate().len(), 26);
    }

    #[test]
    fn bad_generators_fail() {
        assert!(validate(&|| "same".to_string()).is_err());
        assert!(validate(&|| "has space".to_string()).is_err());
        assert!(validate(&String::new).is_err());
    }
}
