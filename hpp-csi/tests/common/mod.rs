//! Test harness: a real driver on a unix socket in a temp dir, with real tonic clients.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use hpp_csi::csi::controller_client::ControllerClient;
use hpp_csi::csi::identity_client::IdentityClient;
use hpp_csi::csi::node_client::NodeClient;
use hpp_csi::csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume, access_mode::Mode};
use hpp_csi::csi::{self, VolumeCapability};
use hpp_csi::mountinfo::MountTable;
use hpp_csi::{Driver, DriverBuilder, DriverMetrics, Endpoint, PoolConfig};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

pub mod fake_quota;

pub const NODE: &str = "node-a";

pub struct Harness {
    pub dir: tempfile::TempDir,
    pub root: PathBuf,
    pub endpoint: Endpoint,
    pub identity: IdentityClient<Channel>,
    pub controller: ControllerClient<Channel>,
    pub node: NodeClient<Channel>,
    pub registry: std::sync::Arc<std::sync::Mutex<prometheus_client::registry::Registry>>,
    /// The driver's state (pools, ledger), for assertions on what the driver did internally.
    pub state: std::sync::Arc<hpp_csi::service::state::DriverState>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), hpp_csi::ServeError>>>,
}

/// A pool `legacy` at `<root>/pools/legacy` with snapshots at `<root>/snapshots/legacy`.
pub fn legacy_pool(root: &Path) -> PoolConfig {
    PoolConfig::new("legacy", root.join("pools/legacy")).with_snapshots(root.join("snapshots/legacy"))
}

impl Harness {
    pub async fn start() -> Harness {
        Self::with(|root, b| b.pool(legacy_pool(root))).await
    }

    /// The default pool, its sizes enforced by a [`fake_quota::FakeQuota`] with `granularity`,
    /// promising at most `overcommit_percent` % of the filesystem.
    pub async fn enforcing(
        granularity: u64,
        overcommit_percent: u32,
    ) -> (Harness, std::sync::Arc<fake_quota::FakeQuota>) {
        Self::enforcing_with(fake_quota::FakeQuota::new(granularity), overcommit_percent).await
    }

    /// Like [`Harness::enforcing`] with a backend set up by the caller.
    pub async fn enforcing_with(
        backend: fake_quota::FakeQuota,
        overcommit_percent: u32,
    ) -> (Harness, std::sync::Arc<fake_quota::FakeQuota>) {
        let backend = std::sync::Arc::new(backend);
        let b = backend.clone();
        let h = Self::with(move |root, builder| {
            let mut pool = legacy_pool(root);
            pool.overcommit_percent = overcommit_percent;
            builder.pool(pool).quota_backend("legacy", b)
        })
        .await;
        (h, backend)
    }

    pub async fn with(configure: impl FnOnce(&Path, DriverBuilder) -> DriverBuilder) -> Harness {
        Self::start_in(tempfile::tempdir().unwrap(), configure).await
    }

    /// Stops the driver and starts a new one with the default pool on the same directory, as
    /// after a crash or an upgrade.
    pub async fn restart(mut self) -> Harness {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap().unwrap();
        }
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap());
        Self::start_in(dir, |root, b| b.pool(legacy_pool(root))).await
    }

    /// Starts a driver in `dir`.
    pub async fn start_in(
        dir: tempfile::TempDir,
        configure: impl FnOnce(&Path, DriverBuilder) -> DriverBuilder,
    ) -> Harness {
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let endpoint = Endpoint::Unix(root.join("csi.sock"));
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = std::sync::Arc::new(DriverMetrics::register(&mut registry));
        let builder = Driver::builder()
            .node_id(NODE)
            .vendor_version("test")
            // Pools live in fresh temporary trees.
            .create_pool_parents(true)
            .endpoint(endpoint.clone())
            .metrics(metrics);
        let driver = configure(&root, builder).build().unwrap();
        let state = driver.state().clone();
        let bound = driver.bind().await.unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(bound.serve(async {
            let _ = rx.await;
        }));
        let channel = hpp_csi::client::connect(&endpoint).await.unwrap();
        Harness {
            identity: IdentityClient::new(channel.clone()),
            controller: ControllerClient::new(channel.clone()),
            node: NodeClient::new(channel),
            dir,
            root,
            endpoint,
            registry: std::sync::Arc::new(std::sync::Mutex::new(registry)),
            state,
            shutdown: Some(tx),
            task: Some(task),
        }
    }

    pub fn pool_path(&self) -> PathBuf {
        self.root.join("pools/legacy")
    }

    pub fn snap_path(&self) -> PathBuf {
        self.root.join("snapshots/legacy")
    }

    /// A fresh target directory path (not created) under the harness, outside every pool.
    pub fn target(&self, name: &str) -> PathBuf {
        let parent = self.root.join("pods");
        std::fs::create_dir_all(&parent).unwrap();
        parent.join(name)
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap().unwrap();
        }
    }

    pub fn metrics_text(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry.lock().unwrap()).unwrap();
        out
    }

    /// Waits until the metrics contain `needle`: pool gauges are measured in the background
    /// (after mount-table changes and every health interval), not by the RPC under test.
    pub async fn wait_for_metric(&self, needle: &str) -> String {
        wait_for_text(|| self.metrics_text(), needle).await
    }

    pub async fn create(&mut self, name: &str) -> csi::Volume {
        self.controller
            .create_volume(create_req(name))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap()
    }

    pub async fn publish(&mut self, id: &str, target: &Path, readonly: bool) -> Result<(), tonic::Status> {
        self.node
            .node_publish_volume(publish_req(id, target, readonly))
            .await
            .map(|_| ())
    }

    pub async fn delete(&mut self, id: &str) -> Result<(), tonic::Status> {
        self.controller
            .delete_volume(csi::DeleteVolumeRequest {
                volume_id: id.into(),
                ..Default::default()
            })
            .await
            .map(|_| ())
    }

    pub async fn unpublish(&mut self, id: &str, target: &Path) -> Result<(), tonic::Status> {
        self.node
            .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                volume_id: id.into(),
                target_path: target.to_string_lossy().into_owned(),
            })
            .await
            .map(|_| ())
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        // Never let TempDir's recursive removal walk through a leftover bind mount.
        unmount_below(&self.root);
    }
}

pub fn unmount_below(root: &Path) {
    for _ in 0..8 {
        let table = MountTable::read().unwrap();
        let mut below: Vec<PathBuf> = table
            .mounts()
            .iter()
            .filter(|m| m.mount_point.starts_with(root))
            .map(|m| m.mount_point.clone())
            .collect();
        if below.is_empty() {
            return;
        }
        below.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
        for p in below {
            let _ = rustix::mount::unmount(&p, rustix::mount::UnmountFlags::DETACH);
        }
    }
}

/// Waits until `read()` contains `needle` and returns that text (30 s at most, then fails).
pub async fn wait_for_text(read: impl Fn() -> String, needle: &str) -> String {
    for _ in 0..3000 {
        let text = read();
        if text.contains(needle) {
            return text;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("never showed {needle}:\n{}", read());
}

pub fn mount_cap() -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

pub fn mount_cap_flags(flags: &[&str]) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            mount_flags: flags.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        })),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

pub fn block_cap() -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

pub fn create_req(name: &str) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.into(),
        volume_capabilities: vec![mount_cap()],
        ..Default::default()
    }
}

pub fn sized_req(name: &str, required: i64, limit: i64) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        capacity_range: Some(csi::CapacityRange {
            required_bytes: required,
            limit_bytes: limit,
        }),
        ..create_req(name)
    }
}

/// Filesystem size of `path` in bytes.
pub fn fs_total(path: &Path) -> u64 {
    let st = rustix::fs::statvfs(path).unwrap();
    st.f_blocks * st.f_frsize
}

pub fn params(pool: &str) -> HashMap<String, String> {
    HashMap::from([("storagePool".to_owned(), pool.to_owned())])
}

pub fn publish_req(id: &str, target: &Path, readonly: bool) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_id: id.into(),
        target_path: target.to_string_lossy().into_owned(),
        volume_capability: Some(mount_cap()),
        readonly,
        ..Default::default()
    }
}

pub fn is_mount_point(p: &Path) -> bool {
    MountTable::read().unwrap().is_mount_point(p)
}

/// Fills a directory with a small tree: nested dirs, files, a symlink.
pub fn populate(dir: &Path) {
    std::fs::create_dir_all(dir.join("sub/deeper")).unwrap();
    std::fs::write(dir.join("top.txt"), b"top level").unwrap();
    std::fs::write(dir.join("sub/deeper/blob.bin"), vec![7u8; 256 * 1024]).unwrap();
    std::os::unix::fs::symlink("top.txt", dir.join("link")).unwrap();
}

pub fn assert_populated(dir: &Path) {
    assert_eq!(std::fs::read(dir.join("top.txt")).unwrap(), b"top level");
    assert_eq!(
        std::fs::read(dir.join("sub/deeper/blob.bin")).unwrap(),
        vec![7u8; 256 * 1024]
    );
    assert_eq!(std::fs::read_link(dir.join("link")).unwrap(), Path::new("top.txt"));
}

pub fn code(r: Result<impl Sized, tonic::Status>) -> tonic::Code {
    match r {
        Ok(_) => tonic::Code::Ok,
        Err(s) => s.code(),
    }
}
