//! Prometheus metrics of the driver: RPC counts and latencies by method and code, pool capacity
//! gauges and KubeVirt's `kubevirt_hpp_pool_path_shared_with_os`. Registered into a
//! caller-supplied `prometheus_client` registry so an embedder serves them wherever it likes.
//!
//! As in every hpp crate: a sub-registry per prefix (`hpp` for the driver's own metrics,
//! `kubevirt_hpp` for KubeVirt's names), counters named without `_total`, typed label sets.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use std::sync::OnceLock;

use crate::pool::PoolHealth;
use crate::service::rpc_layer::{RPCS, known_rpc};

/// Labels of the RPC metrics. Static strings: recording a call allocates nothing (every
/// value comes from the bounded sets of CSI method names and gRPC codes).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RpcLabels {
    /// CSI service (`Identity`, `Controller`, `Node`).
    pub service: &'static str,
    /// RPC name (`CreateVolume`, ...).
    pub method: &'static str,
    /// gRPC status code name (`Ok`, `NotFound`, ...).
    pub code: &'static str,
}

/// The name of a gRPC code as the metrics label it (`Ok`, `NotFound`, ...).
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "Ok",
        Code::Cancelled => "Cancelled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

/// Labels of the pool metrics.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    /// Pool name.
    pub pool: String,
}

/// What a pool that enforces volume sizes has promised and can still promise, in bytes (the
/// capacity ledger's budget), for its gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolPromises {
    /// Sum of the sizes of the pool's volumes (and of creations and expansions in flight).
    pub promised: u64,
    /// Filesystem size × overcommit percent / 100.
    pub promisable: u64,
    /// What GetCapacity answers: the smaller of the free bytes and what is left to promise.
    pub available: u64,
}

/// Labels of the pool quota metric: which backend enforces sizes (`auto` shows what it chose).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QuotaLabels {
    /// Pool name.
    pub pool: String,
    /// The backend in use (`none`, `btrfs`, `xfs-project`, `ext4-project`, `image`).
    pub backend: String,
}

/// Labels of the trash purge counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PurgeLabels {
    /// Pool name.
    pub pool: String,
    /// Why: `age`, `space` or `admin`.
    pub reason: &'static str,
}

/// The prefix of the driver's own metrics (`hpp_csi_*`, `hpp_pool_*`).
pub const PREFIX: &str = "hpp";
/// The prefix of the metrics that keep KubeVirt's names.
pub const KUBEVIRT_PREFIX: &str = "kubevirt_hpp";

fn latency_histogram() -> Histogram {
    // 100 µs .. ~3.3 s
    Histogram::new(exponential_buckets(0.0001, 2.0, 16))
}

/// Every metric the driver updates.
#[derive(Debug)]
pub struct DriverMetrics {
    rpc_requests: Family<RpcLabels, Counter>,
    rpc_duration: Family<RpcLabels, Histogram, fn() -> Histogram>,
    pool_capacity: Family<PoolLabels, Gauge>,
    pool_available: Family<PoolLabels, Gauge>,
    pool_free: Family<PoolLabels, Gauge>,
    pool_promised: Family<PoolLabels, Gauge>,
    pool_promisable: Family<PoolLabels, Gauge>,
    pool_usable: Family<PoolLabels, Gauge>,
    pool_shared: Family<PoolLabels, Gauge>,
    pool_quota: Family<QuotaLabels, Gauge>,
    pool_journal: Family<PoolLabels, Gauge>,
    pool_journal_flushes: Family<PoolLabels, Counter>,
    pool_journal_records: Family<PoolLabels, Counter>,
    trash_entries: Family<PoolLabels, Gauge>,
    trash_bytes: Family<PoolLabels, Gauge>,
    trash_purged: Family<PurgeLabels, Counter>,
    shared_with_os: Gauge,
    /// The series of each known RPC by gRPC code ([`rpc_series_slot`]), taken from the families
    /// on its first call: a call then updates its counter and histogram without hashing labels
    /// or locking the families.
    rpc_series: Box<[OnceLock<(Counter, Histogram)>]>,
}

/// gRPC status codes (`Ok` = 0 .. `Unauthenticated` = 16).
const GRPC_CODES: usize = 17;

/// The slot of RPC `rpc` (an index into [`RPCS`]) answered with `code`.
fn rpc_series_slot(rpc: usize, code: tonic::Code) -> usize {
    let code = usize::try_from(code as i32).unwrap_or(0).min(GRPC_CODES - 1);
    rpc * GRPC_CODES + code
}

impl DriverMetrics {
    /// Creates the metrics and registers them in `registry` under [`PREFIX`] and
    /// [`KUBEVIRT_PREFIX`].
    pub fn register(registry: &mut Registry) -> Self {
        let m = DriverMetrics {
            rpc_requests: Family::default(),
            rpc_duration: Family::new_with_constructor(latency_histogram),
            pool_capacity: Family::default(),
            pool_available: Family::default(),
            pool_free: Family::default(),
            pool_promised: Family::default(),
            pool_promisable: Family::default(),
            pool_usable: Family::default(),
            pool_shared: Family::default(),
            pool_quota: Family::default(),
            pool_journal: Family::default(),
            pool_journal_flushes: Family::default(),
            pool_journal_records: Family::default(),
            trash_entries: Family::default(),
            trash_bytes: Family::default(),
            trash_purged: Family::default(),
            shared_with_os: Gauge::default(),
            rpc_series: (0..RPCS.len() * GRPC_CODES).map(|_| OnceLock::new()).collect(),
        };
        let r = registry.sub_registry_with_prefix(PREFIX);
        r.register(
            "csi_rpc_requests",
            "CSI RPCs served, by service, method and gRPC code",
            m.rpc_requests.clone(),
        );
        r.register(
            "csi_rpc_duration_seconds",
            "CSI RPC latency, by service, method and gRPC code",
            m.rpc_duration.clone(),
        );
        r.register(
            "pool_capacity_bytes",
            "Size of the filesystem holding the pool (0 while the pool is unusable)",
            m.pool_capacity.clone(),
        );
        r.register(
            "pool_available_bytes",
            "What GetCapacity answers for the pool: bytes new volumes can still get (with a quota \
             backend, the smaller of the free bytes and what is left to promise); 0 while the pool is unusable",
            m.pool_available.clone(),
        );
        r.register(
            "pool_free_bytes",
            "Bytes free on the filesystem holding the pool, for unprivileged writers (0 while the pool is unusable)",
            m.pool_free.clone(),
        );
        r.register(
            "pool_promised_bytes",
            "Sum of the sizes of the pool's volumes, including creations and expansions in flight \
             (pools with a quota backend only; 0 while the pool is unusable)",
            m.pool_promised.clone(),
        );
        r.register(
            "pool_promisable_bytes",
            "Bytes the pool may promise to volumes in all: filesystem size × overcommitPercent / 100 \
             (pools with a quota backend only; 0 while the pool is unusable)",
            m.pool_promisable.clone(),
        );
        r.register(
            "pool_usable",
            "1 when the pool can serve volumes (exists, mount guard satisfied), else 0",
            m.pool_usable.clone(),
        );
        r.register(
            "pool_path_shared_with_os",
            "1 when the pool lives on the same device as the OS disk",
            m.pool_shared.clone(),
        );
        r.register(
            "pool_quota_backend",
            "1 for the quota backend that enforces volume sizes in the pool (what quota auto chose)",
            m.pool_quota.clone(),
        );
        r.register(
            "pool_journal",
            "1 when creates and deletes in the pool are made durable through its volume journal, \
             0 when through syncs of the pool directory (shared pool, journal not made or not opened yet)",
            m.pool_journal.clone(),
        );
        r.register(
            "pool_journal_flushes",
            "Flushes (fdatasync) of the pool's volume journal; concurrent creates and deletes share one",
            m.pool_journal_flushes.clone(),
        );
        r.register(
            "pool_journal_records",
            "Create and delete records the pool's volume journal made durable (over flushes: requests per flush)",
            m.pool_journal_records.clone(),
        );
        r.register(
            "pool_trash_entries",
            "Deleted volumes kept in the pool's trash (pools with a trash retention only)",
            m.trash_entries.clone(),
        );
        r.register(
            "pool_trash_bytes",
            "Bytes held by the deleted volumes in the pool's trash, as measured so far; still used on the filesystem",
            m.trash_bytes.clone(),
        );
        r.register(
            "pool_trash_purged",
            "Trash entries removed, by reason: age (retention over), space (free space under the floor), admin",
            m.trash_purged.clone(),
        );
        registry.sub_registry_with_prefix(KUBEVIRT_PREFIX).register(
            "pool_path_shared_with_os",
            "Whether any hostpath provisioner pool shares a device with the OS (1) or not (0)",
            m.shared_with_os.clone(),
        );
        m
    }

    /// Records one finished RPC.
    pub fn observe_rpc(&self, service: &'static str, method: &'static str, code: tonic::Code, seconds: f64) {
        let labels = || RpcLabels {
            service,
            method,
            code: code_name(code),
        };
        let known = known_rpc(service, method).and_then(|i| self.rpc_series.get(rpc_series_slot(i, code)));
        match known {
            Some(slot) => {
                let (requests, duration) = slot.get_or_init(|| {
                    let labels = labels();
                    let requests = self.rpc_requests.get_or_create(&labels).clone();
                    let duration = self.rpc_duration.get_or_create(&labels).clone();
                    (requests, duration)
                });
                requests.inc();
                duration.observe(seconds);
            }
            None => {
                let labels = labels();
                self.rpc_requests.get_or_create(&labels).inc();
                self.rpc_duration.get_or_create(&labels).observe(seconds);
            }
        }
    }

    /// Publishes the health of one pool, and for a pool that enforces sizes its promises
    /// (`available` then comes from them, as GetCapacity answers).
    pub fn set_pool(&self, pool: &str, health: &PoolHealth, shared_with_os: bool, promises: Option<PoolPromises>) {
        let l = PoolLabels { pool: pool.to_owned() };
        let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let usable = |v: u64| if health.usable { clamp(v) } else { 0 };
        self.pool_capacity.get_or_create(&l).set(clamp(health.total_bytes));
        self.pool_free.get_or_create(&l).set(usable(health.available_bytes));
        let available = match promises {
            Some(p) => p.available,
            None => health.available_bytes,
        };
        self.pool_available.get_or_create(&l).set(usable(available));
        if let Some(p) = promises {
            self.pool_promised.get_or_create(&l).set(usable(p.promised));
            self.pool_promisable.get_or_create(&l).set(usable(p.promisable));
        }
        self.pool_usable.get_or_create(&l).set(i64::from(health.usable));
        self.pool_shared.get_or_create(&l).set(i64::from(shared_with_os));
    }

    /// Publishes which backend enforces sizes in `pool`.
    pub fn set_quota_backend(&self, pool: &str, backend: &str) {
        let l = QuotaLabels {
            pool: pool.to_owned(),
            backend: backend.to_owned(),
        };
        self.pool_quota.get_or_create(&l).set(1);
    }

    /// Publishes whether `pool` makes creates and deletes durable through its volume journal.
    pub fn set_journal(&self, pool: &str, in_use: bool) {
        let l = PoolLabels { pool: pool.to_owned() };
        self.pool_journal.get_or_create(&l).set(i64::from(in_use));
    }

    /// Publishes the volume journal's counters for `pool` (totals since the start; the
    /// counters only move forward).
    pub fn set_journal_counts(&self, pool: &str, flushes: u64, records: u64) {
        let l = PoolLabels { pool: pool.to_owned() };
        for (counter, total) in [
            (&self.pool_journal_flushes, flushes),
            (&self.pool_journal_records, records),
        ] {
            let counter = counter.get_or_create(&l);
            let seen = counter.get();
            if total > seen {
                counter.inc_by(total - seen);
            }
        }
    }

    /// Publishes the size of `pool`'s trash.
    pub fn set_trash(&self, pool: &str, totals: crate::ops::trash::TrashTotals) {
        let l = PoolLabels { pool: pool.to_owned() };
        let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.trash_entries.get_or_create(&l).set(clamp(totals.entries));
        self.trash_bytes.get_or_create(&l).set(clamp(totals.bytes));
    }

    /// Counts one trash entry purged from `pool`.
    pub fn trash_purged(&self, pool: &str, reason: crate::ops::trash::PurgeReason) {
        let l = PurgeLabels {
            pool: pool.to_owned(),
            reason: reason.as_str(),
        };
        self.trash_purged.get_or_create(&l).inc();
    }

    /// Sets KubeVirt's aggregate gauge.
    pub fn set_shared_with_os(&self, any: bool) {
        self.shared_with_os.set(i64::from(any));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn code_names_are_the_debug_names_the_metrics_always_had() {
        for i in 0..=16 {
            let code = tonic::Code::from(i);
            assert_eq!(code_name(code), format!("{code:?}"));
        }
    }

    /// A known RPC's calls go through its cached series, which are the families' own: every
    /// call is exported, by code; labels outside the known set still count.
    #[test]
    fn cached_rpc_series_are_the_exported_ones() {
        let mut registry = Registry::default();
        let m = DriverMetrics::register(&mut registry);
        for _ in 0..3 {
            m.observe_rpc("Controller", "CreateVolume", tonic::Code::Ok, 0.001);
        }
        m.observe_rpc("Controller", "CreateVolume", tonic::Code::Unauthenticated, 0.001);
        m.observe_rpc("Node", "CreateVolume", tonic::Code::Ok, 0.001);
        m.observe_rpc("unknown", "unknown", tonic::Code::Unimplemented, 0.001);
        assert_exports(
            &registry,
            &[
                "hpp_csi_rpc_requests_total{service=\"Controller\",method=\"CreateVolume\",code=\"Ok\"} 3",
                "hpp_csi_rpc_duration_seconds_count{service=\"Controller\",method=\"CreateVolume\",code=\"Ok\"} 3",
                "hpp_csi_rpc_requests_total{service=\"Controller\",method=\"CreateVolume\",code=\"Unauthenticated\"} 1",
                "hpp_csi_rpc_requests_total{service=\"Node\",method=\"CreateVolume\",code=\"Ok\"} 1",
                "hpp_csi_rpc_requests_total{service=\"unknown\",method=\"unknown\",code=\"Unimplemented\"} 1",
            ],
        );
    }

    /// The exported names are KubeVirt's and the documented ones, whatever the sub-registries.
    #[test]
    fn exported_names_are_unchanged() {
        let mut registry = Registry::default();
        let m = DriverMetrics::register(&mut registry);
        m.observe_rpc("Controller", "CreateVolume", tonic::Code::Ok, 0.001);
        m.set_pool("local", &PoolHealth::default(), true, None);
        let usable = PoolHealth {
            usable: true,
            total_bytes: 1000,
            available_bytes: 700,
            ..PoolHealth::default()
        };
        let promises = PoolPromises {
            promised: 1500,
            promisable: 1500,
            available: 0,
        };
        m.set_pool("sized", &usable, false, Some(promises));
        m.set_shared_with_os(true);
        m.set_quota_backend("local", "btrfs");
        m.set_journal("local", true);
        m.set_journal_counts("local", 3, 10);
        m.set_journal_counts("local", 5, 12);
        m.set_journal_counts("local", 4, 11);
        assert_exports(
            &registry,
            &[
                "hpp_csi_rpc_requests_total{service=\"Controller\",method=\"CreateVolume\",code=\"Ok\"} 1",
                "hpp_csi_rpc_duration_seconds_count{service=\"Controller\",method=\"CreateVolume\",code=\"Ok\"} 1",
                "hpp_pool_capacity_bytes{pool=\"local\"} 0",
                "hpp_pool_available_bytes{pool=\"local\"} 0",
                "hpp_pool_free_bytes{pool=\"local\"} 0",
                // A fully promised pool: nothing available, though bytes are free.
                "hpp_pool_available_bytes{pool=\"sized\"} 0",
                "hpp_pool_free_bytes{pool=\"sized\"} 700",
                "hpp_pool_promised_bytes{pool=\"sized\"} 1500",
                "hpp_pool_promisable_bytes{pool=\"sized\"} 1500",
                "hpp_pool_usable{pool=\"local\"} 0",
                "hpp_pool_path_shared_with_os{pool=\"local\"} 1",
                "kubevirt_hpp_pool_path_shared_with_os 1",
                "hpp_pool_quota_backend{pool=\"local\",backend=\"btrfs\"} 1",
                "hpp_pool_journal{pool=\"local\"} 1",
                "hpp_pool_journal_flushes_total{pool=\"local\"} 5",
                "hpp_pool_journal_records_total{pool=\"local\"} 12",
            ],
        );
    }

    /// Every one of `lines` is a line of `registry`'s text exposition.
    fn assert_exports(registry: &Registry, lines: &[&str]) {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        for line in lines {
            assert!(out.lines().any(|l| l == *line), "{line} missing from\n{out}");
        }
    }
}
