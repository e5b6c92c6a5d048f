//! Fault injection: make matching requests fail with a chosen HTTP status.

use super::error::ApiError;

/// A rule that makes matching requests fail with `status` (and a `Status` body whose reason
/// matches the code: 500 InternalError, 503 ServiceUnavailable, 409 Conflict, 403 Forbidden...).
///
/// ```
/// use hpp_testkit::FailureRule;
/// // The next two PATCHes of any DaemonSet fail with 503, then requests succeed again.
/// let rule = FailureRule::new(503).method(http::Method::PATCH).path_contains("/daemonsets/").times(2);
/// # let _ = rule;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureRule {
    /// Only requests with this method fail (any method when `None`).
    pub method: Option<http::Method>,
    /// Only requests whose path contains this substring fail (any path when `None`).
    pub path_contains: Option<String>,
    /// Only requests whose query contains this substring fail, e.g. `watch=true`.
    pub query_contains: Option<String>,
    /// HTTP status to answer with; 0 fails at the connection level instead (the client sees
    /// `kube::Error::Service`, as when the server is unreachable).
    pub status: u16,
    /// How many matching requests fail before the rule expires; `None` = until cleared.
    pub times: Option<usize>,
}

impl FailureRule {
    /// A rule failing every request with `status` until cleared; narrow it with the builders.
    pub fn new(status: u16) -> Self {
        Self {
            method: None,
            path_contains: None,
            query_contains: None,
            status,
            times: None,
        }
    }

    /// A rule failing matching requests at the connection level (no HTTP response at all).
    pub fn disconnect() -> Self {
        Self::new(0)
    }

    /// Restricts the rule to one HTTP method.
    pub fn method(mut self, method: http::Method) -> Self {
        self.method = Some(method);
        self
    }

    /// Restricts the rule to paths containing `fragment` (e.g. `"/hostpathprovisioners/"`).
    pub fn path_contains(mut self, fragment: impl Into<String>) -> Self {
        self.path_contains = Some(fragment.into());
        self
    }

    /// Restricts the rule to queries containing `fragment` (e.g. `"watch=true"`).
    pub fn query_contains(mut self, fragment: impl Into<String>) -> Self {
        self.query_contains = Some(fragment.into());
        self
    }

    /// Expires the rule after `n` failed requests.
    pub fn times(mut self, n: usize) -> Self {
        self.times = Some(n);
        self
    }

    fn matches(&self, method: &http::Method, path: &str, query: &str) -> bool {
        self.method.as_ref().is_none_or(|m| m == method)
            && self.path_contains.as_deref().is_none_or(|p| path.contains(p))
            && self.query_contains.as_deref().is_none_or(|q| query.contains(q))
    }
}

/// A rule plus how many more requests it may fail.
#[derive(Debug, Clone)]
pub(crate) struct ActiveFailure {
    rule: FailureRule,
    remaining: Option<usize>,
}

impl From<FailureRule> for ActiveFailure {
    fn from(rule: FailureRule) -> Self {
        let remaining = rule.times;
        Self { rule, remaining }
    }
}

/// The error the first matching rule injects, consuming one use of it.
pub(crate) fn injected(
    rules: &mut Vec<ActiveFailure>,
    method: &http::Method,
    path: &str,
    query: &str,
) -> Option<ApiError> {
    rules.retain(|r| r.remaining != Some(0));
    let idx = rules.iter().position(|r| r.rule.matches(method, path, query))?;
    let status = rules[idx].rule.status;
    if let Some(n) = rules[idx].remaining.as_mut() {
        *n -= 1;
        if *n == 0 {
            rules.remove(idx);
        }
    }
    Some(ApiError::from_code(
        status,
        format!("injected failure ({status}) for {method} {path}"),
    ))
}
