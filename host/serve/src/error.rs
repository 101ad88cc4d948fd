//! Every error of the API is a JSON body `{"status": 404, "error": "one line"}` with that status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// An API error: a status and a one-line reason.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// The HTTP status.
    pub status: u16,
    /// Why, on one line.
    pub reason: String,
}

impl ApiError {
    /// An error with `status` and `reason` (kept to its first line).
    pub fn new(status: u16, reason: impl Into<String>) -> Self {
        let reason: String = reason.into();
        let reason = reason.lines().next().unwrap_or_default().to_string();
        Self { status, reason }
    }
}

impl From<wrpc_broker::Error> for ApiError {
    fn from(e: wrpc_broker::Error) -> Self {
        use wrpc_broker::Error as E;
        let status = match &e {
            E::Timeout(_) => 504,
            E::Unsupported(_) => 501,
            E::Closed(_) | E::Trapped(_) | E::Load(_) => 503,
            E::Refused(_) => 502,
            _ => e.status(),
        };
        ApiError::new(status, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::json!({ "status": self.status, "error": self.reason });
        (status, axum::Json(body)).into_response()
    }
}
