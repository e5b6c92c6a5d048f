//! State shared by the three services: identity, pools, in-flight guards and metrics.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use hpp_api::constants::{DEFAULT_POOL_NAME, PARAM_STORAGE_POOL};

use crate::csi;
use crate::error::{Error, Result};
use crate::metrics::{DriverMetrics, PoolPromises};
use crate::mountinfo::MountTable;
use crate::ops::expand::ExpansionMode;
use crate::ops::ledger::{Budget, Ledger};
use crate::pool::inflight::InFlight;
use crate::pool::{Pool, PoolHealth};

/// Everything a request handler needs. Shared behind an `Arc` by the services.
#[derive(Debug)]
pub struct DriverState {
    /// CSI driver name.
    pub name: String,
    /// The topology key volumes carry (see [`crate::DriverBuilder::topology_key`]).
    pub topology_key: String,
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
    /// What the last report said per pool (usable, shares the OS device), so problems are logged
    /// once when they start and once when they end, however often Probe is called.
    pub(crate) last_seen: Mutex<HashMap<String, (bool, bool)>>,
    /// What enforcing pools promised: sizes in flight and a memo of the volumes on disk.
    pub ledger: Ledger,
    /// Which service raises limits (see [`ExpansionMode`]).
    pub expansion: ExpansionMode,
    /// How often pool health is measured when nothing changes.
    pub health_interval: std::time::Duration,
    /// When pool health was last measured.
    pub(crate) health: crate::service::health::HealthClock,
    /// The mount table, re-read only after it changed.
    pub(crate) mounts: hpp_fs::MountTableCache,
    /// ListVolumes' view of the pools, reused across pages.
    pub(crate) listings: crate::service::listing::Listings,
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

    /// The pools that cannot serve volumes, with the reason.
    pub fn unusable(&self) -> impl Iterator<Item = (&str, &str)> {
        self.pools
            .iter()
            .filter(|(_, h, _)| !h.usable)
            .map(|(n, h, _)| (n.as_str(), h.reason.as_deref().unwrap_or("unknown reason")))
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

    /// The current mount table: shared, and read again only after a mount changed.
    pub fn mount_table(&self) -> Result<Arc<MountTable>> {
        crate::pool::fsops::mount_table(&self.mounts)
    }

    /// The topology segment of this node.
    pub fn topology(&self) -> csi::Topology {
        csi::Topology {
            segments: HashMap::from([(self.topology_key.clone(), self.node_id.clone())]),
        }
    }

    /// Measures every pool (blocking: statvfs and mountinfo), updates the gauges and logs each
    /// pool whose state changed since the last report.
    pub fn pools_report(&self) -> PoolsReport {
        let mounts = self.mount_table().unwrap_or_default();
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
            for ((name, h, shared), pool) in pools.iter().zip(&self.pools) {
                m.set_pool(name, h, *shared, self.promises(pool, h));
            }
            for p in self.pools.iter() {
                m.set_quota_backend(&p.name, p.quota.name());
                m.set_journal(&p.name, p.journal_in_use());
                let counts = p.journal_stats();
                m.set_journal_counts(&p.name, counts.flushes, counts.records);
            }
            m.set_shared_with_os(pools.iter().any(|(_, _, s)| *s));
        }
        let report = PoolsReport { pools };
        self.log_transitions(&report);
        self.health.reported();
        report
    }

    /// What an enforcing pool has promised and can still promise, as GetCapacity reckons it
    /// (`None` for a pool that enforces nothing). Blocking: may read every volume's record
    /// (usually answered from the ledger's memo).
    fn promises(&self, pool: &Pool, health: &PoolHealth) -> Option<PoolPromises> {
        if !pool.quota.enforces() {
            return None;
        }
        if !health.usable {
            return Some(PoolPromises::default());
        }
        match self.ledger.budget(pool, health) {
            Ok(budget) => Some(promises_of(&budget)),
            Err(e) => {
                tracing::debug!(pool = %pool.name, error = %e, "cannot read the pool's promises for its gauges");
                Some(PoolPromises::default())
            }
        }
    }

    /// Logs a pool when it becomes unusable (warning, with the reason) or usable again, and when
    /// it starts sharing the OS device: once per change, not once per Probe.
    fn log_transitions(&self, report: &PoolsReport) {
        let mut last = self.last_seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for change in changes(&mut last, report) {
            match change {
                PoolChange::Unusable { pool, reason } => {
                    tracing::warn!(%pool, %reason, "storage pool is not usable; the other pools keep serving")
                }
                PoolChange::Usable {
                    pool,
                    available_bytes,
                    total_bytes,
                } => tracing::info!(%pool, available_bytes, total_bytes, "storage pool is usable"),
                PoolChange::SharesOsDevice { pool } => {
                    tracing::warn!(%pool, "storage pool shares a device with the OS disk")
                }
            }
        }
    }
}

/// The gauges' view of a pool's budget; `available` is what GetCapacity answers.
pub(crate) fn promises_of(budget: &Budget) -> PoolPromises {
    PoolPromises {
        promised: budget.committed,
        promisable: budget.promisable,
        available: budget.available(),
    }
}

/// A change in a pool's state worth one log line.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PoolChange {
    /// The pool stopped (or started out) being usable.
    Unusable { pool: String, reason: String },
    /// The pool is usable (again, or from the start).
    Usable {
        pool: String,
        available_bytes: u64,
        total_bytes: u64,
    },
    /// The pool now shares a device with the OS disk.
    SharesOsDevice { pool: String },
}

/// What changed since `last` (per pool: usable, shares the OS device), which is updated.
fn changes(last: &mut HashMap<String, (bool, bool)>, report: &PoolsReport) -> Vec<PoolChange> {
    let mut out = Vec::new();
    for (name, h, shared) in &report.pools {
        let before = last.insert(name.clone(), (h.usable, *shared));
        if before.map(|b| b.0) != Some(h.usable) {
            out.push(match &h.reason {
                Some(reason) => PoolChange::Unusable {
                    pool: name.clone(),
                    reason: reason.clone(),
                },
                None => PoolChange::Usable {
                    pool: name.clone(),
                    available_bytes: h.available_bytes,
                    total_bytes: h.total_bytes,
                },
            });
        }
        if *shared && before.map(|b| b.1) != Some(true) {
            out.push(PoolChange::SharesOsDevice { pool: name.clone() });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(usable: bool, shared: bool) -> PoolsReport {
        let health = PoolHealth {
            usable,
            reason: (!usable).then(|| "nothing is mounted there".to_owned()),
            ..PoolHealth::default()
        };
        PoolsReport {
            pools: vec![("guarded".to_owned(), health, shared)],
        }
    }

    #[test]
    fn a_pool_problem_is_reported_once_per_transition_not_per_probe() {
        let mut last = HashMap::new();
        let down = changes(&mut last, &report(false, false));
        assert!(matches!(&down[..], [PoolChange::Unusable { pool, .. }] if pool == "guarded"));
        for _ in 0..3 {
            assert!(
                changes(&mut last, &report(false, false)).is_empty(),
                "no repeat while still down"
            );
        }
        let up = changes(&mut last, &report(true, false));
        assert!(matches!(&up[..], [PoolChange::Usable { .. }]));
        assert!(changes(&mut last, &report(true, false)).is_empty());
        assert_eq!(
            changes(&mut last, &report(true, true)),
            vec![PoolChange::SharesOsDevice { pool: "guarded".into() }]
        );
        assert!(changes(&mut last, &report(true, true)).is_empty());
    }
}
