//! Prometheus metrics of the provisioner; every label comes from a bounded set.
//!
//! As in every hpp crate: one sub-registry ([`PREFIX`]), counters named without `_total`,
//! typed label sets.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The prefix of the provisioner's metrics.
pub const PREFIX: &str = "hpp_provisioner";

/// Label of the mode.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabels {
    /// `kubevirt`, `single-node` or `shared`.
    pub mode: &'static str,
}

/// Label of a refusal.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// A [`crate::decision::RefusalReason`] name, or a fixed deletion reason.
    pub reason: &'static str,
}

/// Label of a deletion outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeleteLabels {
    /// `deleted`, `archived`, `trashed` or `missing`.
    pub action: &'static str,
}

/// Labels of an operation and its error category.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// `provision` or `delete`.
    pub operation: &'static str,
    /// [`crate::Error::category`].
    pub category: &'static str,
}

/// Label of an operation.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    /// `provision` or `delete`.
    pub operation: &'static str,
}

fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

/// The provisioner's metrics, registered under the [`PREFIX`] prefix.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// Volumes provisioned.
    pub provisioned: Family<ModeLabels, Counter>,
    /// Volumes whose directory was removed, archived or already gone.
    pub deleted: Family<DeleteLabels, Counter>,
    /// Claims refused, by reason.
    pub refused: Family<ReasonLabels, Counter>,
    /// Released volumes left alone because deleting them was unsafe.
    pub delete_refused: Counter,
    /// Failed attempts (retried).
    pub errors: Family<ErrorLabels, Counter>,
    /// Time taken by provision and delete operations that did something.
    pub duration_seconds: Family<OperationLabels, Histogram, fn() -> Histogram>,
    /// Trash entries purged, by reason (`age`, `space`).
    pub trash_purged: Family<ReasonLabels, Counter>,
}

impl Metrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Metrics {
            provisioned: Family::default(),
            deleted: Family::default(),
            refused: Family::default(),
            delete_refused: Counter::default(),
            errors: Family::default(),
            duration_seconds: Family::new_with_constructor(duration_histogram as fn() -> Histogram),
            trash_purged: Family::default(),
        };
        let r = registry.sub_registry_with_prefix(PREFIX);
        r.register("volumes_provisioned", "Volumes provisioned", m.provisioned.clone());
        r.register("volumes_deleted", "Released volumes cleaned up", m.deleted.clone());
        r.register("claims_refused", "Claims refused, by reason", m.refused.clone());
        r.register(
            "deletes_refused",
            "Released volumes left alone as unsafe to delete",
            m.delete_refused.clone(),
        );
        r.register("errors", "Failed provision or delete attempts", m.errors.clone());
        r.register(
            "operation_duration_seconds",
            "Duration of provision and delete operations",
            m.duration_seconds.clone(),
        );
        r.register(
            "trash_purged",
            "Trash entries removed, by reason: age (retention over), space (free space under the floor)",
            m.trash_purged.clone(),
        );
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_with_prefix() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        m.refused
            .get_or_create(&ReasonLabels {
                reason: "RequestTooLarge",
            })
            .inc();
        m.duration_seconds
            .get_or_create(&OperationLabels { operation: "provision" })
            .observe(0.01);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        assert!(
            out.contains("hpp_provisioner_claims_refused_total{reason=\"RequestTooLarge\"} 1"),
            "{out}"
        );
        assert!(out.contains("hpp_provisioner_operation_duration_seconds_count{operation=\"provision\"} 1"));
    }
}
