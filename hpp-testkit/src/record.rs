//! What the fake remembers about every request, so tests can assert on API traffic
//! (for example "a steady-state reconcile issues zero writes").

use serde_json::Value;

use super::path::parse_query;

/// One request the fake received, in arrival order.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedRequest {
    /// HTTP method (`GET`, `POST`, `PUT`, `PATCH`, `DELETE`).
    pub method: http::Method,
    /// Path without the query, e.g. `/apis/apps/v1/namespaces/ns/daemonsets/x`.
    pub path: String,
    /// Raw query string (without `?`), e.g. `fieldManager=hpp&force=true`.
    pub query: String,
    /// The `Content-Type` header, e.g. `application/apply-patch+yaml`.
    pub content_type: Option<String>,
    /// The body parsed as JSON (or YAML for apply patches); `Value::Null` when empty.
    pub body: Value,
    /// HTTP status answered; 0 when the request failed at the connection level
    /// ([`FakeApiServer::set_unavailable`](super::FakeApiServer::set_unavailable)).
    pub status: u16,
}

impl RecordedRequest {
    /// A decoded query parameter, e.g. `req.query_param("fieldManager")`.
    pub fn query_param(&self, key: &str) -> Option<String> {
        parse_query(&self.query).remove(key)
    }

    /// Whether the request changes state (anything but GET/HEAD/OPTIONS).
    pub fn is_write(&self) -> bool {
        !matches!(
            self.method,
            http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
        )
    }

    /// Whether this is a watch (`GET ...?watch=true`).
    pub fn is_watch(&self) -> bool {
        self.method == http::Method::GET && self.query_param("watch").is_some_and(|w| w == "true" || w == "1")
    }
}
