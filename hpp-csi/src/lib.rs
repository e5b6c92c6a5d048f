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

// The public surface: what an embedder builds, configures, serves, calls and observes.
pub mod admin;
pub mod client;
pub mod config;
pub mod csi;
pub mod endpoint;
pub mod error;
pub mod inventory;
pub mod metrics;
pub mod server;

// The layers below it, each using only those beneath (one exception: a pool keeps its volume
// journal's state, whose replay is a volume operation): what a pool is, what a volume operation
// does, what serves RPCs. Public only with the `internals` feature (this crate's own tests and
// benchmarks); not part of the semver promise.
#[cfg(feature = "internals")]
pub mod ops;
#[cfg(not(feature = "internals"))]
pub(crate) mod ops;
#[cfg(feature = "internals")]
pub mod pool;
#[cfg(not(feature = "internals"))]
pub(crate) mod pool;
#[cfg(feature = "internals")]
pub mod service;
#[cfg(not(feature = "internals"))]
pub(crate) mod service;

/// The crates whose types this crate's API uses, re-exported so a distribution depends on
/// hpp-csi alone and always builds against the versions it was built with (tonic's `Router`
/// and `Status`, prost's messages, prometheus-client's `Registry`, tower's layers).
pub mod deps {
    pub use prometheus_client;
    pub use prost;
    pub use prost_types;
    pub use tonic;
    pub use tower;
}

/// The mount table parser, shared with the rest of hpp (see [`hpp_fs::mountinfo`]).
pub use hpp_fs::mountinfo;

pub use config::{ConfigError, PoolConfig, parse_pools};
pub use endpoint::Endpoint;
pub use error::{Error, Result};
pub use metrics::DriverMetrics;
pub use ops::expand::ExpansionMode;
pub use ops::trash::{PurgeReason, TrashTotals};
pub use pool::{PoolHealth, build_quota_backend};
pub use server::{Background, BoundDriver, CsiIncoming, CsiRouter, CsiSocket, Driver, DriverBuilder, ServeError};
pub use service::authority::AuthorityFix;
pub use service::health::{DEFAULT_HEALTH_INTERVAL, watch as watch_health};
pub use service::rpc_layer::RpcLayer;
pub use service::state::DriverState;
