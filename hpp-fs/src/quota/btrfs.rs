//! The `btrfs` backend: every volume is a subvolume whose qgroup `0/<id>` carries the limit
//! on referenced bytes. Usage is read from the qgroup's sysfs counters (no tree walk), clones
//! and snapshots are subvolume snapshots (instant, copy-on-write), deletion destroys the
//! subvolume in one ioctl.
//!
//! The limit sits on a level-1 qgroup `1/<id>` that holds the volume's own qgroup `0/<id>`, so
//! it can also hold what a tenant makes inside the volume: `btrfs subvolume create` needs only
//! write permission on a directory, and a subvolume is a qgroup of its own whose data the
//! volume's qgroup would not count. How a nested subvolume joins `1/<id>`:
//!
//! - **Simple quotas** (Linux 6.7+; what a pool turns on when quotas are off): the kernel adds
//!   every new subvolume to the level-1 qgroup of the subvolume it is made in, in the same
//!   transaction. No window: data written into it counts at once, at any depth.
//! - **Full quotas** (a filesystem whose quotas were already on, as earlier hpp versions turned
//!   them on, or a kernel without simple quotas): limits stay on `0/<id>`, as before (moving a
//!   volume that shares extents with a clone into a new qgroup would leave the accounting
//!   inconsistent until a rescan). Every [`CONTAIN_INTERVAL`] the driver finds the subvolumes
//!   made inside volumes since its last look, at any depth, and limits each to what it holds
//!   then ([`QuotaBackend::contain_nested`]): nothing more can be written into it. What a tenant
//!   wrote into one before that stays (uncounted by the volume), so the window is at most that
//!   interval of writes.
//!
//! Snapshots and clones of a volume holding subvolumes are refused: a btrfs snapshot does not
//! include them, and a clone that silently lost data would be worse than none.
//!
//! Quotas are a filesystem-wide switch: a pool configured for btrfs turns them on when it is
//! opened (logged). A volume's qgroups are removed with it; a level-0 qgroup whose extents the
//! kernel is still dropping (or, with simple quotas, that a clone still shares) is removed by
//! the kernel itself once they are gone (Linux 6.7+; older kernels keep a stale qgroup, visible
//! as `<stale>` in `btrfs qgroup show`, harmless and removable by hand).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::Mode;
use rustix::io::Errno;

use super::{QuotaBackend, QuotaError, QuotaUsage, errno, io_err};
use crate::WalkError;
use crate::meta::Meta;
use crate::remove::prefixed;
use crate::walk::{Step, Walker};

/// The VolumeAttributesClass parameter for btrfs compression.
pub const COMPRESSION: &str = "compression";

/// Limits are kept in whole filesystem blocks; 4 KiB is btrfs's sector size on every
/// platform hpp runs on.
const GRANULARITY: u64 = 4096;

/// How often subvolumes a tenant made inside a published volume are added to the volume's
/// limit when the kernel does not do it (full quotas): the longest a tenant can write into one
/// uncounted.
pub const CONTAIN_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);

/// The btrfs backend for one pool.
#[derive(Debug)]
pub struct Btrfs {
    /// `/sys/fs/btrfs/<uuid>/qgroups`, where the kernel publishes every qgroup's counters.
    qgroups: PathBuf,
    /// Simple quotas: the kernel puts a new subvolume in its parent volume's qgroup itself.
    simple: bool,
    /// What [`QuotaBackend::contain_nested`] knows (full quotas).
    contained: std::sync::Mutex<Containment>,
}

/// The subvolumes seen so far and which of them were added to a volume's qgroup.
#[derive(Debug, Default)]
struct Containment {
    /// The next subvolume id to look for (ids only grow).
    next_id: u64,
    /// Each subvolume seen, with the subvolume it was made in.
    parents: std::collections::HashMap<u64, u64>,
}

/// Formats a filesystem UUID the way sysfs names its directory.
fn uuid_string(u: &[u8; 16]) -> String {
    let hex: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// Whether the open directory is the root of a subvolume.
pub fn is_subvolume(fd: BorrowedFd<'_>) -> bool {
    matches!(hpp_sys::btrfs::is_btrfs(fd), Ok(true))
        && rustix::fs::fstat(fd).is_ok_and(|st| st.st_ino == hpp_sys::btrfs::SUBVOL_ROOT_INO)
}

impl Btrfs {
    /// Prepares the backend for the pool directory `pool`: it must be on btrfs; quotas are
    /// turned on when they are off.
    pub fn open(pool: BorrowedFd<'_>) -> Result<Self, QuotaError> {
        if !hpp_sys::btrfs::is_btrfs(pool).map_err(io_err("statfs of the pool"))? {
            return Err(QuotaError::Unsupported(
                "quota mode btrfs needs the pool directory on a btrfs filesystem".into(),
            ));
        }
        let uuid = hpp_sys::btrfs::fs_uuid(pool).map_err(io_err("reading the btrfs filesystem id"))?;
        let qgroups = PathBuf::from("/sys/fs/btrfs").join(uuid_string(&uuid)).join("qgroups");
        if !qgroups.is_dir() {
            match hpp_sys::btrfs::quota_enable_simple(pool) {
                Ok(()) => tracing::warn!(fs = %uuid_string(&uuid),
                    "btrfs quotas are off on the pool's filesystem; turned on simple quotas (subvolumes a tenant makes in a volume count against its limit at once)"),
                Err(e) => {
                    tracing::warn!(fs = %uuid_string(&uuid), simple_quotas = %e,
                        "btrfs quotas are off on the pool's filesystem; turning on full quotas (this kernel has no simple quotas: subvolumes a tenant makes in a volume are added to its limit every 2 s)");
                    hpp_sys::btrfs::quota_enable(pool).map_err(io_err("enabling btrfs quotas"))?;
                }
            }
            if !qgroups.is_dir() {
                return Err(QuotaError::Unsupported(format!(
                    "btrfs quotas were enabled but {} does not exist (kernel older than 5.9?)",
                    qgroups.display()
                )));
            }
        }
        // `mode` exists from Linux 6.7 on: `qgroup` (full) or `squota` (simple).
        let simple = std::fs::read_to_string(qgroups.join("mode")).is_ok_and(|m| m.trim() == "squota");
        Ok(Btrfs {
            qgroups,
            simple,
            contained: Default::default(),
        })
    }

    /// Whether the filesystem accounts with simple quotas.
    pub fn simple_quotas(&self) -> bool {
        self.simple
    }

    /// The directory of qgroup `<level>_<id>` in sysfs.
    fn qgroup_dir(&self, level: u8, id: u64) -> PathBuf {
        self.qgroups.join(format!("{level}_{id}"))
    }

    /// The qgroup that carries volume `id`'s limit: `1/<id>` for volumes made since limits
    /// moved there, `0/<id>` for older ones (until their limit is next set).
    fn limit_qgroup(&self, id: u64) -> (u8, u64) {
        match self.qgroup_dir(1, id).is_dir() {
            true => (1, hpp_sys::btrfs::level1(id)),
            false => (0, id),
        }
    }

    /// With simple quotas, makes `1/<id>` hold `0/<id>` and carry `limit_bytes`, the volume's
    /// own qgroup left unlimited (an older volume's limit there would otherwise keep a raised
    /// one from working); with full quotas, limits `0/<id>`. Idempotent. The ioctls go through `fd`, the pool directory: a transaction
    /// started through a full volume would be charged to the volume's qgroup and refused.
    fn limit_volume(&self, fd: BorrowedFd<'_>, name: &str, id: u64, limit_bytes: u64) -> Result<(), QuotaError> {
        if !self.simple {
            return hpp_sys::btrfs::qgroup_limit(fd, id, limit_bytes)
                .map_err(io_err(format!("setting the qgroup limit of {name}")));
        }
        let parent = hpp_sys::btrfs::level1(id);
        let exists = |e: &std::io::Error| Errno::from_io_error(e) == Some(Errno::EXIST);
        match hpp_sys::btrfs::qgroup_create(fd, parent) {
            Ok(()) => {}
            Err(e) if exists(&e) => {}
            Err(e) => return Err(io_err(format!("creating qgroup 1/{id} of {name}"))(e)),
        }
        match hpp_sys::btrfs::qgroup_assign(fd, id, parent, true) {
            Ok(_) => {}
            Err(e) if exists(&e) => {}
            Err(e) => return Err(io_err(format!("adding {name} to qgroup 1/{id}"))(e)),
        }
        hpp_sys::btrfs::qgroup_limit(fd, parent, limit_bytes)
            .map_err(io_err(format!("setting the limit of qgroup 1/{id} of {name}")))?;
        hpp_sys::btrfs::qgroup_limit(fd, id, 0)
            .map_err(io_err(format!("clearing the limit of qgroup 0/{id} of {name}")))
    }

    fn read_counter(&self, (level, id): (u8, u64), counter: &str) -> Result<u64, QuotaError> {
        let id = id & ((1 << 48) - 1);
        let path = self.qgroup_dir(level, id).join(counter);
        let text = std::fs::read_to_string(&path).map_err(io_err(format!("reading {}", path.display())))?;
        text.trim()
            .parse()
            .map_err(|_| QuotaError::Unsupported(format!("{} holds {text:?}, not a number", path.display())))
    }

    /// Opens subvolume `name` and returns it with its id.
    fn subvolume(&self, pool: BorrowedFd<'_>, name: &str) -> Result<(OwnedFd, u64), QuotaError> {
        let fd = crate::open_child_dir(pool, name).map_err(errno(format!("opening volume {name}")))?;
        if !is_subvolume(fd.as_fd()) {
            return Err(QuotaError::Unsupported(format!(
                "volume {name} is a plain directory, not a btrfs subvolume (made before the pool used \
                 quota mode btrfs); it stays unlimited until adopted"
            )));
        }
        let id = hpp_sys::btrfs::subvolume_id(fd.as_fd()).map_err(io_err(format!("subvolume id of {name}")))?;
        Ok((fd, id))
    }

    /// Finishes a fresh subvolume: its level-1 qgroup and limit. Destroys it on failure, with
    /// the qgroups made for it.
    fn finish(&self, pool: BorrowedFd<'_>, name: &str, limit_bytes: u64) -> Result<OwnedFd, QuotaError> {
        let made = self.subvolume(pool, name);
        let result = match &made {
            Ok((_, id)) => self.limit_volume(pool, name, *id, limit_bytes),
            Err(_) => Ok(()),
        };
        match (made, result) {
            (Ok((fd, _)), Ok(())) => Ok(fd),
            (made, result) => {
                let id = made.as_ref().ok().map(|(_, id)| *id);
                drop(made);
                let _ = hpp_sys::btrfs::subvolume_destroy(pool, name);
                if let Some(id) = id {
                    forget_qgroups(pool, id, &[id]);
                }
                Err(result.err().unwrap_or_else(|| {
                    QuotaError::Unsupported(format!("{name} is not a btrfs subvolume after it was made"))
                }))
            }
        }
    }

    /// Whether subvolume `id` sits below a volume of the pool whose directory is in subvolume
    /// `pool_subvol`: its chain of parents reaches `pool_subvol` through at least one other
    /// subvolume (a volume, a temporary or a snapshot's data are direct children and are not).
    fn is_nested(&self, pool: BorrowedFd<'_>, state: &mut Containment, id: u64, pool_subvol: u64) -> bool {
        let mut at = id;
        for depth in 0..64 {
            let parent = match state.parents.get(&at) {
                Some(p) => *p,
                None => match hpp_sys::btrfs::subvolume_parent(pool, at) {
                    Ok(Some(p)) => {
                        state.parents.insert(at, p);
                        p
                    }
                    _ => return false,
                },
            };
            if parent == pool_subvol {
                return depth > 0;
            }
            if parent == at || parent < 5 {
                return false;
            }
            at = parent;
        }
        false
    }

    /// Refuses to copy the subvolume `source` (named `what`) by snapshot when it holds
    /// subvolumes: the snapshot would hold empty directories where their data was.
    fn refuse_nested(source: BorrowedFd<'_>, what: &str) -> Result<(), QuotaError> {
        let nested = hpp_sys::btrfs::subvolume_children(source)
            .map_err(io_err(format!("listing the subvolumes inside {what}")))?;
        if nested.is_empty() {
            return Ok(());
        }
        Err(QuotaError::Refused(format!(
            "{what} holds {} btrfs subvolume(s) made inside it (ids {nested:?}); a btrfs snapshot would not \
             include their data. Copy their contents into plain directories (or delete them) inside the \
             volume, then try again",
            nested.len()
        )))
    }
}

/// Takes qgroups `0/<m>` (for each member) out of `1/<id>`, then removes `1/<id>` and `0/<id>`;
/// what the kernel refuses now (extents still being dropped or shared) it removes itself
/// later (Linux 6.7+).
fn forget_qgroups(fd: BorrowedFd<'_>, id: u64, members: &[u64]) {
    let parent = hpp_sys::btrfs::level1(id);
    for m in members {
        let _ = hpp_sys::btrfs::qgroup_assign(fd, *m, parent, false);
    }
    for (qgroup, shown) in [(parent, format!("1/{id}")), (id, format!("0/{id}"))] {
        match hpp_sys::btrfs::qgroup_remove(fd, qgroup) {
            Ok(()) => {}
            Err(e) if matches!(Errno::from_io_error(&e), Some(Errno::BUSY | Errno::NOENT)) => {
                tracing::debug!(qgroup = %shown, "the kernel removes the qgroup once its extents are dropped");
            }
            Err(e) => tracing::warn!(qgroup = %shown, error = %e, "cannot remove the qgroup of a deleted volume"),
        }
    }
}

/// Names of the subvolumes directly inside the open directory `dir`.
fn subvolume_children(dir: BorrowedFd<'_>) -> Result<Vec<String>, QuotaError> {
    if !matches!(hpp_sys::btrfs::is_btrfs(dir), Ok(true)) {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    let mut d = rustix::fs::Dir::read_from(dir).map_err(errno("listing a directory"))?;
    while let Some(entry) = d.read() {
        let entry = entry.map_err(errno("listing a directory"))?;
        let Ok(name) = entry.file_name().to_str() else { continue };
        // readdir reports a subvolume's entry with the subvolume id as its inode number, so
        // only opening it tells.
        if entry.file_type() != rustix::fs::FileType::Directory || name == "." || name == ".." {
            continue;
        }
        if let Ok(child) = crate::open_child_dir(dir, name)
            && is_subvolume(child.as_fd())
        {
            out.push(name.to_owned());
        }
    }
    Ok(out)
}

/// Makes the subvolume open as `fd` writable when it is read-only (a tenant may mark its own
/// subvolumes read-only), so the subvolumes inside it can be destroyed.
fn make_writable(fd: BorrowedFd<'_>, path: &Path) -> Result<(), QuotaError> {
    if hpp_sys::btrfs::subvolume_read_only(fd).map_err(io_err(format!("reading the flags of {}", path.display())))? {
        hpp_sys::btrfs::subvolume_set_read_only(fd, false)
            .map_err(io_err(format!("making subvolume {} writable", path.display())))?;
    }
    Ok(())
}

/// Whether the directory `child` of `parent` is the root of a subvolume of its own (btrfs gives
/// each subvolume its own device number and root inode 256).
fn is_nested_subvolume(child: &Meta, parent: &Meta) -> bool {
    child.ino == hpp_sys::btrfs::SUBVOL_ROOT_INO && child.dev != parent.dev
}

/// Destroys every subvolume below the subvolume root open as `dir` (named `name` in errors),
/// deepest first: what a tenant made inside its volume (nested subvolumes, read-only
/// snapshots), which neither the volume's own destroy (`ENOTEMPTY`) nor a tree walk (`EROFS`
/// inside a read-only snapshot) can take away. Read-only subvolumes on the way are made
/// writable first, or the ones inside them could not go. The shared walker bounds it (open
/// descriptors, iterative whatever the depth); symlinks are never followed and other mounts
/// never entered (the caller's removal refuses them).
fn destroy_nested(dir: BorrowedFd<'_>, name: &str) -> Result<Vec<u64>, QuotaError> {
    let prefix = Path::new(name);
    let mut destroyed = Vec::new();
    if is_subvolume(dir) {
        make_writable(dir, prefix)?;
    }
    let mut walk = Walker::new_dup(dir)?;
    let root = *walk.root_meta();
    while let Some(step) = walk.step()? {
        match step {
            Step::Entry(child, meta) if meta.is_dir() && meta.same_mount(&root) => {
                let here = Meta::of(walk.dir()?).map_err(|e| WalkError::io("stat", prefix.join(walk.path()), e))?;
                walk.descend(&child).map_err(|e| prefixed(e, prefix))?;
                if is_nested_subvolume(&meta, &here) {
                    make_writable(walk.dir()?, &prefix.join(walk.path()))?;
                    if let Ok(id) = hpp_sys::btrfs::subvolume_id(walk.dir()?) {
                        // A limit (a frozen nested subvolume's) would refuse the transactions
                        // that destroy what is inside it; through `dir`, whose limit the caller
                        // lifted.
                        let _ = hpp_sys::btrfs::qgroup_limit(dir, id, 0);
                        destroyed.push(id);
                    }
                }
            }
            // Files and symlinks are the tree removal's; mounts are refused by it.
            Step::Entry(..) => {}
            Step::Leave(child) => {
                let parent = walk.dir()?;
                let path = || prefix.join(walk.path_of(&child));
                let (Ok(meta), Ok(here)) = (Meta::at(parent, &child), Meta::of(parent)) else {
                    continue;
                };
                if meta.is_dir() && is_nested_subvolume(&meta, &here) {
                    let child_name = std::ffi::OsStr::from_bytes(child.to_bytes());
                    match hpp_sys::btrfs::subvolume_destroy(parent, child_name) {
                        Ok(()) => {}
                        Err(e) if Errno::from_io_error(&e) == Some(Errno::NOENT) => {}
                        Err(e) => return Err(io_err(format!("destroying subvolume {}", path().display()))(e)),
                    }
                }
            }
        }
    }
    Ok(destroyed)
}

impl QuotaBackend for Btrfs {
    fn name(&self) -> &'static str {
        "btrfs"
    }

    fn granularity(&self) -> u64 {
        GRANULARITY
    }

    fn create(&self, pool: BorrowedFd<'_>, name: &str, limit_bytes: u64) -> Result<OwnedFd, QuotaError> {
        hpp_sys::btrfs::subvolume_create(pool, name).map_err(io_err(format!("creating subvolume {name}")))?;
        let fd = self.finish(pool, name, limit_bytes)?;
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(super::VOLUME_MODE)).map_err(errno(format!("chmod {name}")))?;
        Ok(fd)
    }

    fn clone_volume(
        &self,
        pool: BorrowedFd<'_>,
        name: &str,
        source: BorrowedFd<'_>,
        limit_bytes: u64,
    ) -> Result<Option<OwnedFd>, QuotaError> {
        if !is_subvolume(source) {
            return Ok(None);
        }
        Self::refuse_nested(source, "the source volume")?;
        match hpp_sys::btrfs::snapshot_create(pool, name, source, false) {
            Ok(()) => {}
            // Another filesystem: the caller copies.
            Err(e) if Errno::from_io_error(&e) == Some(Errno::XDEV) => return Ok(None),
            Err(e) => return Err(io_err(format!("snapshotting into {name}"))(e)),
        }
        self.finish(pool, name, limit_bytes).map(Some)
    }

    fn snapshot(&self, dir: BorrowedFd<'_>, name: &str, source: BorrowedFd<'_>) -> Result<bool, QuotaError> {
        if !is_subvolume(source) {
            return Ok(false);
        }
        Self::refuse_nested(source, "the volume")?;
        match hpp_sys::btrfs::snapshot_create(dir, name, source, true) {
            Ok(()) => Ok(true),
            Err(e) if Errno::from_io_error(&e) == Some(Errno::XDEV) => Ok(false),
            Err(e) => Err(io_err(format!("taking read-only snapshot {name}"))(e)),
        }
    }

    fn set_limit(&self, pool: BorrowedFd<'_>, name: &str, limit_bytes: u64) -> Result<(), QuotaError> {
        let (_, id) = self.subvolume(pool, name)?;
        // A volume from before limits moved to `1/<id>` gets its level-1 qgroup now.
        self.limit_volume(pool, name, id, limit_bytes)
    }

    fn usage(&self, pool: BorrowedFd<'_>, name: &str) -> Result<Option<QuotaUsage>, QuotaError> {
        let fd = crate::open_child_dir(pool, name).map_err(errno(format!("opening volume {name}")))?;
        if !is_subvolume(fd.as_fd()) {
            // A volume from before the pool used btrfs: the caller walks it.
            return Ok(None);
        }
        let id = hpp_sys::btrfs::subvolume_id(fd.as_fd()).map_err(io_err(format!("subvolume id of {name}")))?;
        // `1/<id>` also counts the subvolumes made inside the volume.
        let qgroup = self.limit_qgroup(id);
        let limit = self.read_counter(qgroup, "max_referenced")?;
        Ok(Some(QuotaUsage {
            used_bytes: self.read_counter(qgroup, "referenced")?,
            limit_bytes: if limit == u64::MAX { 0 } else { limit },
            used_inodes: None,
            limit_inodes: None,
        }))
    }

    fn remove(&self, pool: BorrowedFd<'_>, name: &str) -> Result<(), QuotaError> {
        let fd = match crate::open_child_dir(pool, name) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(()),
            // A file or symlink: the generic removal unlinks it.
            Err(Errno::NOTDIR | Errno::LOOP) => return super::remove_tree(pool, name),
            Err(e) => return Err(errno(format!("opening {name}"))(e)),
        };
        if !is_subvolume(fd.as_fd()) {
            // A snapshot's directory holds its data as a read-only subvolume, which the walk
            // cannot empty: destroy the subvolumes directly inside first.
            let mut direct = Ok(());
            for child in subvolume_children(fd.as_fd())? {
                direct = hpp_sys::btrfs::subvolume_destroy(fd.as_fd(), &child);
                if direct.is_err() {
                    break;
                }
            }
            if direct.is_ok() && super::remove_tree(pool, name).is_ok() {
                return Ok(());
            }
            // Subvolumes deeper down (a tenant's, in a volume from before the pool used btrfs).
            destroy_nested(fd.as_fd(), name)?;
            drop(fd);
            return super::remove_tree(pool, name);
        }
        let id = hpp_sys::btrfs::subvolume_id(fd.as_fd()).map_err(io_err(format!("subvolume id of {name}")))?;
        drop(fd);
        let mut members = vec![id];
        // A full volume's limit would refuse the transactions that destroy what is inside it
        // (a tenant's subvolumes): nothing is written into a volume being removed, so it goes.
        for qgroup in [hpp_sys::btrfs::level1(id), id] {
            let _ = hpp_sys::btrfs::qgroup_limit(pool, qgroup, 0);
        }
        if let Err(e) = hpp_sys::btrfs::subvolume_destroy(pool, name) {
            // Subvolumes the tenant made inside the volume block the one-shot destroy: destroy
            // them (deepest first), then the volume; its tree is walked only if that still fails.
            tracing::debug!(volume = name, error = %e, "destroying the subvolume failed; destroying the subvolumes inside first");
            let fd = crate::open_child_dir(pool, name).map_err(errno(format!("opening {name}")))?;
            members.extend(destroy_nested(fd.as_fd(), name)?);
            drop(fd);
            if let Err(e) = hpp_sys::btrfs::subvolume_destroy(pool, name) {
                tracing::debug!(volume = name, error = %e, "destroying the subvolume failed; removing its tree");
                super::remove_tree(pool, name)?;
            }
        }
        forget_qgroups(pool, id, &members);
        if let Ok(mut contained) = self.contained.lock() {
            for m in &members {
                contained.parents.remove(m);
            }
        }
        Ok(())
    }

    fn release(&self, _pool: BorrowedFd<'_>, _name: &str) -> Result<(), QuotaError> {
        // The qgroup goes with the subvolume in `remove`.
        Ok(())
    }

    fn nested_containment(&self) -> Option<std::time::Duration> {
        (!self.simple).then_some(CONTAIN_INTERVAL)
    }

    /// Limits every subvolume made inside a volume (at any depth) since the last call to
    /// what it holds: with full quotas the kernel counts none of it against the volume.
    fn contain_nested(&self, pool: BorrowedFd<'_>) -> Result<usize, QuotaError> {
        if self.simple {
            return Ok(0);
        }
        let pool_subvol = hpp_sys::btrfs::subvolume_id(pool).map_err(io_err("subvolume id of the pool"))?;
        let mut state = self
            .contained
            .lock()
            .map_err(|_| QuotaError::Unsupported("the nested-subvolume state was poisoned".into()))?;
        let found = hpp_sys::btrfs::subvolumes_since(pool, state.next_id)
            .map_err(io_err("listing subvolumes (root tree search)"))?;
        let mut frozen = 0;
        for (child, parent) in found {
            state.next_id = state.next_id.max(child + 1);
            state.parents.insert(child, parent);
            if !self.is_nested(pool, &mut state, child, pool_subvol) {
                continue;
            }
            let holds = self.read_counter((0, child), "referenced").unwrap_or(0);
            match hpp_sys::btrfs::qgroup_limit(pool, child, holds.max(GRANULARITY)) {
                Ok(()) => {
                    frozen += 1;
                    tracing::warn!(
                        subvolume = child,
                        inside = parent,
                        bytes = holds,
                        "a subvolume was made inside a volume; limited to what it holds (full btrfs quotas do not count it against the volume)"
                    );
                }
                Err(e) => tracing::warn!(subvolume = child, error = %e, "cannot limit a nested subvolume"),
            }
        }
        Ok(frozen)
    }

    fn parameters(&self) -> &'static [(&'static str, &'static str)] {
        &[(
            COMPRESSION,
            "compression of data written from now on: zstd, lzo, zlib or none",
        )]
    }

    fn set_parameter(&self, pool: BorrowedFd<'_>, name: &str, key: &str, value: &str) -> Result<(), QuotaError> {
        if key != COMPRESSION {
            return Err(QuotaError::Invalid(format!(
                "quota backend btrfs has no parameter {key:?} (it has: {COMPRESSION})"
            )));
        }
        if !["zstd", "lzo", "zlib", "none"].contains(&value) {
            return Err(QuotaError::Invalid(format!(
                "{COMPRESSION}={value:?}: expected zstd, lzo, zlib or none"
            )));
        }
        let (fd, _) = self.subvolume(pool, name)?;
        // The `btrfs.compression` property: inherited by files created below from now on.
        rustix::fs::fsetxattr(
            &fd,
            "btrfs.compression",
            value.as_bytes(),
            rustix::fs::XattrFlags::empty(),
        )
        .map_err(errno(format!("setting btrfs.compression on {name}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_formatted_like_sysfs() {
        let u = [
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef,
        ];
        assert_eq!(uuid_string(&u), "12345678-9abc-def0-0123-456789abcdef");
    }
}
