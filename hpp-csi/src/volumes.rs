//! Creating and deleting volume directories with crash safety. A volume is built under the
//! deterministic temporary name `.hpp-tmp-<id>` and renamed into place in one atomic step, so a
//! crash leaves either no volume or a complete one; a retry removes the half-built temporary and
//! starts over. Deletion renames to `.hpp-del-<id>` first, so a half-deleted volume is never
//! served and a retry finishes the job.

use std::os::fd::{AsFd, OwnedFd};

use rustix::io::Errno;

use crate::copy::{self, CopyStats};
use crate::error::{Error, Result};
use crate::fsops::{self, Entry};
use crate::mountinfo::MountTable;
use crate::pool::Pool;

/// Mode of a new volume directory: what KubeVirt's `mkdir 0777` gives under the usual umask.
pub const VOLUME_MODE: u32 = 0o755;

/// Temporary name used while building volume `id`.
pub fn temp_name(id: &str) -> String {
    format!(".hpp-tmp-{id}")
}

/// Name a volume is renamed to while being deleted.
pub fn deleting_name(id: &str) -> String {
    format!(".hpp-del-{id}")
}

/// Outcome of [`create`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    /// The directory already existed; nothing was done (idempotent retry or adopted KubeVirt
    /// volume).
    Existing,
    /// A new directory was made, with what was copied into it.
    New(CopyStats),
}

/// Creates volume `id` in `pool`, filled with a copy of `source` when given.
pub fn create(pool: &Pool, id: &str, source: Option<&OwnedFd>) -> Result<Created> {
    let dir = pool.open()?;
    match fsops::entry(dir.as_fd(), id).map_err(|e| Error::io(format!("stat volume {id}"), e))? {
        Entry::Dir { .. } => return Ok(Created::Existing),
        Entry::Missing => {}
        Entry::Symlink | Entry::Other => {
            return Err(Error::AlreadyExists(format!(
                "{} exists and is not a directory; it is not an hpp volume",
                pool.volume_path(id).display()
            )));
        }
    }
    let tmp = temp_name(id);
    // Leftover of a crashed attempt: start over, its content may be partial.
    fsops::remove_tree(dir.as_fd(), &tmp)?;
    let tmp_fd = fsops::mkdir_exact(dir.as_fd(), &tmp, VOLUME_MODE)
        .map_err(|e| Error::io(format!("creating {}", pool.path.join(&tmp).display()), e))?;
    let stats = match source {
        Some(src) => match copy::copy_tree(src.as_fd(), tmp_fd.as_fd()) {
            Ok(stats) => {
                // The source's mode was copied; a volume is always traversable by its owner.
                stats
            }
            Err(e) => {
                drop(tmp_fd);
                let _ = fsops::remove_tree(dir.as_fd(), &tmp);
                return Err(e);
            }
        },
        None => CopyStats::default(),
    };
    if source.is_some() {
        // Copied data must be on disk before the volume becomes visible; one syncfs is far
        // cheaper than an fsync per file. An empty directory needs only the parent's fsync below.
        let _ = rustix::fs::syncfs(&tmp_fd);
    }
    drop(tmp_fd);
    match fsops::rename_noreplace(dir.as_fd(), &tmp, id) {
        Ok(()) => {}
        Err(Errno::EXIST) | Err(Errno::NOTEMPTY) => {
            let _ = fsops::remove_tree(dir.as_fd(), &tmp);
            return Ok(Created::Existing);
        }
        Err(e) => return Err(Error::io(format!("renaming {tmp} to {id}"), e)),
    }
    fsops::sync_dir(dir.as_fd());
    Ok(Created::New(stats))
}

/// Deletes volume `id` from `pool` if it is an hpp volume: a real directory directly in the
/// pool, on the pool's filesystem, with nothing mounted from or into it. Missing is success.
/// Returns whether anything was deleted.
pub fn delete(pool: &Pool, id: &str, mounts: &MountTable) -> Result<bool> {
    let dir = pool.open()?;
    let gone = deleting_name(id);
    // Finish an interrupted deletion first.
    fsops::remove_tree(dir.as_fd(), &gone)?;
    let pool_dev = fsops::dev_of(dir.as_fd()).map_err(|e| Error::io("stat pool", e))?;
    match fsops::entry(dir.as_fd(), id).map_err(|e| Error::io(format!("stat volume {id}"), e))? {
        Entry::Missing => return Ok(false),
        Entry::Symlink | Entry::Other => {
            return Err(Error::FailedPrecondition(format!(
                "{} is not a directory; it is not an hpp volume and is left alone",
                pool.volume_path(id).display()
            )));
        }
        Entry::Dir { dev } if dev != pool_dev => {
            return Err(Error::FailedPrecondition(format!(
                "{} is a mount point of another filesystem; unmount it first",
                pool.volume_path(id).display()
            )));
        }
        Entry::Dir { .. } => {}
    }
    check_not_mounted(pool, id, mounts)?;
    fsops::rename_noreplace(dir.as_fd(), id, &gone).map_err(|e| Error::io(format!("renaming {id} for deletion"), e))?;
    fsops::sync_dir(dir.as_fd());
    fsops::remove_tree(dir.as_fd(), &gone)?;
    Ok(true)
}

/// Fails with FailedPrecondition while volume `id` is bind-mounted somewhere or has something
/// mounted inside it: deleting it would destroy data a pod is using.
pub fn check_not_mounted(pool: &Pool, id: &str, mounts: &MountTable) -> Result<()> {
    let path = pool.volume_path(id);
    let mut users = mounts.bind_mounts_of(&path);
    users.extend(mounts.mounts_below(&path));
    if let Some(first) = users.first() {
        return Err(Error::FailedPrecondition(format!(
            "volume {id} is still mounted at {} ({} mount(s)); unpublish it first",
            first.display(),
            users.len()
        )));
    }
    Ok(())
}

/// Opens volume `id` in `pool` for reading (clone source, publish source, stats).
/// Missing → NotFound; a symlink or file planted in the pool → InvalidArgument.
pub fn open(pool: &Pool, id: &str) -> Result<OwnedFd> {
    let dir = pool.open()?;
    match fsops::open_child_dir(dir.as_fd(), id) {
        Ok(fd) => Ok(fd),
        Err(Errno::NOENT) => Err(Error::NotFound(format!(
            "volume {id} does not exist in storage pool {}",
            pool.name
        ))),
        Err(Errno::LOOP) | Err(Errno::NOTDIR) => Err(Error::InvalidArgument(format!(
            "{} is a symlink or not a directory; refusing to follow it out of the pool",
            pool.volume_path(id).display()
        ))),
        Err(e) => Err(Error::io(format!("opening volume {id}"), e)),
    }
}

/// Whether volume `id` exists in `pool` as a real directory.
pub fn exists(pool: &Pool, id: &str) -> Result<bool> {
    let dir = pool.open()?;
    Ok(matches!(
        fsops::entry(dir.as_fd(), id).map_err(|e| Error::io(format!("stat volume {id}"), e))?,
        Entry::Dir { .. }
    ))
}
