//! Prometheus metrics of the driver: RPC counts and latencies by method and code, pool capacity
//! gauges and KubeVirt's `kubevirt_hpp_pool_path_shared_with_os`. Registered into a
//! caller-supplied `prometheus_client` registry so an embedder serves them wherever it likes.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::pool::PoolHealth;

/// Labels of the RPC metrics.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RpcLabels {
    /// CSI service (`Identity`, `Controller`, `Node`).
    pub service: String,
    /// RPC name (`CreateVolume`, ...).
    pub method: String,
    /// gRPC status code name (`Ok`, `NotFound`, ...).
    pub code: String,
}

/// Labels of the pool metrics.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    /// Pool name.
    pub pool: String,
}

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
    pool_usable: Family<PoolLabels, Gauge>,
    pool_shared: Family<PoolLabels, Gauge>,
    shared_with_os: Gauge,
}

impl DriverMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = DriverMetrics {
            rpc_requests: Family::default(),
            rpc_duration: Family::new_with_constructor(latency_histogram),
            pool_capacity: Family::default(),
            pool_available: Family::default(),
            pool_usable: Family::default(),
            pool_shared: Family::default(),
            shared_with_os: Gauge::default(),
        };
        registry.register(
            "hpp_csi_rpc_requests",
            "CSI RPCs served, by service, method and gRPC code",
            m.rpc_requests.clone(),
        );
        registry.register(
            "hpp_csi_rpc_duration_seconds",
            "CSI RPC latency, by service, method and gRPC code",
            m.rpc_duration.clone(),
        );
        registry.register(
            "hpp_pool_capacity_bytes",
            "Size of the filesystem holding the pool (0 while the pool is unusable)",
            m.pool_capacity.clone(),
        );
        registry.register(
            "hpp_pool_available_bytes",
            "Bytes available for new data in the pool (0 while the pool is unusable)",
            m.pool_available.clone(),
        );
        registry.register(
            "hpp_pool_usable",
            "1 when the pool can serve volumes (exists, mount guard satisfied), else 0",
            m.pool_usable.clone(),
        );
        registry.register(
            "hpp_pool_path_shared_with_os",
            "1 when the pool lives on the same device as the OS disk",
            m.pool_shared.clone(),
        );
        registry.register(
            "kubevirt_hpp_pool_path_shared_with_os",
            "Whether any hostpath provisioner pool shares a device with the OS (1) or not (0)",
            m.shared_with_os.clone(),
        );
        m
    }

    /// Records one finished RPC.
    pub fn observe_rpc(&self, service: &str, method: &str, code: tonic::Code, seconds: f64) {
        let labels = RpcLabels {
            service: service.to_owned(),
            method: method.to_owned(),
            code: format!("{code:?}"),
        };
        self.rpc_requests.get_or_create(&labels).inc();
        self.rpc_duration.get_or_create(&labels).observe(seconds);
    }

    /// Publishes the health of one pool.
    pub fn set_pool(&self, pool: &str, health: &PoolHealth, shared_with_os: bool) {
        let l = PoolLabels { pool: pool.to_owned() };
        let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.pool_capacity.get_or_create(&l).set(clamp(health.total_bytes));
        self.pool_available.get_or_create(&l).set(clamp(health.available_bytes));
        self.pool_usable.get_or_create(&l).set(i64::from(health.usable));
        self.pool_shared.get_or_create(&l).set(i64::from(shared_with_os));
    }

    /// Sets KubeVirt's aggregate gauge.
    pub fn set_shared_with_os(&self, any: bool) {
        self.shared_with_os.set(i64::from(any));
    }
}
