//! The `xfs-project` and `ext4-project` backends: one project id per volume directory
//! (`PROJINHERIT`, so everything written below is charged to it) with a hard block (and
//! optional inode) limit. `df` inside the volume then shows the limit.
//!
//! Project ids come from [`Allocator`]: there is no ledger that could drift from the disk. The
//! ids in use are the ids stamped on the pool's entries themselves (volumes, temporaries,
//! volumes being deleted); a new id is chosen and stamped on the new directory while holding
//! an exclusive `flock` on the pool's `.hpp-projid.lock`, so two creators (threads, the driver
//! and the legacy provisioner, a restarted driver) can never pick the same id, and a crash at
//! any point leaves either an unstamped directory (id 0: not counted, swept at start-up) or a
//! stamped one that keeps its id until it is removed. OpenEBS LocalPV's duplicate-id bugs came
//! from a counter kept apart from the directories; this design has no counter.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{FlockOperation, Mode, OFlags};

use super::{QuotaBackend, QuotaError, QuotaUsage, errno, io_err};

/// The VolumeAttributesClass parameter for the inode limit.
pub const INODE_LIMIT: &str = "inodeLimit";

/// The allocation lock inside the pool (hidden: never a volume).
pub const LOCK_FILE: &str = ".hpp-projid.lock";
/// First project id hpp hands out: well above the small ids admins set by hand in
/// `/etc/projid`.
pub const FIRST_ID: u32 = 1 << 20;
/// Last project id hpp hands out (ids near `u32::MAX` are reserved by some tools).
pub const LAST_ID: u32 = (1 << 31) - 1;

/// Where a directory's project id is kept: the filesystem's own project id in production
/// ([`FsProjectIds`]); the tests use a stand-in on filesystems without project ids.
pub trait IdStore: Send + Sync + Debug {
    /// The id stamped on the directory open as `dir` (0 when none).
    fn get(&self, dir: BorrowedFd<'_>) -> io::Result<u32>;
    /// Stamps `id` on the directory open as `dir` (inherited by everything made below).
    fn set(&self, dir: BorrowedFd<'_>, id: u32) -> io::Result<()>;
}

/// The filesystem's project id, through `FS_IOC_FSGETXATTR` / `FS_IOC_FSSETXATTR`.
#[derive(Debug, Clone, Copy, Default)]
pub struct FsProjectIds;

impl IdStore for FsProjectIds {
    fn get(&self, dir: BorrowedFd<'_>) -> io::Result<u32> {
        hpp_sys::quota::project_id(dir).map(|(id, _)| id)
    }

    fn set(&self, dir: BorrowedFd<'_>, id: u32) -> io::Result<()> {
        hpp_sys::quota::set_project_id(dir, id)?;
        rustix::fs::fsync(dir)?;
        Ok(())
    }
}

/// The smallest id in `first..=last` that is not in `used`.
pub fn next_free(used: &BTreeSet<u32>, first: u32, last: u32) -> Option<u32> {
    let mut candidate = first;
    for &id in used.range(first..=last) {
        if id != candidate {
            break;
        }
        candidate = candidate.checked_add(1)?;
    }
    (candidate <= last).then_some(candidate)
}

/// Hands out project ids to new directories of one pool; see the module documentation.
#[derive(Debug, Clone)]
pub struct Allocator<S> {
    store: S,
    first: u32,
    last: u32,
}

impl<S: IdStore> Allocator<S> {
    /// An allocator handing out ids in `first..=last` (at least 1: 0 means "no project").
    pub fn new(store: S, first: u32, last: u32) -> Self {
        Allocator {
            store,
            first: first.max(1),
            last,
        }
    }

    /// The store ids are kept in.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Ids stamped on the pool's entries right now.
    pub fn used(&self, pool: BorrowedFd<'_>) -> Result<BTreeSet<u32>, QuotaError> {
        let mut used = BTreeSet::new();
        let mut dir = rustix::fs::Dir::read_from(pool).map_err(errno("listing the pool"))?;
        while let Some(entry) = dir.read() {
            let entry = entry.map_err(errno("listing the pool"))?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." || entry.file_type() != rustix::fs::FileType::Directory {
                continue;
            }
            let Ok(child) = crate::open_child_dir(pool, entry.file_name()) else {
                continue;
            };
            let id = self.store.get(child.as_fd()).map_err(io_err("reading a project id"))?;
            if id != 0 {
                used.insert(id);
            }
        }
        Ok(used)
    }

    /// Creates directory `name` in `pool` stamped with a project id no other entry of the
    /// pool has; returns it opened, with the id.
    pub fn create_dir(&self, pool: BorrowedFd<'_>, name: &str) -> Result<(OwnedFd, u32), QuotaError> {
        let lock = rustix::fs::openat(
            pool,
            LOCK_FILE,
            OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(errno(format!("opening {LOCK_FILE}")))?;
        rustix::fs::flock(&lock, FlockOperation::LockExclusive).map_err(errno(format!("locking {LOCK_FILE}")))?;
        let used = self.used(pool)?;
        let id = next_free(&used, self.first, self.last).ok_or_else(|| {
            QuotaError::OutOfRange(format!(
                "every project id from {} to {} is in use in this pool",
                self.first, self.last
            ))
        })?;
        super::mkdir_volume(pool, name)?;
        let stamped = crate::open_child_dir(pool, name)
            .map_err(errno(format!("opening {name}")))
            .and_then(|fd| {
                self.store
                    .set(fd.as_fd(), id)
                    .map_err(io_err(format!("setting project id {id} on {name}")))?;
                Ok(fd)
            });
        match stamped {
            Ok(fd) => Ok((fd, id)),
            Err(e) => {
                let _ = rustix::fs::unlinkat(pool, name, rustix::fs::AtFlags::REMOVEDIR);
                Err(e)
            }
        }
        // The lock is released when `lock` is closed, after the id is on the directory.
    }
}

/// Which filesystem's project quota a [`Project`] backend drives (only the name differs: both
/// implement the generic quota interface).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProjectFs {
    /// XFS, mounted with `prjquota` (or `pquota`).
    Xfs,
    /// ext4 made with `-O quota,project`, mounted with `prjquota`.
    Ext4,
}

/// The project-quota backend for one pool.
#[derive(Debug, Clone)]
pub struct Project {
    fs: ProjectFs,
    ids: Allocator<FsProjectIds>,
}

impl Project {
    /// Prepares the backend for the pool directory `pool`: project quota must be enforced on
    /// its filesystem (checked by reading the pool's own project's quota).
    pub fn open(pool: BorrowedFd<'_>, fs: ProjectFs) -> Result<Self, QuotaError> {
        let (own, _) = hpp_sys::quota::project_id(pool).map_err(io_err("reading the pool's project id"))?;
        if let Err(e) = hpp_sys::quota::project_quota(pool, own) {
            return Err(QuotaError::Unsupported(format!(
                "project quota is not enforced on the pool's filesystem ({e}); mount it with -o prjquota{}",
                if fs == ProjectFs::Ext4 {
                    " after `tune2fs -O quota,project`"
                } else {
                    ""
                }
            )));
        }
        Ok(Project {
            fs,
            ids: Allocator::new(FsProjectIds, FIRST_ID, LAST_ID),
        })
    }

    fn volume(&self, pool: BorrowedFd<'_>, name: &str) -> Result<(OwnedFd, u32), QuotaError> {
        let fd = crate::open_child_dir(pool, name).map_err(errno(format!("opening volume {name}")))?;
        let id = self
            .ids
            .store()
            .get(fd.as_fd())
            .map_err(io_err(format!("reading the project id of {name}")))?;
        Ok((fd, id))
    }
}

impl QuotaBackend for Project {
    fn name(&self) -> &'static str {
        match self.fs {
            ProjectFs::Xfs => "xfs-project",
            ProjectFs::Ext4 => "ext4-project",
        }
    }

    fn granularity(&self) -> u64 {
        4096
    }

    fn create(&self, pool: BorrowedFd<'_>, name: &str, limit_bytes: u64) -> Result<OwnedFd, QuotaError> {
        let (fd, id) = self.ids.create_dir(pool, name)?;
        if let Err(e) = hpp_sys::quota::set_project_limits(fd.as_fd(), id, limit_bytes, 0) {
            drop(fd);
            let _ = rustix::fs::unlinkat(pool, name, rustix::fs::AtFlags::REMOVEDIR);
            return Err(io_err(format!("setting the limit of project {id}"))(e));
        }
        Ok(fd)
    }

    fn set_limit(&self, pool: BorrowedFd<'_>, name: &str, limit_bytes: u64) -> Result<(), QuotaError> {
        let (fd, id) = self.volume(pool, name)?;
        if id == 0 {
            return Err(QuotaError::Unsupported(format!(
                "volume {name} has no project id (made before the pool used project quota); it stays \
                 unlimited until adopted"
            )));
        }
        let inodes = hpp_sys::quota::project_quota(fd.as_fd(), id)
            .map(|q| q.limit_inodes)
            .unwrap_or(0);
        hpp_sys::quota::set_project_limits(fd.as_fd(), id, limit_bytes, inodes)
            .map_err(io_err(format!("setting the limit of project {id}")))
    }

    fn usage(&self, pool: BorrowedFd<'_>, name: &str) -> Result<Option<QuotaUsage>, QuotaError> {
        let (fd, id) = self.volume(pool, name)?;
        if id == 0 {
            return Ok(None);
        }
        let q = hpp_sys::quota::project_quota(fd.as_fd(), id).map_err(io_err(format!("reading project {id}")))?;
        Ok(Some(QuotaUsage {
            used_bytes: q.used_bytes,
            limit_bytes: q.limit_bytes,
            used_inodes: Some(q.used_inodes),
            limit_inodes: (q.limit_inodes != 0).then_some(q.limit_inodes),
        }))
    }

    fn remove(&self, pool: BorrowedFd<'_>, name: &str) -> Result<(), QuotaError> {
        let id = match crate::open_child_dir(pool, name) {
            Ok(fd) => self.ids.store().get(fd.as_fd()).unwrap_or(0),
            Err(_) => 0,
        };
        if id != 0 {
            // Cleared while the entry still carries the id, so no create can have picked it
            // yet: once the tree is gone the id is free, and a create may take it and set its
            // own limit at any moment, which a clear after the removal would wipe out.
            if let Err(e) = hpp_sys::quota::set_project_limits(pool, id, 0, 0) {
                tracing::debug!(project = id, error = %e, "cannot clear the limit of a project id being released");
            }
        }
        super::remove_tree(pool, name)
    }

    fn release(&self, _pool: BorrowedFd<'_>, _name: &str) -> Result<(), QuotaError> {
        Ok(())
    }

    fn parameters(&self) -> &'static [(&'static str, &'static str)] {
        &[(
            INODE_LIMIT,
            "hard limit on files and directories in the volume (0: none)",
        )]
    }

    fn set_parameter(&self, pool: BorrowedFd<'_>, name: &str, key: &str, value: &str) -> Result<(), QuotaError> {
        if key != INODE_LIMIT {
            return Err(QuotaError::Invalid(format!(
                "quota backend {} has no parameter {key:?} (it has: {INODE_LIMIT})",
                self.name()
            )));
        }
        let inodes: u64 = value
            .parse()
            .map_err(|_| QuotaError::Invalid(format!("{INODE_LIMIT}={value:?} is not a whole number")))?;
        let (fd, id) = self.volume(pool, name)?;
        if id == 0 {
            return Err(QuotaError::Unsupported(format!("volume {name} has no project id")));
        }
        let bytes = hpp_sys::quota::project_quota(fd.as_fd(), id)
            .map_err(io_err(format!("reading project {id}")))?
            .limit_bytes;
        hpp_sys::quota::set_project_limits(fd.as_fd(), id, bytes, inodes)
            .map_err(io_err(format!("setting the inode limit of project {id}")))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_smallest_free_id_is_picked() {
        let used: BTreeSet<u32> = [10, 11, 13].into();
        assert_eq!(next_free(&used, 10, 20), Some(12));
        assert_eq!(next_free(&used, 1, 20), Some(1));
        assert_eq!(next_free(&used, 14, 20), Some(14));
        assert_eq!(next_free(&used, 10, 11), None);
        assert_eq!(next_free(&BTreeSet::from([u32::MAX]), u32::MAX, u32::MAX), None);
    }

    proptest! {
        /// The answer is free, in range, and nothing smaller in range is free.
        #[test]
        fn next_free_is_the_smallest_free_id(used in proptest::collection::btree_set(0u32..64, 0..64), first in 0u32..64, span in 0u32..64) {
            let last = first.saturating_add(span);
            match next_free(&used, first, last) {
                Some(id) => {
                    prop_assert!(id >= first && id <= last && !used.contains(&id));
                    prop_assert!((first..id).all(|x| used.contains(&x)));
                }
                None => prop_assert!((first..=last).all(|x| used.contains(&x))),
            }
        }
    }
}
