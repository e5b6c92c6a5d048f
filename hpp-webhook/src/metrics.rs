//! Prometheus metrics of the webhook. Label values come from small fixed sets.
//!
//! Registered as the workspace's other crates do: into a sub-registry (`webhook`, so the
//! exported names stay `webhook_*`), counters named without `_total`, typed label sets.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The prefix of the webhook's metrics.
pub const PREFIX: &str = "webhook";

/// Labels of a request: which endpoint and how it ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `validate` or `convert`.
    pub endpoint: &'static str,
    /// `allowed`, `denied`, `converted`, `failed` or `rejected`.
    pub result: &'static str,
}

/// Label of an endpoint.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabels {
    /// `validate` or `convert`.
    pub endpoint: &'static str,
}

/// Counters and timings, registered into the caller's registry.
#[derive(Clone, Debug)]
pub struct Metrics {
    requests: Family<RequestLabels, Counter>,
    durations: Family<EndpointLabels, Histogram>,
    handshake_failures: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            durations: Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.001, 2.0, 14))),
            handshake_failures: Counter::default(),
        }
    }
}

impl Metrics {
    /// Creates the metrics and registers them in `registry` under [`PREFIX`], as `webhook_*`
    /// (so `hpp_webhook_*` in a registry prefixed `hpp`).
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let r = registry.sub_registry_with_prefix(PREFIX);
        r.register(
            "requests",
            "Webhook requests by endpoint (validate, convert) and result (allowed, denied, converted, failed, rejected)",
            m.requests.clone(),
        );
        r.register(
            "request_duration_seconds",
            "Time to answer a webhook request",
            m.durations.clone(),
        );
        r.register(
            "tls_handshake_failures",
            "TLS handshakes that failed or timed out (wrong version, unknown CA, no certificate)",
            m.handshake_failures.clone(),
        );
        m
    }

    /// Counts one answered request.
    pub fn request(&self, endpoint: &'static str, result: &'static str, seconds: f64) {
        self.requests.get_or_create(&RequestLabels { endpoint, result }).inc();
        self.durations
            .get_or_create(&EndpointLabels { endpoint })
            .observe(seconds);
    }

    /// Counts one failed handshake.
    pub fn handshake_failed(&self) {
        self.handshake_failures.inc();
    }

    /// Requests counted so far for this endpoint and result (for tests and status pages).
    pub fn request_count(&self, endpoint: &'static str, result: &'static str) -> u64 {
        self.requests.get_or_create(&RequestLabels { endpoint, result }).get()
    }

    /// Handshake failures counted so far.
    pub fn handshake_failure_count(&self) -> u64 {
        self.handshake_failures.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_names() {
        let mut registry = Registry::with_prefix("hpp");
        let metrics = Metrics::register(&mut registry);
        metrics.request("validate", "denied", 0.01);
        metrics.handshake_failed();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"hpp_webhook_requests_total{endpoint="validate",result="denied"} 1"#),
            "{text}"
        );
        assert!(text.contains("hpp_webhook_tls_handshake_failures_total 1"), "{text}");
        assert!(text.contains("hpp_webhook_request_duration_seconds_bucket"), "{text}");
    }
}
