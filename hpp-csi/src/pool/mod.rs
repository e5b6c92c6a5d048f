//! What a pool is: a storage pool at run time ([`Pool`]: its directory, which names in it are
//! volumes, its health: mount guard, capacity, shared-with-OS detection), and what works on it
//! without knowing what a volume operation is: symlink-safe primitives ([`fsops`]), name
//! checks ([`validate`]), per-volume locks ([`inflight`]), the thread that runs its short jobs
//! ([`lane`]), and quota limits applied after a copy ([`deferred_quota`]).

pub mod deferred_quota;
pub mod fsops;
pub mod inflight;
pub mod lane;
pub mod validate;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use hpp_api::quota::QuotaMode;
use hpp_fs::group_sync::GroupSync;
use hpp_fs::journal::Journal;
use hpp_fs::quota::{QuotaBackend, QuotaError, Unlimited};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use crate::config::{ConfigError, PoolConfig};
use crate::error::{Error, Result};

use crate::mountinfo::MountTable;
// The one reference upward: the pool keeps its volume journal's state (shared by every clone of
// the pool), whose replay is a volume operation.
use crate::ops::volume_journal::VolumeJournal;
use crate::pool::lane::Lane;
use crate::pool::validate::INTERNAL_PREFIX;

/// Names inside a pool that are never volumes even though they look like one.
const ALWAYS_RESERVED: &[&str] = &["lost+found"];

/// A configured pool, with paths made absolute.
#[derive(Debug, Clone)]
pub struct Pool {
    /// Pool name.
    pub name: String,
    /// Absolute, symlink-free path of the pool directory.
    pub path: PathBuf,
    /// Absolute path of the snapshot directory, when snapshots are enabled.
    pub snapshot_path: Option<PathBuf>,
    /// Volumes carry no topology.
    pub shared: bool,
    /// Mount guard on.
    pub require_mount_point: bool,
    /// Inline ephemeral volumes allowed.
    pub ephemeral: bool,
    /// Cap on an ephemeral volume's requested `size`.
    pub ephemeral_max_bytes: Option<u64>,
    /// How volume sizes are enforced (configured mode).
    pub quota_mode: QuotaMode,
    /// The backend that enforces them; [`Unlimited`] for `none`.
    pub quota: Arc<dyn QuotaBackend>,
    /// Share of the filesystem that may be promised to volume limits, in percent.
    pub overcommit_percent: u32,
    /// Deleted volumes go to the pool's trash for this long (`None`: removed at once).
    pub trash: Option<hpp_fs::trash::Settings>,
    /// Child names of `path` that belong to other pools or snapshot directories (KubeVirt's
    /// operator puts `snapshotPath` at `<pool>/snapshots`).
    reserved: BTreeSet<String>,
    /// Group commit of the pool directory (volumes appearing and disappearing).
    volume_commits: Arc<Commits>,
    /// Group commit of the snapshot directory.
    snapshot_commits: Arc<Commits>,
    /// The last measurement and when it was taken (shared by every clone of this pool).
    last_measured: Arc<Mutex<Option<(Instant, PoolHealth)>>>,
    /// The volume journal, opened on first use (shared by every clone of this pool).
    journal: Arc<VolumeJournal>,
    /// The thread that runs the pool's empty-volume creates (shared by every clone).
    lane: Arc<Lane>,
    /// Measured sizes of the trash's entries (shared by every clone).
    trash_book: Arc<TrashBook>,
}

/// Per-pool memory of the trash: the measured size of each entry (a walk each), so listings
/// and the gauges do not walk the trash again.
#[derive(Debug, Default)]
pub struct TrashBook {
    sizes: Mutex<HashMap<String, u64>>,
}

impl TrashBook {
    pub(crate) fn size(&self, entry: &str) -> Option<u64> {
        self.sizes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(entry)
            .copied()
    }

    pub(crate) fn keep_only(&self, present: &[String]) {
        let mut sizes = self.sizes.lock().unwrap_or_else(PoisonError::into_inner);
        sizes.retain(|k, _| present.iter().any(|p| p == k));
    }

    pub(crate) fn note(&self, entry: &str, bytes: u64) {
        self.sizes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(entry.to_owned(), bytes);
    }
}

/// What changes when an entry of the pool directory is made, removed or renamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DirStamp {
    dev: u64,
    ino: u64,
    nlink: u64,
    mtime: (i128, i128),
    ctime: (i128, i128),
}

/// Shared syncs of one directory: its entries (`fsync` of the directory) and the data written
/// below it (`syncfs`, for copies).
#[derive(Debug, Default)]
pub struct Commits {
    entries: GroupSync,
    data: GroupSync,
}

impl Commits {
    /// Makes every entry change in `dir` made before this call durable (shared `fsync`).
    pub fn entries(&self, dir: BorrowedFd<'_>) -> Result<()> {
        self.entries
            .commit(|| rustix::fs::fsync(dir))
            .map_err(|e| Error::io("syncing the directory", e))
    }

    /// Makes every file written on `fd`'s filesystem before this call durable (shared `syncfs`).
    pub fn data(&self, fd: BorrowedFd<'_>) -> Result<()> {
        self.data
            .commit(|| rustix::fs::syncfs(fd))
            .map_err(|e| Error::io("syncing copied data", e))
    }
}

/// Health and capacity of a pool at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolHealth {
    /// Volumes can be created and served.
    pub usable: bool,
    /// Why not, for logs, Probe and VolumeCondition.
    pub reason: Option<String>,
    /// Whether the pool path is a mount point.
    pub mount_point: bool,
    /// Filesystem size in bytes.
    pub total_bytes: u64,
    /// Bytes available to unprivileged writers.
    pub available_bytes: u64,
    /// Total inodes.
    pub total_inodes: u64,
    /// Free inodes.
    pub free_inodes: u64,
}

impl Pool {
    /// Resolves the pool's path, making its directory where that is safe (see
    /// [`DirCreation`]); what may be made is [`DirCreation::LastComponent`].
    pub fn prepare(cfg: &PoolConfig) -> Result<Pool, ConfigError> {
        Self::prepare_with(cfg, DirCreation::LastComponent)
    }

    /// [`prepare`](Self::prepare), making at most what `create` allows: [`Pool::plan`], then
    /// [`Planned::finish`].
    pub fn prepare_with(cfg: &PoolConfig, create: DirCreation) -> Result<Pool, ConfigError> {
        Self::plan(cfg, create)?.finish()
    }

    /// Every check of a pool that can refuse it (its path, its quota backend), with nothing
    /// made yet: a refused pool leaves no trace. A guarded pool that is not mounted yet is
    /// accepted with nothing to make: it reports itself unusable instead of stopping the
    /// driver, which keeps the other pools serving, and serves once mounted.
    pub fn plan(cfg: &PoolConfig, create: DirCreation) -> Result<Planned, ConfigError> {
        let path = absolute(&cfg.path).map_err(|cause| ConfigError::Io {
            pool: cfg.name.clone(),
            path: cfg.path.clone(),
            cause,
        })?;
        let make = dir_plan(cfg, &path, create)?;
        let snapshot_path = match &cfg.snapshot_path {
            Some(p) => {
                let p = absolute(p).map_err(|cause| ConfigError::Io {
                    pool: cfg.name.clone(),
                    path: p.clone(),
                    cause,
                })?;
                Some(std::fs::canonicalize(&p).unwrap_or(p))
            }
            None => None,
        };
        // A directory still to make is judged by the filesystem it will be made on.
        let probe = match make {
            Some(_) => nearest_existing(&path),
            None => path.clone(),
        };
        let quota = quota_backend(cfg, &path, &probe)?;
        let pool = Pool {
            name: cfg.name.clone(),
            path,
            snapshot_path,
            shared: cfg.shared,
            require_mount_point: cfg.require_mount_point,
            ephemeral: cfg.ephemeral,
            ephemeral_max_bytes: cfg.ephemeral_max_bytes,
            quota_mode: cfg.quota,
            quota,
            overcommit_percent: cfg.overcommit_percent,
            trash: cfg.trash_retention.map(|retention| hpp_fs::trash::Settings {
                retention,
                min_free_percent: cfg
                    .trash_min_free_percent
                    .unwrap_or(crate::config::DEFAULT_TRASH_MIN_FREE_PERCENT),
            }),
            reserved: BTreeSet::new(),
            volume_commits: Arc::default(),
            snapshot_commits: Arc::default(),
            last_measured: Arc::default(),
            journal: Arc::default(),
            lane: Arc::default(),
            trash_book: Arc::default(),
        };
        Ok(Planned { pool, make })
    }

    /// The pool directory's stamp now: it changes with every entry made, removed or renamed
    /// in it, so a listing or a scan stamped with it can tell whether it is still current.
    #[allow(clippy::useless_conversion)] // the stat field types differ between architectures
    pub(crate) fn stamp(&self) -> Result<DirStamp> {
        let dir = self.open()?;
        let st = rustix::fs::fstat(&dir).map_err(|e| Error::io(format!("stat of storage pool {}", self.name), e))?;
        Ok(DirStamp {
            // Field types differ between architectures; every one fits these.
            dev: u64::from(st.st_dev),
            ino: u64::from(st.st_ino),
            nlink: u64::from(st.st_nlink),
            mtime: (i128::from(st.st_mtime), i128::from(st.st_mtime_nsec)),
            ctime: (i128::from(st.st_ctime), i128::from(st.st_ctime_nsec)),
        })
    }

    /// What is known of the trash's entries.
    pub(crate) fn trash_book(&self) -> &TrashBook {
        &self.trash_book
    }

    /// Group commit of the pool directory: every create and delete syncs through it.
    pub fn volume_commits(&self) -> &Commits {
        &self.volume_commits
    }

    /// The pool's volume journal (`None`: creates and deletes sync the directory instead). The
    /// first call after a start redoes what a crash lost; see [`crate::ops::volume_journal`].
    pub fn journal(&self) -> Result<Option<Arc<Journal>>> {
        self.journal_in(self.open()?.as_fd())
    }

    /// [`journal`](Self::journal) through the caller's descriptor of the pool directory (so
    /// the journal is the one of the filesystem the caller is about to change).
    pub fn journal_in(&self, dir: BorrowedFd<'_>) -> Result<Option<Arc<Journal>>> {
        self.journal.get(self, dir)
    }

    /// The pool's lane, for short filesystem jobs ([`crate::pool::lane`]).
    pub fn lane(&self) -> &Lane {
        &self.lane
    }

    pub(crate) fn journal_state(&self) -> &Arc<VolumeJournal> {
        &self.journal
    }

    /// Checkpoints the open journal (`syncfs`, then a new epoch), so nothing is left to redo;
    /// failures are logged. For a clean stop, after the last request.
    pub fn retire_journal(&self) {
        if let Err(e) = self.open().and_then(|dir| self.journal.checkpoint_open(dir.as_fd())) {
            tracing::warn!(pool = %self.name, error = %e, "cannot checkpoint the volume journal; the next start redoes its records");
        }
    }

    /// The volume journal's flushes and the records they made durable, since the start.
    pub fn journal_stats(&self) -> hpp_fs::journal::JournalStats {
        self.journal.stats()
    }

    /// Whether creates and deletes are made durable through the journal right now (it is open).
    pub fn journal_in_use(&self) -> bool {
        self.journal.is_open()
    }

    /// Group commit of the snapshot directory.
    pub fn snapshot_commits(&self) -> &Commits {
        &self.snapshot_commits
    }

    /// Records every other pool and snapshot directory nested in this pool as reserved.
    pub fn reserve_nested(pools: &mut [Pool]) {
        let all: Vec<PathBuf> = pools
            .iter()
            .flat_map(|p| std::iter::once(p.path.clone()).chain(p.snapshot_path.clone()))
            .collect();
        for pool in pools.iter_mut() {
            for other in &all {
                if let Ok(rel) = other.strip_prefix(&pool.path)
                    && let Some(Component::Normal(first)) = rel.components().next()
                {
                    pool.reserved.insert(first.to_string_lossy().into_owned());
                }
            }
        }
    }

    /// Whether `name` (already a valid id) is reserved in this pool.
    pub fn is_reserved(&self, name: &str) -> bool {
        self.reserved.contains(name) || ALWAYS_RESERVED.contains(&name)
    }

    /// Checks that `id` may name a volume in this pool.
    pub fn check_volume_name(&self, id: &str) -> Result<()> {
        validate::check_id("volume id", id)?;
        if self.is_reserved(id) {
            return Err(Error::InvalidArgument(format!(
                "{id:?} is reserved in storage pool {} (a snapshot or pool directory)",
                self.name
            )));
        }
        Ok(())
    }

    /// Opens the pool directory. With the mount guard on, the opened descriptor itself must be
    /// the root of a mount (checked on the descriptor, not the path, so a mount or unmount
    /// between check and use cannot swap what the caller works in): every operation then works
    /// through this one descriptor.
    pub fn open(&self) -> Result<OwnedFd> {
        let fd = self.open_unguarded()?;
        if self.require_mount_point {
            let root = match fsops::fd_is_mount_root(fd.as_fd()) {
                Some(r) => r,
                None => MountTable::read()
                    .map_err(|e| Error::io("reading mount table", e))?
                    .is_mount_point(&self.path),
            };
            if !root {
                return Err(Error::FailedPrecondition(format!(
                    "storage pool {} requires {} to be a mount point and nothing is mounted there; \
                     refusing to place data on the underlying (root) filesystem",
                    self.name,
                    self.path.display()
                )));
            }
        }
        Ok(fd)
    }

    /// Opens the pool directory without the mount guard: only for looking (health, whether a
    /// volume exists for reporting), never for placing or serving data.
    pub(crate) fn open_unguarded(&self) -> Result<OwnedFd> {
        fsops::open_dir_path(&self.path).map_err(|e| match e {
            Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => Error::Unavailable(format!(
                "storage pool {} directory {} does not exist",
                self.name,
                self.path.display()
            )),
            other => other,
        })
    }

    /// Path of volume `id` (for logs and mount sources; never used to resolve anything).
    pub fn volume_path(&self, id: &str) -> PathBuf {
        self.path.join(id)
    }

    /// Volume ids in this pool: real directories with valid, unreserved names. Temporaries,
    /// hidden entries, symlinks and files are not volumes.
    pub fn list_volumes(&self) -> Result<Vec<String>> {
        let mut out = Vec::new();
        self.visit_volumes(|id| out.push(id.to_owned()))?;
        Ok(out)
    }

    /// Calls `visit` with each of [`list_volumes`](Self::list_volumes)' ids, without
    /// collecting them: a caller keeping its own copy (the ListVolumes view) does not hold two.
    pub fn visit_volumes(&self, mut visit: impl FnMut(&str)) -> Result<()> {
        let dir = self.open()?;
        // The directory's own entry types decide where the filesystem gives them (ext4, XFS,
        // btrfs do): one stat per volume less. Only an unknown type is asked with a stat.
        let unknown = fsops::list_names_where(dir.as_fd(), |name, ty| {
            if name.starts_with(INTERNAL_PREFIX) || self.check_volume_name(name).is_err() {
                return false;
            }
            match ty {
                rustix::fs::FileType::Directory => visit(name),
                rustix::fs::FileType::Unknown => return true,
                _ => {}
            }
            false
        })
        .map_err(|e| Error::io("listing pool", e))?;
        for name in unknown {
            if let Ok(fsops::Entry::Dir { .. }) = fsops::entry(dir.as_fd(), &name) {
                visit(&name);
            }
        }
        Ok(())
    }

    /// Measures the pool: exists, mount guard satisfied, statvfs numbers. Whether the pool is a
    /// mount point is asked of the opened directory (`statx`); `mounts` answers only on kernels
    /// that cannot say.
    pub fn health(&self, mounts: &MountTable) -> PoolHealth {
        self.health_with(|| mounts.is_mount_point(&self.path))
    }

    /// [`health`](Self::health) without a mount table at hand: one is read only if the kernel
    /// cannot tell from the opened directory. This is what each request measures, so a node
    /// with thousands of mounts does not parse them all for every CreateVolume.
    pub fn measure(&self) -> PoolHealth {
        self.health_with(|| fsops::listed_as_mount_point(&self.path))
    }

    /// [`measure`](Self::measure), also returning the directory it opened when the pool is
    /// usable: it passed the mount guard [`open`](Self::open) applies, so a request can work
    /// through it instead of opening the pool again.
    pub fn measure_open(&self) -> (PoolHealth, Option<OwnedFd>) {
        self.measure_kept(|| fsops::listed_as_mount_point(&self.path))
    }

    /// The last measurement if it is at most `max_age` old. Every measurement is kept, the
    /// background one after each mount-table change included, so a pool that breaks is seen
    /// within `max_age` or at once after an unmount.
    pub fn recent_health(&self, max_age: Duration) -> Option<PoolHealth> {
        let last = self.last_measured.lock().unwrap_or_else(PoisonError::into_inner);
        last.as_ref()
            .filter(|(at, _)| at.elapsed() <= max_age)
            .map(|(_, h)| h.clone())
    }

    fn health_with(&self, in_mount_table: impl FnOnce() -> bool) -> PoolHealth {
        self.measure_kept(in_mount_table).0
    }

    /// [`measure_now`](Self::measure_now), keeping the result for [`recent_health`](Self::recent_health).
    fn measure_kept(&self, in_mount_table: impl FnOnce() -> bool) -> (PoolHealth, Option<OwnedFd>) {
        let started = Instant::now();
        let (h, dir) = self.measure_now(in_mount_table);
        self.remember(started, &h);
        (h, dir)
    }

    /// Keeps `h`, measured from `started` on, unless a measurement begun later is already kept:
    /// a slow one (a request's, a hung filesystem's) must not replace what a newer one saw.
    fn remember(&self, started: Instant, h: &PoolHealth) {
        let mut last = self.last_measured.lock().unwrap_or_else(PoisonError::into_inner);
        if last.as_ref().is_none_or(|(at, _)| *at <= started) {
            *last = Some((started, h.clone()));
        }
    }

    /// The pool's health, and its directory when usable.
    fn measure_now(&self, in_mount_table: impl FnOnce() -> bool) -> (PoolHealth, Option<OwnedFd>) {
        let mut h = PoolHealth::default();
        let dir = match self.open_unguarded() {
            Ok(d) => d,
            Err(e) => {
                h.reason = Some(e.to_string());
                return (h, None);
            }
        };
        h.mount_point = fsops::fd_is_mount_root(dir.as_fd()).unwrap_or_else(in_mount_table);
        if self.require_mount_point && !h.mount_point {
            h.reason = Some(format!(
                "storage pool {} requires {} to be a mount point and nothing is mounted there; \
                 refusing to place data on the underlying (root) filesystem",
                self.name,
                self.path.display()
            ));
            return (h, None);
        }
        match rustix::fs::fstatvfs(dir.as_fd()) {
            Ok(st) => {
                h.total_bytes = st.f_blocks.saturating_mul(st.f_frsize);
                h.available_bytes = st.f_bavail.saturating_mul(st.f_frsize);
                h.total_inodes = st.f_files;
                h.free_inodes = st.f_favail;
                h.usable = true;
                (h, Some(dir))
            }
            Err(e) => {
                h.reason = Some(format!("statvfs of storage pool {}: {e}", self.name));
                (h, None)
            }
        }
    }

    /// Whether the pool lives on the same device as `os_path` (the root disk).
    pub fn shares_device_with(&self, mounts: &MountTable, os_path: &Path) -> bool {
        match (mounts.fs_location(&self.path), mounts.fs_location(os_path)) {
            (Some((a, _)), Some((b, _))) => a == b,
            _ => false,
        }
    }
}

/// The backend for a pool's configured quota mode; `auto` resolved by [`auto_mode`] and
/// logged. An explicitly configured backend that cannot work on the pool's filesystem is a
/// configuration error; `auto` falls back to `none` instead.
///
/// A guarded pool that is not mounted yet gets its backend once it is
/// ([`crate::pool::deferred_quota`]): what sits at its path now is not its filesystem.
///
/// `probe` is where the backend looks at the filesystem: the pool's path, or the closest
/// existing ancestor of a directory not made yet.
fn quota_backend(cfg: &PoolConfig, path: &Path, probe: &Path) -> Result<Arc<dyn QuotaBackend>, ConfigError> {
    let waiting_for_mount = cfg.require_mount_point && cfg.quota != QuotaMode::None && !fsops::is_mount_point(path);
    if waiting_for_mount {
        tracing::info!(pool = %cfg.name, quota = %cfg.quota, "pool not mounted yet; its quota backend is set up once it is");
        return Ok(Arc::new(crate::pool::deferred_quota::Deferred::new(
            &cfg.name, cfg.quota, path,
        )));
    }
    build_quota_backend(&cfg.name, cfg.quota, probe)
}

/// The quota backend `configured` for the pool `pool` at `path` (also used by the legacy
/// provisioner for its node-local base directory).
pub fn build_quota_backend(
    pool: &str,
    configured: QuotaMode,
    path: &Path,
) -> Result<Arc<dyn QuotaBackend>, ConfigError> {
    if configured == QuotaMode::None {
        return Ok(Arc::new(Unlimited));
    }
    let mode = match configured {
        QuotaMode::Auto => {
            let dir = fsops::open_dir_path(path).ok();
            let btrfs = dir
                .as_ref()
                .is_some_and(|d| hpp_sys::btrfs::is_btrfs(d.as_fd()).unwrap_or(false));
            let table = MountTable::read().ok();
            let mount = table.as_ref().and_then(|t| t.containing(path));
            let mode = auto_mode(btrfs, mount);
            tracing::info!(pool = %pool, path = %path.display(), quota = %mode, "quota mode auto resolved");
            mode
        }
        m => m,
    };
    match build_backend(pool, mode, path) {
        Ok(b) => Ok(b),
        Err(e) if configured == QuotaMode::Auto => {
            tracing::warn!(pool = %pool, quota = %mode, error = %e, "quota backend unavailable; volumes are not size-limited");
            Ok(Arc::new(Unlimited))
        }
        Err(e) => Err(e),
    }
}

fn build_backend(pool: &str, mode: QuotaMode, path: &Path) -> Result<Arc<dyn QuotaBackend>, ConfigError> {
    let quota_err = |cause| ConfigError::Quota {
        pool: pool.to_owned(),
        mode,
        cause,
    };
    match mode {
        QuotaMode::None | QuotaMode::Auto => Ok(Arc::new(Unlimited)),
        QuotaMode::Btrfs => {
            let dir = open_pool_dir(path).map_err(quota_err)?;
            let backend = hpp_fs::quota::Btrfs::open(dir.as_fd()).map_err(quota_err)?;
            tracing::info!(pool = %pool, "volumes are btrfs subvolumes limited by qgroups");
            Ok(Arc::new(backend))
        }
        QuotaMode::Image => {
            let backend = hpp_fs::quota::Image::new(hpp_fs::quota::ImageFs::Ext4);
            backend.check_tools().map_err(quota_err)?;
            tracing::info!(pool = %pool, "volumes are ext4 images, loop-mounted at publish");
            Ok(Arc::new(backend))
        }
        QuotaMode::XfsProject | QuotaMode::Ext4Project => {
            let fs = if mode == QuotaMode::XfsProject {
                hpp_fs::quota::ProjectFs::Xfs
            } else {
                hpp_fs::quota::ProjectFs::Ext4
            };
            let dir = open_pool_dir(path).map_err(quota_err)?;
            let backend = hpp_fs::quota::Project::open(dir.as_fd(), fs).map_err(quota_err)?;
            tracing::info!(pool = %pool, quota = %mode, "volumes get a project id each, limited by project quota");
            Ok(Arc::new(backend))
        }
    }
}

/// Opens the pool directory for a backend's checks.
fn open_pool_dir(path: &Path) -> Result<OwnedFd, QuotaError> {
    rustix::fs::open(
        path,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| QuotaError::Io {
        op: format!("opening {}", path.display()),
        source: e.into(),
    })
}

/// What `auto` means for a pool: btrfs on btrfs, the filesystem's project quota where it is
/// mounted with `prjquota`, else none.
pub fn auto_mode(is_btrfs: bool, mount: Option<&crate::mountinfo::Mount>) -> QuotaMode {
    if is_btrfs {
        return QuotaMode::Btrfs;
    }
    match mount {
        Some(m) if m.project_quota() && m.fs_type == "xfs" => QuotaMode::XfsProject,
        Some(m) if m.project_quota() && m.fs_type == "ext4" => QuotaMode::Ext4Project,
        _ => QuotaMode::None,
    }
}

/// KubeVirt's rounding of a pool's size: whole GiB from 10 GiB up, whole MiB from 10 MiB up.
pub fn round_capacity(bytes: u64) -> u64 {
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    if bytes >= 10 * GIB {
        bytes / GIB * GIB
    } else if bytes >= 10 * MIB {
        bytes / MIB * MIB
    } else {
        bytes
    }
}

fn absolute(p: &Path) -> std::io::Result<PathBuf> {
    if p.is_absolute() {
        Ok(p.to_path_buf())
    } else {
        Ok(std::env::current_dir()?.join(p))
    }
}

/// What the driver may make of a pool directory that does not exist.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DirCreation {
    /// The directory itself, when its parent exists: KubeVirt's layout mounts a hostPath at
    /// `/csi-data-dir` and serves `/csi-data-dir/csi`, which the driver makes on first start.
    #[default]
    LastComponent,
    /// The directory and its missing parents (`--create-pool-parents`, `--datadir-root`).
    WithParents,
}

/// A pool checked by [`Pool::plan`], its directory not made yet.
#[derive(Debug)]
pub struct Planned {
    pool: Pool,
    /// The directory to make: `Some(true)` with its parents.
    make: Option<bool>,
}

impl Planned {
    /// Makes the pool directory (mode 0750, like KubeVirt) if it was missing, and resolves the
    /// pool's path.
    pub fn finish(mut self) -> Result<Pool, ConfigError> {
        if let Some(parents) = self.make {
            create_dir_mode(&self.pool.path, 0o750, parents).map_err(|cause| ConfigError::Io {
                pool: self.pool.name.clone(),
                path: self.pool.path.clone(),
                cause,
            })?;
            tracing::info!(pool = %self.pool.name, path = %self.pool.path.display(), "created the storage pool directory");
        }
        if let Ok(resolved) = std::fs::canonicalize(&self.pool.path) {
            self.pool.path = resolved;
        }
        Ok(self.pool)
    }
}

/// Whether the pool directory must be made (`Some(parents too)`), or an error when the driver
/// must not make it. A guarded pool (`requireMountPoint`) is never made: its directory is where
/// a disk gets mounted, and making it would only put an empty directory on the underlying
/// (root) filesystem; it waits, unusable, until something is mounted there.
fn dir_plan(cfg: &PoolConfig, path: &Path, create: DirCreation) -> Result<Option<bool>, ConfigError> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => return Ok(None),
        Ok(_) => {
            return Err(ConfigError::NotADirectory {
                pool: cfg.name.clone(),
                path: path.to_path_buf(),
            });
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(cause) => {
            return Err(ConfigError::Io {
                pool: cfg.name.clone(),
                path: path.to_path_buf(),
                cause,
            });
        }
    }
    if cfg.require_mount_point {
        tracing::info!(pool = %cfg.name, path = %path.display(), "the guarded storage pool's directory does not exist and is not made; the pool serves once a filesystem is mounted there");
        return Ok(None);
    }
    let parent = path.parent().unwrap_or(path);
    match (parent.is_dir(), create) {
        (true, _) => Ok(Some(false)),
        (false, DirCreation::WithParents) => Ok(Some(true)),
        (false, DirCreation::LastComponent) => Err(ConfigError::PathMissing {
            pool: cfg.name.clone(),
            path: path.to_path_buf(),
            parent: parent.to_path_buf(),
        }),
    }
}

/// The closest ancestor of `path` that exists (`/` at worst).
fn nearest_existing(path: &Path) -> PathBuf {
    path.ancestors()
        .find(|p| p.is_dir())
        .unwrap_or(Path::new("/"))
        .to_path_buf()
}

fn create_dir_mode(path: &Path, mode: u32, parents: bool) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().recursive(parents).mode(mode).create(path) {
        // Made meanwhile by someone else: what was wanted.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && path.is_dir() => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn auto_picks_btrfs_then_project_quota_then_none() {
        let table = MountTable::parse(
            "50 22 253:0 / /x rw - xfs /dev/vg rw,prjquota\n\
             51 22 253:1 / /e rw - ext4 /dev/sdb rw,prjquota\n\
             52 22 253:2 / /p rw - ext4 /dev/sdc rw\n",
        );
        let at = |p: &str| table.containing(Path::new(p));
        assert_eq!(auto_mode(true, at("/p/pool")), QuotaMode::Btrfs);
        assert_eq!(auto_mode(false, at("/x/pool")), QuotaMode::XfsProject);
        assert_eq!(auto_mode(false, at("/e/pool")), QuotaMode::Ext4Project);
        assert_eq!(auto_mode(false, at("/p/pool")), QuotaMode::None);
        assert_eq!(auto_mode(false, None), QuotaMode::None);
    }

    #[test]
    fn a_backend_the_pool_cannot_use_is_a_clear_configuration_error() {
        let root = tempfile::tempdir().unwrap();
        if hpp_sys::btrfs::is_btrfs(std::fs::File::open(root.path()).unwrap().as_fd()).unwrap() {
            eprintln!("skipped: the temporary directory is on btrfs");
            return;
        }
        let mut cfg = PoolConfig::new("b", root.path().join("b"));
        cfg.quota = QuotaMode::Btrfs;
        let err = Pool::prepare(&cfg).unwrap_err();
        assert!(err.to_string().contains("btrfs"), "{err}");
        assert!(
            !root.path().join("b").exists(),
            "a refused pool leaves no directory behind"
        );
        cfg.quota = QuotaMode::XfsProject;
        let err = Pool::prepare(&cfg).unwrap_err();
        assert!(err.to_string().contains("prjquota"), "{err}");
        cfg.quota = QuotaMode::Auto;
        assert_eq!(Pool::prepare(&cfg).unwrap().quota.name(), "none");
    }

    #[test]
    fn a_measurement_begun_earlier_does_not_replace_a_later_one() {
        let root = tempfile::tempdir().unwrap();
        let pool = Pool::prepare(&PoolConfig::new("p", root.path().join("p"))).unwrap();
        let slow_start = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        let later = Instant::now();
        let fresh = PoolHealth {
            usable: false,
            reason: Some("unmounted".into()),
            ..PoolHealth::default()
        };
        pool.remember(later, &fresh);
        // A measurement that began before and finished after (a request's, on a slow disk).
        pool.remember(
            slow_start,
            &PoolHealth {
                usable: true,
                ..PoolHealth::default()
            },
        );
        assert_eq!(pool.recent_health(Duration::from_secs(60)), Some(fresh));
        let newer = pool.health(&MountTable::default());
        assert_eq!(pool.recent_health(Duration::from_secs(60)), Some(newer));
    }

    #[test]
    fn rounding_matches_kubevirt() {
        assert_eq!(round_capacity(5), 5);
        assert_eq!(round_capacity(10 * (1 << 20) + 7), 10 * (1 << 20));
        assert_eq!(round_capacity(11 * (1 << 30) + (1 << 29)), 11 * (1 << 30));
    }

    #[test]
    fn nested_snapshot_dir_is_reserved_and_not_listed() {
        let root = tempfile::tempdir().unwrap();
        let cfg = PoolConfig::new("legacy", root.path().join("csi")).with_snapshots(root.path().join("csi/snapshots"));
        std::fs::create_dir_all(root.path().join("csi/snapshots")).unwrap();
        std::fs::create_dir_all(root.path().join("csi/pvc-1")).unwrap();
        std::fs::create_dir_all(root.path().join("csi/.hpp-tmp-pvc-2")).unwrap();
        std::fs::write(root.path().join("csi/file"), b"").unwrap();
        std::os::unix::fs::symlink("/etc", root.path().join("csi/evil")).unwrap();
        let mut pools = vec![Pool::prepare(&cfg).unwrap()];
        Pool::reserve_nested(&mut pools);
        assert!(pools[0].is_reserved("snapshots"));
        assert_eq!(pools[0].list_volumes().unwrap(), vec!["pvc-1".to_owned()]);
        assert!(pools[0].check_volume_name("snapshots").is_err());
    }

    #[test]
    fn every_measurement_is_kept_for_answers_that_may_be_a_second_old() {
        let root = tempfile::tempdir().unwrap();
        let pool = Pool::prepare(&PoolConfig::new("p", root.path().join("p"))).unwrap();
        assert_eq!(
            pool.recent_health(Duration::from_secs(3600)),
            None,
            "nothing measured yet"
        );
        let measured = pool.measure();
        // Clones share it: handlers work on clones of the configured pool.
        assert_eq!(pool.clone().recent_health(Duration::from_secs(3600)), Some(measured));
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(pool.recent_health(Duration::from_millis(1)), None, "too old");
        std::fs::remove_dir(root.path().join("p")).unwrap();
        let gone = pool.health(&MountTable::parse(""));
        assert!(!gone.usable);
        assert_eq!(pool.recent_health(Duration::from_secs(3600)), Some(gone));
    }

    #[test]
    fn guarded_pool_without_mount_is_unusable() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("g")).unwrap();
        let pool = Pool::prepare(&PoolConfig::new("g", root.path().join("g")).require_mount_point(true)).unwrap();
        let h = pool.health(&MountTable::parse(""));
        assert!(!h.usable);
        assert!(h.reason.unwrap().contains("mount point"));
        let plain = Pool::prepare(&PoolConfig::new("p", root.path().join("p"))).unwrap();
        let h = plain.health(&MountTable::parse(""));
        assert!(h.usable && h.total_bytes > 0);
    }

    #[test]
    fn the_guard_is_checked_on_the_opened_descriptor() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("g");
        // The mount point exists (a guarded pool's directory is never made by the driver).
        std::fs::create_dir(&path).unwrap();
        let pool = Pool::prepare(&PoolConfig::new("g", &path).require_mount_point(true)).unwrap();
        assert!(matches!(pool.open(), Err(Error::FailedPrecondition(_))));
        if rustix::mount::mount("tmpfs", &path, "tmpfs", rustix::mount::MountFlags::empty(), c"size=1m").is_err() {
            eprintln!("skipping the mounted half: mounting tmpfs needs root");
            return;
        }
        let opened = pool.open().is_ok();
        // Measured from the opened directory, even against a mount table that knows nothing.
        let measured = pool.measure();
        let against_empty_table = pool.health(&MountTable::parse(""));
        rustix::mount::unmount(&path, rustix::mount::UnmountFlags::empty()).unwrap();
        assert!(opened, "the mounted pool passes the guard");
        assert!(measured.usable && measured.mount_point, "{measured:?}");
        assert!(against_empty_table.usable, "{against_empty_table:?}");
        assert!(!pool.measure().usable, "unmounted again");
    }
    #[test]
    fn a_missing_pool_directory_is_made_only_where_its_parent_exists() {
        let root = tempfile::tempdir().unwrap();
        // KubeVirt's layout: the hostPath is mounted, the pool is its `csi` child.
        let pool = Pool::prepare(&PoolConfig::new("k", root.path().join("csi"))).unwrap();
        assert!(root.path().join("csi").is_dir());
        assert_eq!(pool.path, std::fs::canonicalize(root.path().join("csi")).unwrap());

        let deep = root.path().join("typo/pools/a");
        let err = Pool::prepare(&PoolConfig::new("a", &deep)).unwrap_err();
        assert!(matches!(err, ConfigError::PathMissing { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains(&deep.display().to_string()) && text.contains("--create-pool-parents"),
            "{text}"
        );
        assert!(!root.path().join("typo").exists(), "nothing is made for a refused pool");

        Pool::prepare_with(&PoolConfig::new("a", &deep), DirCreation::WithParents).unwrap();
        assert!(deep.is_dir());

        std::fs::write(root.path().join("file"), b"").unwrap();
        let err = Pool::prepare(&PoolConfig::new("f", root.path().join("file"))).unwrap_err();
        assert!(matches!(err, ConfigError::NotADirectory { .. }), "{err}");
    }

    #[test]
    fn a_guarded_pool_directory_is_never_made() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("disk");
        for create in [DirCreation::LastComponent, DirCreation::WithParents] {
            let pool = Pool::prepare_with(&PoolConfig::new("g", &path).require_mount_point(true), create).unwrap();
            assert!(
                !path.exists(),
                "{create:?}: made the directory of a pool nothing is mounted at"
            );
            assert!(!pool.measure().usable);
        }
    }
}
