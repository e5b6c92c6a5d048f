//! API errors as the real server reports them: an HTTP code plus a `Status` body.

use serde_json::{Value, json};

use super::kinds::KindInfo;

/// A failed API call; rendered as a `kind: Status` body that kube parses into
/// `kube::Error::Api`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// Machine-readable reason (`NotFound`, `AlreadyExists`, `Conflict`, ...).
    pub reason: &'static str,
    /// Human-readable message in the real server's wording.
    pub message: String,
    /// (group, plural, name) the error is about, for `details`.
    pub details: Option<(String, String, String)>,
}

/// `plural.group` as the real server writes a group-resource in messages.
fn group_resource(kind: &KindInfo) -> String {
    if kind.ar.group.is_empty() {
        kind.ar.plural.clone()
    } else {
        format!("{}.{}", kind.ar.plural, kind.ar.group)
    }
}

impl ApiError {
    /// An error with the reason the real server uses for `code`.
    pub(crate) fn from_code(code: u16, message: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason_for(code),
            message: message.into(),
            details: None,
        }
    }

    fn about(mut self, kind: &KindInfo, name: &str) -> Self {
        self.details = Some((kind.ar.group.clone(), kind.ar.plural.clone(), name.to_string()));
        self
    }

    /// 404 for a named object.
    pub(crate) fn not_found(kind: &KindInfo, name: &str) -> Self {
        Self::from_code(404, format!("{} \"{name}\" not found", group_resource(kind))).about(kind, name)
    }

    /// 404 for a path the server does not serve.
    pub(crate) fn no_route() -> Self {
        Self::from_code(404, "the server could not find the requested resource")
    }

    /// 409 AlreadyExists on create.
    pub(crate) fn already_exists(kind: &KindInfo, name: &str) -> Self {
        Self::from_code(409, format!("{} \"{name}\" already exists", group_resource(kind)))
            .with_reason("AlreadyExists")
            .about(kind, name)
    }

    /// 409 Conflict for a stale resourceVersion or failed precondition.
    pub(crate) fn conflict(kind: &KindInfo, name: &str, why: &str) -> Self {
        Self::from_code(
            409,
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                group_resource(kind)
            ),
        )
        .about(kind, name)
    }

    /// 409 Conflict for a stale resourceVersion.
    pub(crate) fn stale(kind: &KindInfo, name: &str) -> Self {
        Self::conflict(
            kind,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 Invalid.
    pub(crate) fn invalid(kind: &KindInfo, name: &str, why: impl Into<String>) -> Self {
        Self::from_code(
            422,
            format!("{} \"{name}\" is invalid: {}", group_resource(kind), why.into()),
        )
        .about(kind, name)
    }

    /// 403 Forbidden, about (group, plural, name).
    pub(crate) fn forbidden(message: String, details: (String, String, String)) -> Self {
        let mut e = Self::from_code(403, message);
        e.details = Some(details);
        e
    }

    /// 400 BadRequest.
    pub(crate) fn bad_request(why: impl Into<String>) -> Self {
        Self::from_code(400, why)
    }

    fn with_reason(mut self, reason: &'static str) -> Self {
        self.reason = reason;
        self
    }

    /// The `Status` body.
    pub(crate) fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some((group, plural, name)) = &self.details {
            status["details"] = json!({"name": name, "group": group, "kind": plural});
        }
        status
    }
}

/// The `reason` the real server pairs with an HTTP code.
pub(crate) fn reason_for(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Expired",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    }
}
