//! `hpp_operator_allocator_bytes`: jemalloc's counters, read at each scrape, so an admin can
//! tell what the operator holds from what its allocator keeps around it (the resident memory
//! a `kubectl top` shows is both).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

/// The metric's name.
pub const NAME: &str = "hpp_operator_allocator_bytes";

/// Reads [`hpp_sys::malloc::jemalloc_stats`] at each scrape.
#[derive(Debug)]
struct AllocatorBytes;

impl Collector for AllocatorBytes {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(stats) = hpp_sys::malloc::jemalloc_stats() else {
            return Ok(());
        };
        let mut metric = encoder.encode_descriptor(
            NAME,
            "Bytes the operator's allocator (jemalloc) counts: allocated (held by the operator), \
             active (in pages holding allocations), metadata (the allocator's own), resident \
             (resident pages it maps, freed ones not yet handed back included)",
            None,
            MetricType::Gauge,
        )?;
        for (state, bytes) in [
            ("allocated", stats.allocated),
            ("active", stats.active),
            ("metadata", stats.metadata),
            ("resident", stats.resident),
        ] {
            let labels = [("state", state)];
            ConstGauge::new(i64::try_from(bytes).unwrap_or(i64::MAX)).encode(metric.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// Adds `hpp_operator_allocator_bytes{state}` to `registry`. The figures are jemalloc's: in a
/// process whose global allocator is another (a test, an embedder's executable) they count
/// next to nothing.
pub fn register(registry: &mut Registry) {
    registry.register_collector(Box::new(AllocatorBytes));
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn each_state_is_a_series() {
        let mut registry = Registry::default();
        register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for state in ["allocated", "active", "metadata", "resident"] {
            assert!(
                text.contains(&format!("{NAME}{{state=\"{state}\"}} ")),
                "{state} in:\n{text}"
            );
        }
    }
}
