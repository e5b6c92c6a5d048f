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
    /// Creates the metrics and registers them under `registry` (prefix it, e.g. `hpp_webhook`).
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "requests",
            "Webhook requests by endpoint (validate, convert) and result (allowed, denied, converted, failed, rejected)",
            m.requests.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time to answer a webhook request",
            m.durations.clone(),
        );
        registry.register(
            "tls_handshake_failures",
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
