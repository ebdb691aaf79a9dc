//! Errors: [`FakeError`] for the in-process helpers, [`ApiError`] for HTTP answers in Ironic's error format.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Why an in-process helper of [`crate::FakeIronic`] (or the store behind it) refused.
#[derive(Debug, thiserror::Error)]
pub enum FakeError {
    #[error("Node {0} could not be found.")]
    NodeNotFound(String),
    #[error("Port {0} could not be found.")]
    PortNotFound(String),
    #[error("A port with MAC address {0} already exists.")]
    DuplicateAddress(String),
    #[error("A port with UUID {0} already exists.")]
    DuplicatePort(String),
    #[error("Expected a MAC address but received {0}.")]
    InvalidMac(String),
    #[error("binding {addr}")]
    Bind {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// An HTTP error answered the way Ironic answers: `{"error_message": "<JSON string>"}` where the string holds
/// `faultstring`, `faultcode` ("Client" for 4xx, "Server" for 5xx) and `debuginfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub faultstring: String,
}

impl ApiError {
    pub fn new(status: StatusCode, faultstring: impl Into<String>) -> ApiError {
        ApiError { status, faultstring: faultstring.into() }
    }

    pub fn bad_request(faultstring: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, faultstring)
    }

    pub fn conflict(faultstring: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, faultstring)
    }

    /// Ironic's `NotAcceptable` (406): a field or parameter of a later microversion than the request's.
    pub fn not_acceptable() -> ApiError {
        ApiError::new(StatusCode::NOT_ACCEPTABLE, "Request not acceptable.")
    }

    /// The 404 of a path Ironic does not serve (at the request's microversion).
    pub fn resource_not_found() -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "The resource could not be found.")
    }

    pub fn node_not_found(ident: &str) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, FakeError::NodeNotFound(ident.to_owned()).to_string())
    }

    pub fn port_not_found(ident: &str) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, FakeError::PortNotFound(ident.to_owned()).to_string())
    }

    /// Ironic's `NodeLocked` (409).
    pub fn node_locked(ident: &str) -> ApiError {
        ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "Node {ident} is locked by host fake-conductor, please retry after the current operation is \
                 completed."
            ),
        )
    }

    /// Ironic's `NoFreeConductorWorker` (503).
    pub fn service_unavailable() -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "Requested action cannot be performed due to lack of free conductor workers.",
        )
    }

    /// The JSON body Ironic sends with this error.
    pub fn body(&self) -> serde_json::Value {
        let faultcode = if self.status.is_server_error() { "Server" } else { "Client" };
        let inner = json!({"faultstring": self.faultstring, "faultcode": faultcode, "debuginfo": null});
        json!({"error_message": inner.to_string()})
    }
}

impl From<FakeError> for ApiError {
    fn from(e: FakeError) -> ApiError {
        let status = match &e {
            FakeError::NodeNotFound(_) | FakeError::PortNotFound(_) => StatusCode::NOT_FOUND,
            FakeError::DuplicateAddress(_) | FakeError::DuplicatePort(_) => StatusCode::CONFLICT,
            FakeError::InvalidMac(_) => StatusCode::BAD_REQUEST,
            FakeError::Bind { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, axum::Json(self.body())).into_response();
        resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_is_ironic_format() {
        let body = ApiError::node_not_found("n1").body();
        let inner: serde_json::Value = serde_json::from_str(body["error_message"].as_str().unwrap()).unwrap();
        assert_eq!(inner["faultstring"], "Node n1 could not be found.");
        assert_eq!(inner["faultcode"], "Client");
        assert!(inner["debuginfo"].is_null());
        assert_eq!(
            ApiError::service_unavailable().body()["error_message"].as_str().map(|s| s.contains("Server")),
            Some(true)
        );
    }
}
