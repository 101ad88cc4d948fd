//! Access: bearer tokens, each allowed a set of grants `capability:access:names` —
//! `log:read:orders.*` reads the feeds whose names start with `orders.`; `queue:*:jobs` reads
//! and writes the queue `jobs`; `*:*:*` is everything. Writing is append, produce, publish,
//! send and request; reading is read, consume, subscribe and listen.

use crate::error::ApiError;

/// Reading or writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read, consume, subscribe, listen.
    Read,
    /// Append, produce, publish, send, request.
    Write,
}

/// One thing a token may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// `log`, `queue`, `direct`, `backplane`, or `None` for every capability.
    capability: Option<String>,
    /// `None` for both.
    access: Option<Access>,
    /// The names: exact, or a prefix when it ends with `*`.
    names: String,
}

impl Grant {
    /// Parse `capability:access:names`.
    pub fn parse(text: &str) -> Result<Grant, String> {
        let mut parts = text.splitn(3, ':');
        let (Some(capability), Some(access), Some(names)) =
            (parts.next(), parts.next(), parts.next())
        else {
            return Err(format!(
                "grant `{text}`: expected capability:access:names (e.g. log:read:orders.*)"
            ));
        };
        let capability = match capability {
            "*" => None,
            c if crate::config::CAPABILITIES.contains(&c) => Some(c.to_string()),
            c => {
                return Err(format!(
                    "grant `{text}`: capability `{c}` is not one of log, queue, direct, backplane, *"
                ));
            }
        };
        let access = match access {
            "*" => None,
            "read" => Some(Access::Read),
            "write" => Some(Access::Write),
            a => {
                return Err(format!(
                    "grant `{text}`: access `{a}` is not read, write or *"
                ));
            }
        };
        if names.is_empty() {
            return Err(format!(
                "grant `{text}`: empty names (use * for every name)"
            ));
        }
        Ok(Grant {
            capability,
            access,
            names: names.to_string(),
        })
    }

    fn allows(&self, capability: &str, access: Access, name: &str) -> bool {
        self.capability.as_deref().is_none_or(|c| c == capability)
            && self.access.is_none_or(|a| a == access)
            && match self.names.strip_suffix('*') {
                Some(prefix) => name.starts_with(prefix),
                None => name == self.names,
            }
    }
}

/// The tokens of a config and their grants.
#[derive(Debug, Clone, Default)]
pub struct Tokens(Vec<(String, Vec<Grant>)>);

impl Tokens {
    /// Tokens with their grants.
    pub fn new(tokens: Vec<(String, Vec<Grant>)>) -> Self {
        Self(tokens)
    }

    /// True when no token is configured: the API is open.
    pub fn open(&self) -> bool {
        self.0.is_empty()
    }

    /// May the bearer of `authorization` (the header's value) do `access` on `name` of
    /// `capability`? 401 without a known token, 403 outside its grants.
    pub fn check(
        &self,
        authorization: Option<&str>,
        capability: &str,
        access: Access,
        name: &str,
    ) -> Result<(), ApiError> {
        if self.open() {
            return Ok(());
        }
        let Some(bearer) = authorization.and_then(|h| h.strip_prefix("Bearer ")) else {
            return Err(ApiError::new(401, "a bearer token is required"));
        };
        let Some((_, grants)) = self.0.iter().find(|(t, _)| constant_eq(t, bearer.trim())) else {
            return Err(ApiError::new(401, "unknown token"));
        };
        if grants.iter().any(|g| g.allows(capability, access, name)) {
            Ok(())
        } else {
            let verb = match access {
                Access::Read => "read",
                Access::Write => "write",
            };
            Err(ApiError::new(
                403,
                format!("this token may not {verb} {capability} `{name}`"),
            ))
        }
    }
}

/// Compare without an early exit on the first differing byte.
fn constant_eq(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens() -> Tokens {
        Tokens::new(vec![(
            "reader-token".into(),
            vec![Grant::parse("log:read:orders.*").unwrap()],
        )])
    }

    #[test]
    fn a_grant_allows_its_capability_access_and_names_only() {
        let t = tokens();
        let bearer = Some("Bearer reader-token");
        assert!(t.check(bearer, "log", Access::Read, "orders.eu").is_ok());
        for (capability, access, name) in [
            ("log", Access::Write, "orders.eu"),
            ("log", Access::Read, "invoices"),
            ("queue", Access::Read, "orders.eu"),
        ] {
            assert_eq!(
                t.check(bearer, capability, access, name)
                    .unwrap_err()
                    .status,
                403
            );
        }
        assert_eq!(
            t.check(None, "log", Access::Read, "orders.eu")
                .unwrap_err()
                .status,
            401
        );
        let wrong = Some("Bearer reader-tokex");
        assert_eq!(
            t.check(wrong, "log", Access::Read, "orders.eu")
                .unwrap_err()
                .status,
            401
        );
    }

    #[test]
    fn an_exact_name_is_not_a_prefix() {
        let g = Grant::parse("queue:*:jobs").unwrap();
        assert!(g.allows("queue", Access::Write, "jobs"));
        assert!(!g.allows("queue", Access::Write, "jobs2"));
        assert!(
            Grant::parse("*:*:*")
                .unwrap()
                .allows("direct", Access::Read, "x")
        );
    }
}
