//! What a handler sends back: an HTTP status and a JSON body.

use http::StatusCode;
use kube::core::Status;
use serde_json::Value;

/// An HTTP response with a JSON body.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    /// HTTP status: 200 for every answered review, 4xx when the body is not a review at all.
    pub status: StatusCode,
    /// The JSON body (a review, or a `Status` for errors).
    pub body: Value,
}

impl Reply {
    /// 200 with a review body.
    pub fn ok(body: Value) -> Self {
        Self {
            status: StatusCode::OK,
            body,
        }
    }

    /// A `meta/v1` `Status` failure body: the request was not something we can answer.
    pub fn error(status: StatusCode, message: impl Into<String>) -> Self {
        let reason = match status {
            StatusCode::PAYLOAD_TOO_LARGE => "RequestEntityTooLarge",
            StatusCode::REQUEST_TIMEOUT | StatusCode::SERVICE_UNAVAILABLE => "Timeout",
            StatusCode::NOT_FOUND => "NotFound",
            s if s.is_server_error() => "InternalError",
            _ => "BadRequest",
        };
        let status_body = Status::failure(&message.into(), reason).with_code(status.as_u16());
        let mut body = serde_json::to_value(status_body).unwrap_or(Value::Null);
        if let Some(map) = body.as_object_mut() {
            map.insert("kind".into(), "Status".into());
            map.insert("apiVersion".into(), "v1".into());
        }
        Self { status, body }
    }

    /// 400 Bad Request.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::error(StatusCode::BAD_REQUEST, message)
    }
}
