//! State shared by the three services: identity, pools, in-flight guards and metrics.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use hpp_api::constants::{DEFAULT_POOL_NAME, PARAM_STORAGE_POOL, TOPOLOGY_KEY};

use crate::csi;
use crate::error::{Error, Result};
use crate::expand::ExpansionMode;
use crate::inflight::{Guard, InFlight};
use crate::ledger::Ledger;
use crate::metrics::DriverMetrics;
use crate::mountinfo::MountTable;
use crate::pool::{Pool, PoolHealth};

/// Everything a request handler needs. Shared behind an `Arc` by the services.
#[derive(Debug)]
pub struct DriverState {
    /// CSI driver name.
    pub name: String,
    /// Vendor version reported by GetPluginInfo.
    pub version: String,
    /// This node's id (the Kubernetes node name).
    pub node_id: String,
    /// Configured pools, in configuration order.
    pub pools: Vec<Pool>,
    /// Objects with an operation in flight.
    pub inflight: InFlight,
    /// Metrics, when the embedder asked for them.
    pub metrics: Option<Arc<DriverMetrics>>,
    /// A path on the OS disk, to detect pools that share its device.
    pub os_reference: PathBuf,
    /// What enforcing pools promised: sizes in flight and a memo of the volumes on disk.
    pub ledger: Ledger,
    /// Which service raises limits (see [`ExpansionMode`]).
    pub expansion: ExpansionMode,
}

/// Health of every pool, measured together.
#[derive(Debug, Clone)]
pub struct PoolsReport {
    /// Per pool, in configuration order: name, health, shares device with the OS.
    pub pools: Vec<(String, PoolHealth, bool)>,
}

impl PoolsReport {
    /// Whether every pool is usable.
    pub fn all_usable(&self) -> bool {
        self.pools.iter().all(|(_, h, _)| h.usable)
    }
}

impl DriverState {
    /// The pool named `name`.
    pub fn pool(&self, name: &str) -> Result<&Pool> {
        self.pools.iter().find(|p| p.name == name).ok_or_else(|| {
            let known: Vec<&str> = self.pools.iter().map(|p| p.name.as_str()).collect();
            Error::NotFound(format!(
                "storage pool {name:?} is not configured on node {} (configured: {})",
                self.node_id,
                known.join(", ")
            ))
        })
    }

    /// The pool a StorageClass (or volume context) selects: `storagePool`, or `legacy` when the
    /// key is absent (falling back to the first pool when no pool is called `legacy`).
    pub fn pool_for(&self, params: &HashMap<String, String>) -> Result<&Pool> {
        match params.get(PARAM_STORAGE_POOL) {
            Some(name) => self.pool(name),
            None => self.pool(DEFAULT_POOL_NAME).or_else(|e| self.pools.first().ok_or(e)),
        }
    }

    /// The topology segment of this node.
    pub fn topology(&self) -> csi::Topology {
        csi::Topology {
            segments: HashMap::from([(TOPOLOGY_KEY.to_owned(), self.node_id.clone())]),
        }
    }

    /// Measures every pool (blocking: statvfs and mountinfo) and updates the gauges.
    pub fn pools_report(&self) -> PoolsReport {
        let mounts = MountTable::read().unwrap_or_default();
        let pools: Vec<(String, PoolHealth, bool)> = self
            .pools
            .iter()
            .map(|p| {
                let h = p.health(&mounts);
                let shared = p.shares_device_with(&mounts, &self.os_reference);
                (p.name.clone(), h, shared)
            })
            .collect();
        if let Some(m) = &self.metrics {
            for (name, h, shared) in &pools {
                m.set_pool(name, h, *shared);
            }
            m.set_shared_with_os(pools.iter().any(|(_, _, s)| *s));
        }
        PoolsReport { pools }
    }
}

/// Runs blocking filesystem work off the async runtime.
pub async fn blocking<T, F>(f: F) -> Result<T>
where
    F: FnOnce() -> Result<T> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Internal(format!("blocking task failed: {e}")))?
}

/// Runs blocking work that owns the in-flight `guard`. The guard moves into the blocking task,
/// so it is released when the work ends, not when the request is dropped: a CO whose deadline
/// passed cancels only its wait, and its retry answers Aborted until the first attempt is done
/// instead of racing it.
pub async fn blocking_locked<T, F>(guard: Guard, f: F) -> Result<T>
where
    F: FnOnce() -> Result<T> + Send + 'static,
    T: Send + 'static,
{
    blocking(move || {
        let _guard = guard;
        f()
    })
    .await
}
