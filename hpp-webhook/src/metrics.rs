//! Prometheus metrics of the webhook. Label values come from small fixed sets.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of a request: which endpoint and how it ended.
pub type RequestLabels = [(&'static str, &'static str); 2];

/// Counters and timings, registered into the caller's registry.
#[derive(Clone, Debug)]
pub struct Metrics {
    requests: Family<RequestLabels, Counter>,
    durations: Family<[(&'static str, &'static str); 1], Histogram>,
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
    /// Creates the metrics and registers them in `registry` as `webhook_*` (so `hpp_webhook_*`
    /// in a registry prefixed `hpp`).
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "webhook_requests",
            "Webhook requests by endpoint (validate, convert) and result (allowed, denied, converted, failed, rejected)",
            m.requests.clone(),
        );
        registry.register(
            "webhook_request_duration_seconds",
            "Time to answer a webhook request",
            m.durations.clone(),
        );
        registry.register(
            "webhook_tls_handshake_failures",
            "TLS handshakes that failed or timed out (wrong version, unknown CA, no certificate)",
            m.handshake_failures.clone(),
        );
        m
    }

    /// Counts one answered request.
    pub fn request(&self, endpoint: &'static str, result: &'static str, seconds: f64) {
        self.requests
            .get_or_create(&[("endpoint", endpoint), ("result", result)])
            .inc();
        self.durations.get_or_create(&[("endpoint", endpoint)]).observe(seconds);
    }

    /// Counts one failed handshake.
    pub fn handshake_failed(&self) {
        self.handshake_failures.inc();
    }

    /// Requests counted so far for this endpoint and result (for tests and status pages).
    pub fn request_count(&self, endpoint: &'static str, result: &'static str) -> u64 {
        self.requests
            .get_or_create(&[("endpoint", endpoint), ("result", result)])
            .get()
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
