//! The hpp CSI driver as an embeddable library.
//!
//! Serves the CSI Identity, Controller and Node services over tonic for node-local (or shared)
//! directory pools: a volume is the directory `<pool path>/<volume id>`. Wire-compatible with the
//! KubeVirt hostpath CSI driver so existing volumes are served unchanged.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use hpp_csi::{Driver, Endpoint, PoolConfig};
//! let driver = Driver::builder()
//!     .node_id("node-1")
//!     .pool(PoolConfig::new("legacy", "/var/hpp/legacy").with_snapshots("/var/hpp/snapshots"))
//!     .endpoint("unix:///run/hpp/csi.sock".parse()?)
//!     .build()?;
//! driver.serve(async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(()) }
//! ```

pub mod admin;
pub mod authority;
pub mod caps;
pub mod client;
pub mod config;
pub mod controller;
pub mod copy;
pub mod csi;
pub mod deferred_quota;
pub mod endpoint;
pub mod error;
pub mod expand;
pub mod fsops;
pub mod health;
pub mod identity;
pub mod inflight;
pub mod inventory;
pub mod lane;
pub mod ledger;
pub mod metrics;
pub mod modify;
pub mod mount;
pub mod node;
pub mod pagination;
pub mod pool;
pub mod rpc_layer;
pub mod server;
pub mod sizing;
pub mod snapshots;
pub mod state;
pub mod trash;
pub mod validate;
pub mod volume_journal;
pub mod volumes;

/// The mount table parser, shared with the rest of hpp (see [`hpp_fs::mountinfo`]).
pub use hpp_fs::mountinfo;

pub use config::{ConfigError, PoolConfig, parse_pools};
pub use endpoint::Endpoint;
pub use error::{Error, Result};
pub use expand::ExpansionMode;
pub use metrics::DriverMetrics;
pub use server::{BoundDriver, Driver, DriverBuilder, ServeError};
