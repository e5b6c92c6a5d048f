//! The standard sub-reconcilers, one module per owned object family (mirroring the KubeVirt
//! operator's files), each with pure `desired_*` builders.

pub mod common;
pub mod csi_daemonset;
pub mod csi_driver;
pub mod legacy_daemonset;
pub mod node_affinity;
pub mod node_loss;
pub mod pool_mounts;
pub mod pool_objects;
pub mod prometheus;
pub mod rbac;
pub mod rollout;
pub mod scc;
pub mod storage_class_pools;
pub mod storage_pools;
pub mod volume_audit;

pub use csi_daemonset::CsiDaemonSet;
pub use csi_driver::CsiDriver;
pub use legacy_daemonset::LegacyDaemonSet;
pub use node_loss::NodeLoss;
pub use pool_mounts::PoolMounts;
pub use prometheus::Prometheus;
pub use rbac::{Rbac, ServiceAccounts};
pub use scc::Scc;
pub use storage_class_pools::StorageClassPools;
pub use storage_pools::StoragePools;
pub use volume_audit::VolumeAudit;
