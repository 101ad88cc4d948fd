//! The error every public call returns: the WIT `error` cases, plus what the host itself adds
//! (a trapped adapter, a component that cannot be loaded, a missing capability).

use crate::bindings::types;

/// Why a wrpc-broker operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// 400: a malformed id, an id past the tip, a bad name or option.
    #[error("bad request (400): {0}")]
    BadRequest(String),
    /// 410: an id older than the retained history, or minted by another log.
    #[error("gone (410): {0}")]
    Gone(String),
    /// 503: nobody listens, or the broker is unreachable.
    #[error("unavailable (503): {0}")]
    Unavailable(String),
    /// The broker refused an operation.
    #[error("refused by the broker: {0}")]
    Refused(String),
    /// The operation did not finish in time.
    #[error("timed out: {0}")]
    Timeout(String),
    /// The consumer, listener or broker was already closed.
    #[error("closed: {0}")]
    Closed(String),
    /// A tag or handle of an older adapter generation.
    #[error("stale: {0}")]
    Stale(String),
    /// The adapter does not offer this capability or operation.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The adapter trapped while the call was in flight; the instance was replaced.
    #[error("adapter trapped: {0}")]
    Trapped(String),
    /// The component could not be loaded or started.
    #[error("cannot load adapter: {0}")]
    Load(String),
    /// Anything else.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// The HTTP-like status a web front end would answer with.
    pub fn status(&self) -> u16 {
        match self {
            Error::BadRequest(_) => 400,
            Error::Gone(_) => 410,
            Error::Unavailable(_) | Error::Closed(_) | Error::Trapped(_) => 503,
            Error::Timeout(_) => 504,
            Error::Unsupported(_) => 501,
            _ => 500,
        }
    }
}

impl From<types::Error> for Error {
    fn from(e: types::Error) -> Self {
        match e {
            types::Error::BadRequest(m) => Error::BadRequest(m),
            types::Error::Gone(m) => Error::Gone(m),
            types::Error::Unavailable(m) => Error::Unavailable(m),
            types::Error::Refused(m) => Error::Refused(m),
            types::Error::Timeout(m) => Error::Timeout(m),
            types::Error::Closed(m) => Error::Closed(m),
            types::Error::Stale(m) => Error::Stale(m),
            types::Error::Unsupported(m) => Error::Unsupported(m),
            types::Error::Internal(m) => Error::Internal(m),
        }
    }
}

/// The result of a wrpc-broker operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;
