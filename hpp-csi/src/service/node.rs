//! The CSI Node service: bind-mount publishing, unpublishing without recursive deletes, volume
//! stats with a VolumeCondition, and ephemeral inline volumes.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hpp_fs::MountTableCache;
use hpp_fs::quota::Layout;
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use tonic::{Request, Response, Status};

use crate::csi::{self, node_service_capability::rpc::Type as Cap, volume_capability::AccessType};
use crate::error::{Error, Result};
use crate::ops::caps;
use crate::ops::expand::ExpansionMode;
use crate::ops::mount::{self, BindOptions};
use crate::ops::volumes;
use crate::pool::Pool;
use crate::pool::fsops;
use crate::pool::inflight::{target_key, volume_key};
use crate::pool::lane::{blocking, blocking_locked};
use crate::pool::validate::{check_id, check_target_path};
use crate::service::state::DriverState;

/// Volume context key kubelet sets for CSI ephemeral inline volumes.
pub const EPHEMERAL_CONTEXT_KEY: &str = "csi.storage.k8s.io/ephemeral";
/// Directory in each pool that records which volumes are ephemeral (removed on unpublish).
pub const EPHEMERAL_MARKERS: &str = ".hpp-ephemeral";

/// Node service of this node.
#[derive(Debug, Clone)]
pub struct NodeService {
    state: Arc<DriverState>,
}

impl NodeService {
    /// Wraps shared driver state.
    pub fn new(state: Arc<DriverState>) -> Self {
        NodeService { state }
    }
}

fn record(field: &str, value: &str) {
    tracing::Span::current().record(field, value);
}

/// `target` with its parent resolved, as the mount table spells it (kubelet's root dir may sit
/// behind a symlink). The last component is never resolved.
fn canonical(target: &Path) -> PathBuf {
    match (target.parent(), target.file_name()) {
        (Some(parent), Some(name)) => std::fs::canonicalize(parent)
            .map(|p| p.join(name))
            .unwrap_or_else(|_| target.to_path_buf()),
        _ => target.to_path_buf(),
    }
}

/// Rejects targets inside a pool or snapshot directory: mounting there would shadow volumes.
fn check_target_outside_pools(state: &DriverState, target: &Path) -> Result<()> {
    for pool in &state.pools {
        let roots = std::iter::once(&pool.path).chain(pool.snapshot_path.as_ref());
        for root in roots {
            if target.starts_with(root) || root.starts_with(target) {
                return Err(Error::InvalidArgument(format!(
                    "target path {} overlaps storage pool {} ({}); refusing",
                    target.display(),
                    pool.name,
                    root.display()
                )));
            }
        }
    }
    Ok(())
}

/// Opens (creating if missing, mode 0750, not recursively) the target directory without
/// following a symlink at its last component.
fn open_or_create_target(target: &Path) -> Result<OwnedFd> {
    let open = || {
        rustix::fs::open(
            target,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
    };
    match open() {
        Ok(fd) => Ok(fd),
        Err(Errno::NOENT) => {
            match rustix::fs::mkdir(target, Mode::from_raw_mode(0o750)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(Errno::NOENT) => {
                    return Err(Error::FailedPrecondition(format!(
                        "parent directory of target {} does not exist",
                        target.display()
                    )));
                }
                Err(e) => return Err(Error::io(format!("creating target {}", target.display()), e)),
            }
            open().map_err(|e| Error::io(format!("opening target {}", target.display()), e))
        }
        Err(Errno::LOOP) | Err(Errno::NOTDIR) => Err(Error::InvalidArgument(format!(
            "target {} is a symlink or not a directory",
            target.display()
        ))),
        Err(e) => Err(Error::io(format!("opening target {}", target.display()), e)),
    }
}

struct Publish {
    id: String,
    pool: Pool,
    target: PathBuf,
    opts: BindOptions,
    ephemeral: bool,
    /// The `size` an inline ephemeral volume asked for (0: none); its limit on quota pools.
    ephemeral_bytes: u64,
}

fn publish(p: &Publish, cache: &MountTableCache) -> Result<()> {
    if p.ephemeral {
        // The marker goes first, so a crash between the two cannot leak an unmarked volume.
        // An existing volume without a marker is a persistent one: never marked (unpublish would
        // delete it).
        if !volumes::exists(&p.pool, &p.id)? {
            mark_ephemeral(&p.pool, &p.id)?;
        }
        let requested = volumes::Requested {
            required: p.ephemeral_bytes,
            limit: 0,
        };
        volumes::create(&p.pool, &p.id, None, requested)?;
    }
    let source = volumes::open(&p.pool, &p.id)?;
    if p.pool.quota.layout() != Layout::Directory {
        // An image: loop-mounted, not bound (idempotent on retries); already mounted for
        // another target, that mount is bound here (an image is never mounted twice).
        let target = open_or_create_target(&p.target)?;
        let opts = p.opts.with_source_flags(&source);
        let result = match p.pool.quota.shared_mount(source.as_fd(), &p.target, opts.read_only()) {
            Ok(Some(root)) => {
                let opts = opts.with_source_flags(&root);
                mount::bind(&root, &target, &p.target, opts).map(|_| true)
            }
            Ok(None) => {
                drop(target);
                p.pool
                    .quota
                    .mount_at(source.as_fd(), &p.target, opts.flags)
                    .map_err(Error::from)
            }
            Err(e) => Err(Error::from(e)),
        };
        if result.is_err() && p.ephemeral {
            let _ = remove_ephemeral(&p.pool, &p.id, cache);
        }
        return result.map(|_| ());
    }
    let opts = p.opts.with_source_flags(&source);
    // The mount table is only read when the target already is a mount point (a retry).
    let mounts = if fsops::is_mount_root(&p.target) == Some(false) {
        Arc::default()
    } else {
        crate::pool::fsops::mount_table(cache)?
    };
    if let Some(existing) = mounts.mount_at(&p.target) {
        let want = mounts.fs_location(&p.pool.volume_path(&p.id));
        let same = want
            .as_ref()
            .is_some_and(|(dev, root)| existing.dev == *dev && existing.root == *root);
        if same && existing.read_only() == opts.read_only() {
            return Ok(());
        }
        if same && opts.read_only() && !mount::binds_are_atomic() {
            // Before 5.12 a read-only publish binds, then remounts: a crash in between leaves
            // our bind writable, and the retry must not leave it so.
            mount::remount(&p.target, opts)?;
            tracing::info!(volume_id = %p.id, target = %p.target.display(), "corrected our bind mount to read-only");
            return Ok(());
        }
        if same {
            // With atomic binds a writable bind of this volume was published writable: a
            // read-only publish at the same target is incompatible (CSI: ALREADY_EXISTS).
            return Err(Error::AlreadyExists(format!(
                "volume {} is already published at {} {}; a publish with readonly={} there is incompatible",
                p.id,
                p.target.display(),
                if existing.read_only() { "read-only" } else { "writable" },
                opts.read_only()
            )));
        }
        return Err(Error::AlreadyExists(format!(
            "target {} is already a mount point of something else",
            p.target.display()
        )));
    }
    let target = open_or_create_target(&p.target)?;
    let result = mount::bind(&source, &target, &p.target, opts);
    if result.is_err() && p.ephemeral {
        let _ = remove_ephemeral(&p.pool, &p.id, cache);
    }
    let method = result?;
    tracing::debug!(volume_id = %p.id, target = %p.target.display(), ?method, "published");
    Ok(())
}

/// Volume attribute an inline ephemeral volume may use to say how big it wants to be.
pub const EPHEMERAL_SIZE_KEY: &str = "size";

/// Refuses inline ephemeral volumes on a pool that does not allow them, or bigger than its cap;
/// returns the size asked for (0 when none).
fn check_ephemeral_allowed(pool: &Pool, ctx: &std::collections::HashMap<String, String>) -> Result<u64> {
    if !pool.ephemeral {
        return Err(Error::FailedPrecondition(format!(
            "storage pool {} does not allow inline ephemeral volumes (\"ephemeral\": false)",
            pool.name
        )));
    }
    // Only checked where it means something (a cap or an enforced size): KubeVirt ignores it,
    // and an unlimited pool keeps doing so whatever it says.
    let strict = pool.ephemeral_max_bytes.is_some() || pool.quota.enforces();
    let size = match ctx.get(EPHEMERAL_SIZE_KEY) {
        // A quantity (`1Gi`) like the CR's `ephemeral.maxSize`, or a plain byte count.
        Some(v) if strict => hpp_api::quantity::parse_bytes(v).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "volume attribute {EPHEMERAL_SIZE_KEY}={v:?} is not a size; use bytes or a quantity such as 1Gi"
            ))
        })?,
        _ => 0,
    };
    if let Some(cap) = pool.ephemeral_max_bytes
        && size > cap
    {
        return Err(Error::OutOfRange(format!(
            "inline ephemeral volume asks for {size} bytes; storage pool {} allows at most {cap}",
            pool.name
        )));
    }
    Ok(size)
}

fn mark_ephemeral(pool: &Pool, id: &str) -> Result<()> {
    let dir = pool.open()?;
    match rustix::fs::mkdirat(&dir, EPHEMERAL_MARKERS, Mode::from_raw_mode(0o700)) {
        Ok(()) | Err(Errno::EXIST) => {}
        Err(e) => return Err(Error::io("creating ephemeral marker directory", e)),
    }
    let markers =
        fsops::open_child_dir(dir.as_fd(), EPHEMERAL_MARKERS).map_err(|e| Error::io("opening ephemeral markers", e))?;
    match rustix::fs::mkdirat(&markers, id, Mode::from_raw_mode(0o700)) {
        // Synced on its own: the volume's create syncs only the pool directory, and a volume
        // that outlived a power cut without its marker would never be removed.
        Ok(()) => rustix::fs::fsync(&markers).map_err(|e| Error::io("syncing ephemeral marker", e)),
        Err(Errno::EXIST) => Ok(()),
        Err(e) => Err(Error::io("writing ephemeral marker", e)),
    }
}

fn is_ephemeral(pool: &Pool, id: &str) -> bool {
    let Ok(dir) = pool.open() else { return false };
    let Ok(markers) = fsops::open_child_dir(dir.as_fd(), EPHEMERAL_MARKERS) else {
        return false;
    };
    matches!(fsops::entry(markers.as_fd(), id), Ok(fsops::Entry::Dir { .. }))
}

fn remove_ephemeral(pool: &Pool, id: &str, mounts: &MountTableCache) -> Result<()> {
    volumes::delete(pool, id, mounts)?;
    let dir = pool.open()?;
    if let Ok(markers) = fsops::open_child_dir(dir.as_fd(), EPHEMERAL_MARKERS) {
        fsops::remove_tree(markers.as_fd(), id)?;
    }
    Ok(())
}

/// Whether the mount at `target` is a bind of volume `id`'s directory: its root has the
/// directory's device and inode. Only a bind of that very directory can; a symlink planted at
/// the volume's name is never followed.
fn binds_volume_dir(state: &DriverState, id: &str, target: &Path) -> bool {
    let Ok(mounted) = rustix::fs::stat(target) else {
        return false;
    };
    state.pools.iter().any(|pool| {
        rustix::fs::lstat(pool.volume_path(id)).is_ok_and(|dir| {
            rustix::fs::FileType::from_raw_mode(dir.st_mode) == rustix::fs::FileType::Directory
                && dir.st_dev == mounted.st_dev
                && dir.st_ino == mounted.st_ino
        })
    })
}

/// The `volume_path` of NodeGetVolumeStats and NodeExpandVolume: required (InvalidArgument),
/// and a path that cannot be where a volume is published (relative, not normalised) names no
/// volume: NotFound, as the CSI spec and its conformance suite want.
fn published_path(volume_path: &str) -> Result<PathBuf> {
    if volume_path.is_empty() {
        return Err(Error::InvalidArgument("volume_path is required".into()));
    }
    Ok(canonical(check_target_path("volume_path", volume_path).map_err(
        |e| match e {
            Error::InvalidArgument(m) => Error::NotFound(format!("{m}; no volume can be published there")),
            other => other,
        },
    )?))
}

/// Whether `pool` holds volume `id` (a reserved name never is one).
fn holds_volume(pool: &Pool, id: &str) -> bool {
    !pool.is_reserved(id) && volumes::exists(pool, id).unwrap_or(false)
}

fn unpublish(state: &DriverState, id: &str, target: &Path) -> Result<()> {
    match rustix::fs::lstat(target) {
        Err(Errno::NOENT) => {}
        Err(e) => return Err(Error::io(format!("stat {}", target.display()), e)),
        Ok(st) => {
            if rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Symlink {
                return Err(Error::InvalidArgument(format!(
                    "target {} is a symlink; refusing to follow it",
                    target.display()
                )));
            }
            // Unmount every layer (a crashed retry may have stacked two), then remove the now
            // empty directory. Never a recursive delete: whatever is left is someone's data.
            // Only binds of this volume are removed (judged by the mount's root in mountinfo):
            // anything else stacked at the target is someone else's and stays.
            for _ in 0..16 {
                if fsops::is_mount_root(target) == Some(false) {
                    break;
                }
                // The common case in O(1): the mount's root is the volume directory itself.
                // Only anything else (an image's loop mount, a foreign mount) reads the table.
                if binds_volume_dir(state, id, target) {
                    mount::unmount(target)?;
                    continue;
                }
                let mounts = state.mount_table()?;
                let Some(top) = mounts.mount_at(target) else { break };
                let ours = state.pools.iter().any(|pool| {
                    mounts
                        .fs_location(&pool.volume_path(id))
                        .is_some_and(|(dev, root)| top.dev == dev && top.root == root)
                        || matches!(pool.quota.layout(), Layout::Image(file)
                            if hpp_fs::quota::image::loop_backs(&top.source, &pool.volume_path(id).join(file)))
                });
                if !ours {
                    return Err(Error::FailedPrecondition(format!(
                        "target {} has a mount of {} ({}) that is not volume {id}; leaving it in place",
                        target.display(),
                        top.source,
                        top.root.display()
                    )));
                }
                mount::unmount(target)?;
            }
            match rustix::fs::rmdir(target) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(Errno::NOTEMPTY) | Err(Errno::EXIST) => {
                    return Err(Error::FailedPrecondition(format!(
                        "target {} is not empty after unmounting; leaving it in place",
                        target.display()
                    )));
                }
                Err(Errno::NOTDIR) => {
                    return Err(Error::FailedPrecondition(format!(
                        "target {} is not a directory; leaving it in place",
                        target.display()
                    )));
                }
                Err(e) => return Err(Error::io(format!("removing target {}", target.display()), e)),
            }
        }
    }
    for pool in &state.pools {
        if !pool.is_reserved(id) && is_ephemeral(pool, id) {
            // The volume's own key, not just this target's: a publish of it at another target
            // (which holds the key shared from before its bind) or a snapshot or clone of it must
            // not see it removed under them. Busy is Aborted; the CO retries.
            let _volume = state.inflight.acquire(&[volume_key(id)], &[])?;
            let mounts = state.mount_table()?;
            if mounts.bind_mounts_of(&pool.volume_path(id)).is_empty() {
                remove_ephemeral(pool, id, &state.mounts)?;
                tracing::info!(volume_id = %id, pool = %pool.name, "ephemeral volume removed");
            }
        }
    }
    Ok(())
}

/// Why no pool holds volume `id`: NotFound when every pool is usable (the volume does not
/// exist, as CSI has it), otherwise the abnormal condition's message naming the pools that
/// cannot be looked into (a guarded pool whose mount went away takes its volumes with it).
fn missing_volume_reason(state: &DriverState, id: &str) -> Result<String> {
    let unusable: Vec<String> = state
        .pools
        .iter()
        .filter_map(|p| p.measure().reason.map(|r| format!("{}: {r}", p.name)))
        .collect();
    if unusable.is_empty() {
        return Err(Error::NotFound(format!(
            "volume {id} does not exist in any storage pool on node {}",
            state.node_id
        )));
    }
    Ok(format!(
        "volume {id} was not found in any usable storage pool; not usable: {}",
        unusable.join("; ")
    ))
}

/// Stats of the volume published at `path`; `pool` is where the volume lives, or why it was
/// found nowhere (the condition's message).
fn volume_stats(
    pool: std::result::Result<Pool, String>,
    id: &str,
    path: &Path,
    mounts: &MountTableCache,
) -> Result<csi::NodeGetVolumeStatsResponse> {
    let path_fd = match rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => {
            return Err(Error::NotFound(format!(
                "volume path {} does not exist",
                path.display()
            )));
        }
        Err(Errno::LOOP) | Err(Errno::NOTDIR) => {
            return Err(Error::InvalidArgument(format!(
                "volume path {} is a symlink or not a directory",
                path.display()
            )));
        }
        Err(e) => return Err(Error::io(format!("opening {}", path.display()), e)),
    };
    let mounts = crate::pool::fsops::mount_table(mounts)?;
    let mut condition = csi::VolumeCondition {
        abnormal: false,
        message: "volume is healthy".into(),
    };
    match &pool {
        Err(message) => {
            condition = csi::VolumeCondition {
                abnormal: true,
                message: message.clone(),
            };
        }
        Ok(pool) => {
            let health = pool.health(&mounts);
            let c = caps::condition(&health, true);
            if c.abnormal {
                condition = c;
            }
        }
    }
    let mounted = fsops::is_mount_root(path).unwrap_or_else(|| mounts.is_mount_point(path));
    if !condition.abnormal && !mounted {
        condition = csi::VolumeCondition {
            abnormal: true,
            message: "The volume isn't mounted".into(),
        };
    }
    let fs = rustix::fs::fstatvfs(&path_fd).map_err(|e| Error::io("statvfs of volume", e))?;
    // A published image volume: the path is its own filesystem, and what `df` shows inside
    // is the answer (the image's allocated blocks only bound it from above).
    let own_filesystem =
        mounted && matches!(&pool, Ok(pool) if matches!(pool.quota.layout(), hpp_fs::quota::Layout::Image(_)));
    if own_filesystem {
        let bytes = |blocks: u64| i64::try_from(blocks.saturating_mul(fs.f_frsize)).unwrap_or(i64::MAX);
        let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        return Ok(csi::NodeGetVolumeStatsResponse {
            usage: vec![
                csi::VolumeUsage {
                    available: bytes(fs.f_bavail),
                    total: bytes(fs.f_blocks),
                    used: bytes(fs.f_blocks.saturating_sub(fs.f_bfree)),
                    unit: csi::volume_usage::Unit::Bytes as i32,
                },
                csi::VolumeUsage {
                    available: count(fs.f_favail),
                    total: count(fs.f_files),
                    used: count(fs.f_files.saturating_sub(fs.f_ffree)),
                    unit: csi::volume_usage::Unit::Inodes as i32,
                },
            ],
            volume_condition: Some(condition),
        });
    }
    let quota = match &pool {
        Ok(pool) if pool.quota.enforces() => {
            let dir = pool.open_unguarded()?;
            pool.quota
                .usage(dir.as_fd(), id)
                .map_err(crate::ops::expand::quota_error)?
        }
        _ => None,
    };
    let fs_bytes = Counts {
        total: fs.f_blocks.saturating_mul(fs.f_frsize),
        available: fs.f_bavail.saturating_mul(fs.f_frsize),
    };
    let fs_inodes = Counts {
        total: fs.f_files,
        available: fs.f_favail,
    };
    let usage = match quota {
        // The backend keeps the numbers: O(1), and measured against the volume's own limit.
        Some(q) => {
            let mut usage = vec![fs_bytes.against(q.used_bytes, q.limit_bytes, csi::volume_usage::Unit::Bytes)];
            if let Some(used) = q.used_inodes {
                usage.push(fs_inodes.against(used, q.limit_inodes.unwrap_or(0), csi::volume_usage::Unit::Inodes));
            }
            usage
        }
        None => {
            let (used_bytes, used_inodes) = fsops::usage(path_fd.as_fd())?;
            vec![
                fs_bytes.against(used_bytes, 0, csi::volume_usage::Unit::Bytes),
                fs_inodes.against(used_inodes, 0, csi::volume_usage::Unit::Inodes),
            ]
        }
    };
    Ok(csi::NodeGetVolumeStatsResponse {
        usage,
        volume_condition: Some(condition),
    })
}

/// Size and free room of the filesystem a volume lives on, in one unit.
struct Counts {
    total: u64,
    available: u64,
}

impl Counts {
    /// Usage of `used` against the volume's `limit` (0 = none: the filesystem's numbers). The
    /// room left is never more than the filesystem has free.
    fn against(&self, used: u64, limit: u64, unit: csi::volume_usage::Unit) -> csi::VolumeUsage {
        let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let (total, available) = match limit {
            0 => (self.total, self.available),
            limit => (limit, limit.saturating_sub(used).min(self.available)),
        };
        csi::VolumeUsage {
            available: clamp(available),
            total: clamp(total),
            used: clamp(used),
            unit: unit as i32,
        }
    }
}

fn node_cap(t: Cap) -> csi::NodeServiceCapability {
    csi::NodeServiceCapability {
        r#type: Some(csi::node_service_capability::Type::Rpc(
            csi::node_service_capability::Rpc { r#type: t as i32 },
        )),
    }
}

impl NodeService {
    async fn publish_inner(&self, req: csi::NodePublishVolumeRequest) -> Result<()> {
        let id = check_id("volume_id", &req.volume_id)?.to_owned();
        record("volume_id", &id);
        let target = canonical(check_target_path("target_path", &req.target_path)?);
        let cap = req
            .volume_capability
            .as_ref()
            .ok_or_else(|| Error::InvalidArgument("volume_capability is required".into()))?;
        if let Some(why) = caps::unsupported(cap) {
            return Err(Error::InvalidArgument(why));
        }
        let flags = match &cap.access_type {
            Some(AccessType::Mount(m)) => m.mount_flags.clone(),
            _ => Vec::new(),
        };
        let opts = BindOptions::parse(&flags, req.readonly)?;
        check_target_outside_pools(&self.state, &target)?;
        let ephemeral = req
            .volume_context
            .get(EPHEMERAL_CONTEXT_KEY)
            .is_some_and(|v| v == "true");
        let pool = if ephemeral || req.volume_context.contains_key(hpp_api::constants::PARAM_STORAGE_POOL) {
            self.state.pool_for(&req.volume_context)?.clone()
        } else {
            let state = self.state.clone();
            let id2 = id.clone();
            blocking(move || {
                for pool in &state.pools {
                    if !pool.is_reserved(&id2) && volumes::exists(pool, &id2).unwrap_or(false) {
                        return Ok(pool.clone());
                    }
                }
                Err(Error::NotFound(format!(
                    "volume {id2} does not exist on node {}",
                    state.node_id
                )))
            })
            .await?
        };
        pool.check_volume_name(&id)?;
        let ephemeral_bytes = if ephemeral {
            check_ephemeral_allowed(&pool, &req.volume_context)?
        } else {
            0
        };
        // Two publishes of an image volume at once could both attach it: they take turns.
        let guard = match pool.quota.layout() {
            Layout::Directory => self
                .state
                .inflight
                .acquire(&[target_key(&target)], &[volume_key(&id)])?,
            Layout::Image(_) => self
                .state
                .inflight
                .acquire(&[target_key(&target), volume_key(&id)], &[])?,
        };
        let p = Publish {
            id,
            pool,
            target,
            opts,
            ephemeral,
            ephemeral_bytes,
        };
        let state = self.state.clone();
        blocking_locked(guard, move || {
            // Never publish the shadow directory of an unmounted guarded pool.
            if p.ephemeral || p.pool.require_mount_point {
                let h = p.pool.measure();
                if let Some(reason) = h.reason {
                    return Err(Error::FailedPrecondition(reason));
                }
            }
            publish(&p, &state.mounts)?;
            tracing::info!(volume_id = %p.id, target = %p.target.display(), read_only = p.opts.read_only(), "volume published");
            Ok(())
        })
        .await
    }

    async fn unpublish_inner(&self, req: csi::NodeUnpublishVolumeRequest) -> Result<()> {
        let id = check_id("volume_id", &req.volume_id)?.to_owned();
        record("volume_id", &id);
        let target = canonical(check_target_path("target_path", &req.target_path)?);
        check_target_outside_pools(&self.state, &target)?;
        let guard = self.state.inflight.acquire(&[target_key(&target)], &[])?;
        let state = self.state.clone();
        blocking_locked(guard, move || unpublish(&state, &id, &target)).await
    }

    async fn expand_inner(&self, req: csi::NodeExpandVolumeRequest) -> Result<csi::NodeExpandVolumeResponse> {
        let id = check_id("volume_id", &req.volume_id)?.to_owned();
        record("volume_id", &id);
        let path = published_path(&req.volume_path)?;
        let range = crate::ops::sizing::Range::parse(req.capacity_range.as_ref())?;
        if let Some(why) = req.volume_capability.as_ref().and_then(caps::unsupported) {
            return Err(Error::InvalidArgument(why));
        }
        // Raising the limit here (node mode) takes the volume's lock, as the controller does.
        let raises = self.state.expansion == ExpansionMode::Node;
        let guard = match raises {
            true => self
                .state
                .inflight
                .acquire(&[target_key(&path), volume_key(&id)], &[])?,
            false => self.state.inflight.acquire(&[target_key(&path)], &[volume_key(&id)])?,
        };
        let state = self.state.clone();
        let capacity = blocking_locked(guard, move || {
            let pool = state
                .pools
                .iter()
                .find(|p| holds_volume(p, &id))
                .ok_or_else(|| Error::NotFound(format!("volume {id} does not exist on node {}", state.node_id)))?;
            let health = match raises {
                true => Some(crate::service::controller::require_usable(pool)?),
                false => None,
            };
            let raise = health.as_ref().map(|h| (&state.ledger, h));
            crate::ops::expand::node_expand(pool, &id, &path, range, raise)
        })
        .await?;
        Ok(csi::NodeExpandVolumeResponse {
            capacity_bytes: i64::try_from(capacity).unwrap_or(i64::MAX),
        })
    }

    async fn stats_inner(&self, req: csi::NodeGetVolumeStatsRequest) -> Result<csi::NodeGetVolumeStatsResponse> {
        let id = check_id("volume_id", &req.volume_id)?.to_owned();
        record("volume_id", &id);
        let state = self.state.clone();
        blocking(move || {
            // Resolving the path stats its parents: kubelet polls this for every volume, so it
            // stays off the async worker with the rest.
            let path = published_path(&req.volume_path)?;
            let pool = state.pools.iter().find(|p| holds_volume(p, &id)).cloned();
            let found = match pool {
                Some(pool) => Ok(pool),
                None => Err(missing_volume_reason(&state, &id)?),
            };
            volume_stats(found, &id, &path, &state.mounts)
        })
        .await
    }
}

#[tonic::async_trait]
impl csi::node_server::Node for NodeService {
    async fn node_publish_volume(
        &self,
        req: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        self.publish_inner(req.into_inner()).await?;
        Ok(Response::new(csi::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        req: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        self.unpublish_inner(req.into_inner()).await?;
        Ok(Response::new(csi::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        req: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        Ok(Response::new(self.stats_inner(req.into_inner()).await?))
    }

    async fn node_expand_volume(
        &self,
        req: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        Ok(Response::new(self.expand_inner(req.into_inner()).await?))
    }

    async fn node_get_capabilities(
        &self,
        _req: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        Ok(Response::new(csi::NodeGetCapabilitiesResponse {
            capabilities: vec![
                node_cap(Cap::GetVolumeStats),
                node_cap(Cap::VolumeCondition),
                node_cap(Cap::ExpandVolume),
            ],
        }))
    }

    async fn node_get_info(
        &self,
        _req: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: self.state.node_id.clone(),
            max_volumes_per_node: 0,
            accessible_topology: Some(self.state.topology()),
        }))
    }
}
