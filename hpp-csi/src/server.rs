//! The embeddable driver: a builder that checks the configuration and prepares the pools, a
//! ready-made server on a unix socket or TCP port with clean shutdown ([`BoundDriver::serve`]),
//! extensible with services of your own ([`BoundDriver::serve_with`]), and, for a tonic server
//! of your own, the pieces `serve` is made of: the services and their layer
//! ([`Driver::router`]), the unix socket with its checks ([`CsiSocket`]), and the background
//! work with its one shutdown call ([`Driver::start_background`], [`Background::stop`]).

use std::future::Future;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hpp_api::constants::DRIVER_NAME;
use hpp_fs::quota::QuotaBackend;
use tokio::net::{TcpListener, UnixListener};
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};

use crate::config::{ConfigError, PoolConfig, check_pools};
use crate::csi::controller_server::ControllerServer;
use crate::csi::identity_server::IdentityServer;
use crate::csi::node_server::NodeServer;
use crate::endpoint::Endpoint;
use crate::metrics::DriverMetrics;
use crate::ops::expand::ExpansionMode;
use crate::ops::ledger::Ledger;
use crate::pool::inflight::InFlight;
use crate::pool::{DirCreation, Pool};
use crate::service::controller::ControllerService;
use crate::service::identity::IdentityService;
use crate::service::node::NodeService;
use crate::service::rpc_layer::RpcLayer;
use crate::service::state::{DriverState, PoolsReport};

/// Failure to start or run the server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// `serve` was called on a driver built without an endpoint.
    #[error("no endpoint configured")]
    NoEndpoint,
    /// A live driver already answers on the socket.
    #[error("another process is already serving on {0}")]
    InUse(PathBuf),
    /// Something other than a socket sits at the socket path.
    #[error("{0} exists and is not a socket; refusing to replace it")]
    NotASocket(PathBuf),
    /// Binding the listener failed.
    #[error("cannot listen on {endpoint}: {cause}")]
    Bind {
        /// The endpoint.
        endpoint: Endpoint,
        /// The error (shown in the message, so not also a `source`).
        cause: std::io::Error,
    },
    /// The gRPC server failed. Its cause is the `source` (tonic's own message is only
    /// "transport error").
    #[error("gRPC server")]
    Transport(#[from] tonic::transport::Error),
}

/// Builds a [`Driver`].
#[derive(Debug, Clone)]
pub struct DriverBuilder {
    name: String,
    topology_key: Option<String>,
    version: String,
    node_id: Option<String>,
    pools: Vec<PoolConfig>,
    endpoint: Option<Endpoint>,
    metrics: Option<Arc<DriverMetrics>>,
    os_reference: Option<PathBuf>,
    quota_overrides: Vec<(String, Arc<dyn QuotaBackend>)>,
    expansion: ExpansionMode,
    health_interval: Duration,
    create_pool_parents: bool,
}

impl Default for DriverBuilder {
    fn default() -> Self {
        DriverBuilder {
            name: DRIVER_NAME.to_owned(),
            topology_key: None,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            node_id: None,
            pools: Vec::new(),
            endpoint: None,
            metrics: None,
            os_reference: None,
            quota_overrides: Vec::new(),
            expansion: ExpansionMode::default(),
            health_interval: crate::service::health::DEFAULT_HEALTH_INTERVAL,
            create_pool_parents: false,
        }
    }
}

impl DriverBuilder {
    /// CSI driver name (default `kubevirt.io.hostpath-provisioner`).
    pub fn driver_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The topology key volumes are pinned to nodes with (default: KubeVirt's
    /// `topology.hostpath.csi/node` under KubeVirt's driver name, else `topology.<driver
    /// name>/node`, so two hostpath drivers on one cluster never read each other's topology).
    /// Set it to keep the key of volumes made before the driver was renamed.
    pub fn topology_key(mut self, key: impl Into<String>) -> Self {
        self.topology_key = Some(key.into());
        self
    }

    /// Vendor version reported by GetPluginInfo (default: this crate's version).
    pub fn vendor_version(mut self, version: impl Into<String>) -> Self {
        self.version = version.into();
        self
    }

    /// This node's id, normally the Kubernetes node name. Required.
    pub fn node_id(mut self, node_id: impl Into<String>) -> Self {
        self.node_id = Some(node_id.into());
        self
    }

    /// Adds one pool. The first pool is the default when no pool is called `legacy`.
    pub fn pool(mut self, pool: PoolConfig) -> Self {
        self.pools.push(pool);
        self
    }

    /// Adds pools, e.g. from [`crate::config::parse_pools`].
    pub fn pools(mut self, pools: impl IntoIterator<Item = PoolConfig>) -> Self {
        self.pools.extend(pools);
        self
    }

    /// Where [`Driver::serve`] listens.
    pub fn endpoint(mut self, endpoint: Endpoint) -> Self {
        self.endpoint = Some(endpoint);
        self
    }

    /// Records RPC and pool metrics into these (see [`DriverMetrics::register`]).
    pub fn metrics(mut self, metrics: Arc<DriverMetrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// A path on the OS disk for the shared-with-OS check (default: the socket's directory,
    /// which kubelet provides from the host disk, or `/`).
    pub fn os_reference_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.os_reference = Some(path.into());
        self
    }

    /// Enforces sizes in pool `pool` with `backend` instead of the one its quota mode names:
    /// for embedders with a backend of their own, and for tests of the backend-independent
    /// parts (capacity ledger, expansion) with a backend that needs no special filesystem.
    pub fn quota_backend(mut self, pool: impl Into<String>, backend: Arc<dyn QuotaBackend>) -> Self {
        self.quota_overrides.push((pool.into(), backend));
        self
    }

    /// Which service raises limits (default [`ExpansionMode::Controller`]). A DaemonSet of
    /// node-local drivers wants [`ExpansionMode::Node`].
    pub fn expansion(mut self, mode: ExpansionMode) -> Self {
        self.expansion = mode;
        self
    }

    /// How often pool health is measured when the mount table does not change (default 30 s).
    pub fn health_interval(mut self, interval: Duration) -> Self {
        self.health_interval = interval;
        self
    }

    /// Whether a pool directory whose parent is missing is made with its parents (default
    /// `false`: such a path is refused, as it is usually a typo or a disk that is not mounted).
    /// A pool directory whose parent exists is always made; a guarded pool's never is.
    pub fn create_pool_parents(mut self, create: bool) -> Self {
        self.create_pool_parents = create;
        self
    }

    /// Checks the configuration and prepares the pool directories: every pool is checked
    /// before any directory is made, so a refused configuration leaves nothing behind.
    pub fn build(self) -> Result<Driver, ConfigError> {
        let node_id = self
            .node_id
            .filter(|n| !n.is_empty())
            .ok_or(ConfigError::Missing("node id"))?;
        if self.name.is_empty() {
            return Err(ConfigError::Missing("driver name"));
        }
        check_pools(&self.pools)?;
        if let Some((name, _)) = self
            .quota_overrides
            .iter()
            .find(|(name, _)| !self.pools.iter().any(|p| &p.name == name))
        {
            return Err(ConfigError::UnknownPool(name.clone()));
        }
        if let Some(Endpoint::Unix(socket)) = &self.endpoint
            && socket_answers(socket)
        {
            return Err(ConfigError::EndpointInUse(socket.clone()));
        }
        let create = match self.create_pool_parents {
            true => DirCreation::WithParents,
            false => DirCreation::LastComponent,
        };
        let planned = self
            .pools
            .iter()
            .map(|cfg| Pool::plan(cfg, create))
            .collect::<Result<Vec<_>, _>>()?;
        let mut pools = planned
            .into_iter()
            .map(crate::pool::Planned::finish)
            .collect::<Result<Vec<_>, _>>()?;
        Pool::reserve_nested(&mut pools);
        for (name, backend) in self.quota_overrides {
            if let Some(pool) = pools.iter_mut().find(|p| p.name == name) {
                pool.quota = backend;
            }
        }
        for pool in &pools {
            // Redo what the journal says a crash lost before any request is served, and before
            // the sweep (a lost rename's temporary is renamed into place, not swept); a pool
            // that cannot be looked into yet (guarded, unmounted) does so on its first create
            // or delete.
            if let Err(e) = pool.journal() {
                tracing::warn!(pool = %pool.name, error = %e, "cannot open the volume journal yet");
            }
            sweep_pool(pool);
        }
        let os_reference = self.os_reference.unwrap_or_else(|| match &self.endpoint {
            Some(Endpoint::Unix(p)) => p.parent().map(Path::to_path_buf).unwrap_or_else(|| "/".into()),
            _ => PathBuf::from("/"),
        });
        let os_reference = std::fs::canonicalize(&os_reference).unwrap_or(os_reference);
        let topology_key = self.topology_key.unwrap_or_else(|| default_topology_key(&self.name));
        Ok(Driver {
            state: Arc::new(DriverState {
                topology_key,
                name: self.name,
                version: self.version,
                node_id,
                pools,
                inflight: InFlight::default(),
                metrics: self.metrics,
                os_reference,
                last_seen: Default::default(),
                ledger: Ledger::default(),
                expansion: self.expansion,
                health_interval: self.health_interval,
                health: Default::default(),
                mounts: Default::default(),
                listings: Default::default(),
            }),
            endpoint: self.endpoint,
        })
    }
}

/// The topology key of a driver called `name` when none is set: KubeVirt's under KubeVirt's
/// name, `topology.<name>/node` under any other.
pub fn default_topology_key(name: &str) -> String {
    match name {
        DRIVER_NAME => hpp_api::constants::TOPOLOGY_KEY.to_owned(),
        other => format!("topology.{other}/node"),
    }
}

/// Removes what crashed attempts left in a node-local pool: temporaries of creates and
/// snapshots, interrupted deletions. Shared pools are left alone: another node's driver may be
/// building in them right now.
fn sweep_pool(pool: &Pool) {
    if pool.shared {
        return;
    }
    let volumes = pool
        .open()
        .and_then(|dir| crate::ops::volumes::sweep(std::os::fd::AsFd::as_fd(&dir), &*pool.quota));
    for (what, result) in [("volumes", volumes), ("snapshots", crate::ops::snapshots::sweep(pool))] {
        match result {
            Ok(0) => {}
            Ok(n) => tracing::info!(pool = %pool.name, what, swept = n, "removed leftovers of interrupted operations"),
            Err(e) => {
                tracing::warn!(pool = %pool.name, what, error = %e, "cannot sweep leftovers of interrupted operations")
            }
        }
    }
}

/// A configured driver, ready to serve.
#[derive(Debug, Clone)]
pub struct Driver {
    state: Arc<DriverState>,
    endpoint: Option<Endpoint>,
}

impl Driver {
    /// Starts building a driver.
    pub fn builder() -> DriverBuilder {
        DriverBuilder::default()
    }

    /// Shared state (pools, node id), for embedders that inspect it.
    pub fn state(&self) -> &Arc<DriverState> {
        &self.state
    }

    /// A tonic router with the driver's RPC layer and all its services (Identity, Controller,
    /// Node, and hpp's admin service): what [`BoundDriver::serve`] serves. For a server of your
    /// own, add your services and serve it on a [`CsiSocket`], with [`Driver::start_background`]
    /// running beside it.
    pub fn router(&self) -> CsiRouter {
        tonic::transport::Server::builder()
            .layer(self.rpc_layer())
            .add_service(self.identity_service())
            .add_service(self.controller_service())
            .add_service(self.node_service())
            .add_service(self.trash_service())
    }

    /// Starts what a serving driver runs in the background (see [`Background`]); stop it with
    /// [`Background::stop`] once your server has stopped.
    pub fn start_background(&self) -> Background {
        let state = &self.state;
        Background {
            tasks: vec![
                // Keeps the gauges and transition logs current, so Probe need not measure.
                tokio::spawn(crate::service::health::watch(state.clone(), state.health_interval)),
                // Purges trash entries whose retention is over (nothing without a trash).
                tokio::spawn(crate::service::health::purge_trash(state.clone())),
                // Counts subvolumes tenants make inside volumes where the filesystem does not.
                tokio::spawn(crate::service::health::contain_nested(state.clone())),
            ],
            state: state.clone(),
        }
    }

    /// hpp's admin service (the trash of deleted volumes), for a tonic server of your own.
    pub fn trash_service(&self) -> crate::admin::TrashServer<crate::admin::TrashService> {
        crate::admin::TrashServer::new(crate::admin::TrashService::new(self.state.clone()))
    }

    /// The Identity service, for a tonic server of your own.
    pub fn identity_service(&self) -> IdentityServer<IdentityService> {
        IdentityServer::new(IdentityService::new(self.state.clone()))
    }

    /// The Controller service, for a tonic server of your own.
    pub fn controller_service(&self) -> ControllerServer<ControllerService> {
        ControllerServer::new(ControllerService::new(self.state.clone()))
    }

    /// The Node service, for a tonic server of your own.
    pub fn node_service(&self) -> NodeServer<NodeService> {
        NodeServer::new(NodeService::new(self.state.clone()))
    }

    /// The tracing and metrics layer the built-in server wraps every RPC in.
    pub fn rpc_layer(&self) -> RpcLayer {
        RpcLayer::new(self.state.metrics.clone())
    }

    /// Measures every pool now (blocking I/O; call from `spawn_blocking` in async code).
    pub fn pools_report(&self) -> PoolsReport {
        self.state.pools_report()
    }

    /// Binds the configured endpoint. Separate from serving so callers learn the real address
    /// (TCP port 0) before the first request.
    pub async fn bind(self) -> Result<BoundDriver, ServeError> {
        let endpoint = self.endpoint.clone().ok_or(ServeError::NoEndpoint)?;
        let listener = match &endpoint {
            Endpoint::Unix(path) => Listener::Unix(CsiSocket::bind(path)?),
            Endpoint::Tcp(addr) => Listener::Tcp(TcpListener::bind(addr).await.map_err(|cause| ServeError::Bind {
                endpoint: endpoint.clone(),
                cause,
            })?),
        };
        let local = match &listener {
            Listener::Unix(u) => Endpoint::Unix(u.path().to_path_buf()),
            Listener::Tcp(t) => match t.local_addr() {
                Ok(a) => Endpoint::Tcp(a.to_string()),
                Err(_) => endpoint.clone(),
            },
        };
        Ok(BoundDriver {
            driver: self,
            listener,
            local,
        })
    }

    /// Binds and serves until `shutdown` resolves, then removes the socket.
    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), ServeError> {
        self.bind().await?.serve(shutdown).await
    }
}

enum Listener {
    Unix(CsiSocket),
    Tcp(TcpListener),
}

/// Whether a live process accepts connections on the unix socket `path`.
fn socket_answers(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|meta| meta.file_type().is_socket())
        && std::os::unix::net::UnixStream::connect(path).is_ok()
}

/// A unix socket for the CSI services, bound the way the driver's own server binds it: the
/// parent directory made, a socket nobody answers on any more (a crashed driver's) replaced,
/// one a live process answers on refused ([`ServeError::InUse`]), anything else at the path
/// refused ([`ServeError::NotASocket`]), mode 0660 (kubelet and the sidecars run as root or in
/// the socket's group). Serve it with [`CsiSocket::incoming`].
#[derive(Debug)]
pub struct CsiSocket {
    listener: UnixListener,
    path: PathBuf,
    ino: u64,
}

impl CsiSocket {
    /// Binds `path` (see the type's documentation).
    pub fn bind(path: impl AsRef<Path>) -> Result<CsiSocket, ServeError> {
        let path = path.as_ref();
        let io = |cause| ServeError::Bind {
            endpoint: Endpoint::Unix(path.to_path_buf()),
            cause,
        };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_socket() => {
                if std::os::unix::net::UnixStream::connect(path).is_ok() {
                    return Err(ServeError::InUse(path.to_path_buf()));
                }
                std::fs::remove_file(path).map_err(io)?;
            }
            Ok(_) => return Err(ServeError::NotASocket(path.to_path_buf())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        let listener = UnixListener::bind(path).map_err(io)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)).map_err(io)?;
        let ino = std::fs::symlink_metadata(path).map_err(io)?.ino();
        Ok(CsiSocket {
            listener,
            path: path.to_path_buf(),
            ino,
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The connections, for `serve_with_incoming[_shutdown]`: each wrapped in
    /// [`AuthorityFix`](crate::AuthorityFix), without which every gRPC C-core client (Python,
    /// Ruby, C++, csc) is reset, since they send the socket path as `:authority`. Dropping the
    /// stream (the server stopped) removes the socket file, if it is still this one.
    pub fn incoming(self) -> CsiIncoming {
        CsiIncoming {
            inner: UnixListenerStream::new(self.listener),
            path: self.path,
            ino: self.ino,
        }
    }
}

/// The connections of a [`CsiSocket`]; removes the socket file when dropped.
#[derive(Debug)]
pub struct CsiIncoming {
    inner: UnixListenerStream,
    path: PathBuf,
    ino: u64,
}

impl tokio_stream::Stream for CsiIncoming {
    type Item = std::io::Result<crate::AuthorityFix<tokio::net::UnixStream>>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        std::pin::Pin::new(&mut self.inner)
            .poll_next(cx)
            .map(|conn| conn.map(|conn| conn.map(crate::AuthorityFix::new)))
    }
}

impl Drop for CsiIncoming {
    fn drop(&mut self) {
        // Only our own socket: a newer driver may have replaced it meanwhile.
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.ino) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// What [`BoundDriver::serve_with`] and [`Driver::router`] hand over: a tonic router with the
/// driver's RPC layer (spans, logs, metrics of the CSI and admin services) and its services
/// added; `add_service` yours (wrap one in a layer of yours with `tonic::service::LayerExt`'s
/// `named_layer`).
pub type CsiRouter =
    tonic::transport::server::Router<tower::layer::util::Stack<RpcLayer, tower::layer::util::Identity>>;

/// The driver's work in the background while it serves: pool health (gauges, transition
/// logs), trash purges, containment of subvolumes tenants make inside volumes. Stop it with
/// [`Background::stop`] after the server stopped; dropping it only aborts the tasks.
#[derive(Debug)]
pub struct Background {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    state: Arc<DriverState>,
}

impl Background {
    /// Stops the background work and checkpoints every pool's volume journal, so a later
    /// start (or KubeVirt's driver after a rollback) finds nothing to redo. Call it once the
    /// last request is answered.
    pub async fn stop(mut self) {
        for task in self.tasks.drain(..) {
            task.abort();
        }
        let state = self.state.clone();
        let _ = tokio::task::spawn_blocking(move || {
            for pool in &state.pools {
                pool.retire_journal();
            }
        })
        .await;
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// A driver with its listener bound.
pub struct BoundDriver {
    driver: Driver,
    listener: Listener,
    local: Endpoint,
}

impl std::fmt::Debug for BoundDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoundDriver").field("endpoint", &self.local).finish()
    }
}

impl BoundDriver {
    /// The address actually listened on.
    pub fn endpoint(&self) -> &Endpoint {
        &self.local
    }

    /// Serves until `shutdown` resolves. Pool health (gauges, transition logs) is measured after
    /// every mount-table change and every [`DriverBuilder::health_interval`]. The unix socket
    /// is removed afterwards (only if it is still ours), and every volume journal checkpointed.
    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), ServeError> {
        self.serve_with(shutdown, |router| router).await
    }

    /// [`serve`](Self::serve), with services of your own on the same socket: `configure` gets
    /// the router with the driver's services and returns it with yours added.
    pub async fn serve_with(
        self,
        shutdown: impl Future<Output = ()> + Send,
        configure: impl FnOnce(CsiRouter) -> CsiRouter,
    ) -> Result<(), ServeError> {
        let driver = self.driver;
        let background = driver.start_background();
        let router = configure(driver.router());
        let result = match self.listener {
            // Non-Go clients send the socket path as :authority; see `AuthorityFix`.
            Listener::Unix(sock) => router.serve_with_incoming_shutdown(sock.incoming(), shutdown).await,
            Listener::Tcp(listener) => {
                router
                    .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
                    .await
            }
        };
        // A clean stop leaves no records to redo: a later start (or another driver in the
        // meantime, KubeVirt's after a rollback) finds the pools as they are.
        background.stop().await;
        Ok(result?)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A bind failure states its cause once: in its message, not again as a `source` that a
    /// chain printer (anyhow's `{:#}`) would append.
    #[test]
    fn a_bind_failure_states_its_cause_once() {
        let err = ServeError::Bind {
            endpoint: Endpoint::Tcp("127.0.0.1:1".into()),
            cause: std::io::Error::from_raw_os_error(13),
        };
        assert_eq!(
            err.to_string(),
            "cannot listen on tcp://127.0.0.1:1: Permission denied (os error 13)"
        );
        assert!(std::error::Error::source(&err).is_none());
    }
}
