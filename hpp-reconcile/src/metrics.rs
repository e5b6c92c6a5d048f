//! Operator metrics: `kubevirt_hpp_cr_ready` (KubeVirt's name, kept for its alert) plus
//! reconcile counts, durations and errors by bounded category.
//!
//! The workspace's metrics convention: each crate registers into a sub-registry of the
//! caller's registry (`sub_registry_with_prefix`), `hpp_operator` here, and KubeVirt's names
//! into a `kubevirt_hpp` sub-registry; names are `<noun>[_<unit>]` (counters without `_total`,
//! which the encoder adds); labels are typed `EncodeLabelSet` structs over bounded values.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The prefix of the operator's own metrics.
pub const PREFIX: &str = "hpp_operator";
/// The prefix of the metrics that keep KubeVirt's names.
pub const KUBEVIRT_PREFIX: &str = "kubevirt_hpp";

/// `kubevirt_hpp_cr_ready` before the first pass and after the CR is deleted: no CR to judge.
pub const CR_READY_UNKNOWN: i64 = -1;

/// Label of a reconcile pass.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `ok` or `error`.
    pub result: &'static str,
}

/// Label of a failed pass.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CategoryLabels {
    /// The error's bounded category (`conflict`, `api`, ...).
    pub category: &'static str,
}

/// Label of a per-StorageClass series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StorageClassLabels {
    /// StorageClass name.
    pub storageclass: String,
}

/// Label of a per-pool series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    /// Storage pool name.
    pub pool: String,
}

/// Label of the volume audit's node counts.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AuditResultLabels {
    /// `audited` (the driver answered) or `not_audited`.
    pub result: &'static str,
}

/// Label of a pass's scope.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScopeLabels {
    /// [`SCOPE_FULL`] or [`SCOPE_CHANGED`].
    pub scope: &'static str,
}

/// A pass over every step and part.
pub const SCOPE_FULL: &str = "full";
/// A pass over the parts whose objects changed (and every step not in parts).
pub const SCOPE_CHANGED: &str = "changed_parts";

/// Labels of a watch cache's series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CacheLabels {
    /// `group/Kind` (`core/Node` for the core group).
    pub kind: String,
    /// The label selector the watch uses (empty for every object).
    pub selector: String,
}

/// Handles to every operator metric.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// 1 when the CR is Available and neither Progressing nor Degraded, 0 otherwise, -1 before
    /// the first pass and after the CR is deleted.
    pub cr_ready: Gauge,
    /// Reconcile passes by result.
    pub reconciles: Family<ResultLabels, Counter>,
    /// Failed passes by error category.
    pub errors: Family<CategoryLabels, Counter>,
    /// Pass duration in seconds.
    pub duration: Histogram,
    /// Successful passes by scope: `full`, or `changed_parts` (only the parts whose objects
    /// changed were rendered).
    pub passes: Family<ScopeLabels, Counter>,
    /// 1 for every StorageClass of the driver whose `storagePool` names no configured pool
    /// (no series for classes that are fine).
    pub storageclass_unknown_pool: Family<StorageClassLabels, Gauge>,
    /// Claims released (PVC and PV deleted) after a node loss, by StorageClass.
    pub node_loss_claims_released: Family<StorageClassLabels, Counter>,
    /// Orphaned volumes found by the last volume audit, by pool (no series while it is off).
    pub orphaned_volumes: Family<PoolLabels, Gauge>,
    /// Bytes the orphaned volumes use, by pool.
    pub orphaned_volume_bytes: Family<PoolLabels, Gauge>,
    /// Bound PersistentVolumes whose directory the last audit found missing, by pool.
    pub missing_volumes: Family<PoolLabels, Gauge>,
    /// Nodes the last audit judged (`audited`) or could not ask (`not_audited`).
    pub volume_audit_nodes: Family<AuditResultLabels, Gauge>,
    /// Objects in each watch cache.
    pub cache_objects: Family<CacheLabels, Gauge>,
    /// JSON bytes of the objects in each watch cache (what they take in memory, give or take
    /// the map's overhead).
    pub cache_bytes: Family<CacheLabels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        let cr_ready = Gauge::default();
        cr_ready.set(CR_READY_UNKNOWN);
        Metrics {
            cr_ready,
            reconciles: Family::default(),
            errors: Family::default(),
            duration: Histogram::new(exponential_buckets(0.005, 2.0, 14)),
            passes: Family::default(),
            storageclass_unknown_pool: Family::default(),
            node_loss_claims_released: Family::default(),
            orphaned_volumes: Family::default(),
            orphaned_volume_bytes: Family::default(),
            missing_volumes: Family::default(),
            volume_audit_nodes: Family::default(),
            cache_objects: Family::default(),
            cache_bytes: Family::default(),
        }
    }
}

impl Metrics {
    /// Creates the metrics and registers them under [`PREFIX`] and [`KUBEVIRT_PREFIX`].
    pub fn register(registry: &mut Registry) -> Self {
        let m = Metrics::default();
        registry.sub_registry_with_prefix(KUBEVIRT_PREFIX).register(
            "cr_ready",
            "HPP CR ready (1), not ready (0), unknown (-1)",
            m.cr_ready.clone(),
        );
        registry.sub_registry_with_prefix(KUBEVIRT_PREFIX).register(
            "storageclass_unknown_pool",
            "StorageClass of the driver whose storagePool names no configured pool (1); fixed classes have no series",
            m.storageclass_unknown_pool.clone(),
        );
        registry.sub_registry_with_prefix(KUBEVIRT_PREFIX).register(
            "node_loss_claims_released",
            "Claims released (PVC and PV deleted) after their node was lost, by StorageClass (nodeLossPolicy Recreate)",
            m.node_loss_claims_released.clone(),
        );
        let kubevirt = registry.sub_registry_with_prefix(KUBEVIRT_PREFIX);
        kubevirt.register(
            "orphaned_volumes",
            "Volumes no PersistentVolume refers to, found by the last volume audit (spec.volumeAudit), by pool",
            m.orphaned_volumes.clone(),
        );
        kubevirt.register(
            "orphaned_volume_bytes",
            "Bytes the orphaned volumes use (as measured by their nodes, at most 64 volumes per node and audit), by pool",
            m.orphaned_volume_bytes.clone(),
        );
        kubevirt.register(
            "missing_volumes",
            "Bound PersistentVolumes whose directory the last volume audit found missing on their node, by pool",
            m.missing_volumes.clone(),
        );
        kubevirt.register(
            "volume_audit_nodes",
            "Nodes whose driver answered the last volume audit (audited) or did not (not_audited)",
            m.volume_audit_nodes.clone(),
        );
        let r = registry.sub_registry_with_prefix(PREFIX);
        r.register("reconcile", "Reconcile passes by result", m.reconciles.clone());
        r.register(
            "reconcile_errors",
            "Failed reconcile passes by error category",
            m.errors.clone(),
        );
        r.register(
            "reconcile_duration_seconds",
            "Reconcile pass duration",
            m.duration.clone(),
        );
        r.register(
            "passes",
            "Successful pipeline passes by scope: full, or changed_parts (only the parts whose objects changed)",
            m.passes.clone(),
        );
        r.register(
            "cache_objects",
            "Objects held by the watch cache of a kind and label selector",
            m.cache_objects.clone(),
        );
        r.register(
            "cache_bytes",
            "JSON bytes of the objects held by the watch cache of a kind and label selector",
            m.cache_bytes.clone(),
        );
        m
    }

    /// Sets the watch caches' sizes (`(kind, selector, objects, bytes)`, as
    /// [`Cache::sizes`](crate::Cache::sizes) reports them).
    pub fn set_cache_sizes(&self, sizes: &[(crate::Kind, String, usize, usize)]) {
        for (kind, selector, objects, bytes) in sizes {
            let group = if kind.group.is_empty() {
                "core"
            } else {
                kind.group.as_str()
            };
            let labels = CacheLabels {
                kind: format!("{group}/{}", kind.kind),
                selector: selector.clone(),
            };
            self.cache_objects
                .get_or_create(&labels)
                .set(i64::try_from(*objects).unwrap_or(i64::MAX));
            self.cache_bytes
                .get_or_create(&labels)
                .set(i64::try_from(*bytes).unwrap_or(i64::MAX));
        }
    }

    /// Replaces the `kubevirt_hpp_storageclass_unknown_pool` series with one per flagged class.
    pub fn set_unknown_pool_classes(&self, classes: &[String]) {
        self.storageclass_unknown_pool.clear();
        for storageclass in classes {
            self.storageclass_unknown_pool
                .get_or_create(&StorageClassLabels {
                    storageclass: storageclass.clone(),
                })
                .set(1);
        }
    }

    /// Counts one claim of `storageclass` released after a node loss.
    pub fn node_loss_claim_released(&self, storageclass: &str) {
        self.node_loss_claims_released
            .get_or_create(&StorageClassLabels {
                storageclass: storageclass.to_owned(),
            })
            .inc();
    }

    /// Replaces the volume audit's series with those of `report`; none while the audit is off.
    pub fn set_volume_audit(&self, report: Option<&crate::subreconciler::VolumeAuditReport>) {
        self.orphaned_volumes.clear();
        self.orphaned_volume_bytes.clear();
        self.missing_volumes.clear();
        self.volume_audit_nodes.clear();
        let Some(report) = report else { return };
        for (pool, found) in &report.pools {
            let labels = PoolLabels { pool: pool.clone() };
            self.orphaned_volumes.get_or_create(&labels).set(found.orphaned_volumes);
            self.orphaned_volume_bytes
                .get_or_create(&labels)
                .set(found.orphaned_bytes);
            self.missing_volumes.get_or_create(&labels).set(found.missing_volumes);
        }
        if report.status.last_audit_time.is_some() {
            for (result, n) in [
                ("audited", report.status.nodes_audited),
                ("not_audited", report.status.nodes_not_audited),
            ] {
                self.volume_audit_nodes
                    .get_or_create(&AuditResultLabels { result })
                    .set(n);
            }
        }
    }

    /// Records the scope of a successful pipeline pass.
    pub fn observe_scope(&self, scope: &'static str) {
        self.passes.get_or_create(&ScopeLabels { scope }).inc();
    }

    /// Records one pass.
    pub fn observe(&self, seconds: f64, error_category: Option<&'static str>) {
        self.duration.observe(seconds);
        let result = if error_category.is_some() { "error" } else { "ok" };
        self.reconciles.get_or_create(&ResultLabels { result }).inc();
        if let Some(category) = error_category {
            self.errors.get_or_create(&CategoryLabels { category }).inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_kubevirt_gauge_and_categories() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        m.observe(0.01, None);
        m.observe(0.02, Some("conflict"));
        m.node_loss_claim_released("hostpath-csi");
        m.node_loss_claim_released("hostpath-csi");
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        assert!(out.contains("kubevirt_hpp_cr_ready -1"), "{out}");
        assert!(
            out.contains("hpp_operator_reconcile_errors_total{category=\"conflict\"} 1"),
            "{out}"
        );
        assert!(out.contains("hpp_operator_reconcile_total{result=\"ok\"} 1"), "{out}");
        assert!(
            out.contains("kubevirt_hpp_node_loss_claims_released_total{storageclass=\"hostpath-csi\"} 2"),
            "{out}"
        );
        assert!(
            out.contains("# TYPE hpp_operator_reconcile_duration_seconds histogram"),
            "{out}"
        );
    }

    #[test]
    fn volume_audit_series_follow_the_last_report_and_go_with_it() {
        use hpp_api::v1beta1::{PoolVolumeAudit, VolumeAuditStatus};
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        let report = crate::subreconciler::VolumeAuditReport {
            status: VolumeAuditStatus {
                last_audit_time: Some("2025-06-01T10:00:00Z".into()),
                nodes_audited: 2,
                nodes_not_audited: 1,
                ..Default::default()
            },
            pools: [(
                "local".to_owned(),
                PoolVolumeAudit {
                    orphaned_volumes: 3,
                    orphaned_bytes: 4096,
                    missing_volumes: 1,
                    ..Default::default()
                },
            )]
            .into(),
        };
        m.set_volume_audit(Some(&report));
        let encode = |registry: &Registry| {
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
            out
        };
        let out = encode(&registry);
        for line in [
            "kubevirt_hpp_orphaned_volumes{pool=\"local\"} 3",
            "kubevirt_hpp_orphaned_volume_bytes{pool=\"local\"} 4096",
            "kubevirt_hpp_missing_volumes{pool=\"local\"} 1",
            "kubevirt_hpp_volume_audit_nodes{result=\"audited\"} 2",
            "kubevirt_hpp_volume_audit_nodes{result=\"not_audited\"} 1",
        ] {
            assert!(out.contains(line), "{line} in {out}");
        }
        m.set_volume_audit(None);
        let out = encode(&registry);
        assert!(!out.contains("pool=\"local\""), "{out}");
    }
}
