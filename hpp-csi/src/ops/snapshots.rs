//! Reflink snapshots on disk, in KubeVirt's layout so existing snapshots keep working:
//! `<snapshotPath>/<name>/data/` holds the copy of the volume and the empty directory
//! `<snapshotPath>/<name>/<source volume id>/` records where it came from. Built under
//! a per-attempt `.hpp-tmp-<name>-<attempt>` and renamed into place, like volumes.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::time::SystemTime;

use rustix::io::Errno;

use crate::error::{Error, Result};
use crate::ops::copy;
use crate::ops::volumes::{deleting_name, temp_name};
use crate::pool::Pool;
use crate::pool::fsops::{self, Entry};
use crate::pool::validate::{self, INTERNAL_PREFIX};

/// Name of the directory that holds a snapshot's data.
pub const DATA_DIR: &str = "data";

/// A snapshot found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// Snapshot id (= the CreateSnapshot name).
    pub id: String,
    /// Pool whose snapshot directory holds it.
    pub pool: String,
    /// Volume it was taken from.
    pub source_volume_id: String,
    /// When it was made (ctime of its directory).
    pub created: SystemTime,
}

fn snapshot_root(pool: &Pool) -> Result<&Path> {
    pool.snapshot_path.as_deref().ok_or_else(|| {
        Error::InvalidArgument(format!(
            "storage pool {} has no snapshotPath/snapshotProvider configured",
            pool.name
        ))
    })
}

fn open_root(pool: &Pool, create: bool) -> Result<Option<OwnedFd>> {
    let root = snapshot_root(pool)?;
    let fd = open_root_unguarded(
        root,
        create && (!pool.require_mount_point || root.starts_with(&pool.path)),
    )?;
    if let Some(fd) = &fd
        && pool.require_mount_point
    {
        guard(pool, root, fd)?;
    }
    if fd.is_none() && create {
        return Err(Error::FailedPrecondition(format!(
            "snapshot directory {} of guarded storage pool {} does not exist and is not created \
             outside the pool's mount",
            root.display(),
            pool.name
        )));
    }
    Ok(fd)
}

/// The mount guard for `snapshotPath`: the snapshot directory must itself be a mount root, or
/// live on the (verified) mount of its pool, checked on the opened descriptor.
fn guard(pool: &Pool, root: &Path, fd: &OwnedFd) -> Result<()> {
    if fsops::fd_is_mount_root(fd.as_fd()) == Some(true) {
        return Ok(());
    }
    let pool_fd = pool.open()?;
    let same = match (hpp_fs::Meta::of(fd.as_fd()), hpp_fs::Meta::of(pool_fd.as_fd())) {
        (Ok(a), Ok(b)) => a.same_mount(&b),
        _ => false,
    };
    if same {
        return Ok(());
    }
    Err(Error::FailedPrecondition(format!(
        "snapshot directory {} of storage pool {} is neither a mount point nor on the pool's mount; \
         refusing to place snapshots on the underlying (root) filesystem",
        root.display(),
        pool.name
    )))
}

fn open_root_unguarded(root: &Path, create: bool) -> Result<Option<OwnedFd>> {
    if create {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(root)
            .map_err(|e| Error::io(format!("creating snapshot directory {}", root.display()), e))?;
    }
    match rustix::fs::open(
        root,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(Error::io(format!("opening {}", root.display()), e)),
    }
}

/// Reads snapshot `id` from `pool`; `None` when absent.
pub fn get(pool: &Pool, id: &str) -> Result<Option<SnapshotInfo>> {
    if pool.snapshot_path.is_none() {
        return Ok(None);
    }
    let Some(root) = open_root(pool, false)? else {
        return Ok(None);
    };
    read_info(pool, root.as_fd(), id)
}

fn read_info(pool: &Pool, root: std::os::fd::BorrowedFd<'_>, id: &str) -> Result<Option<SnapshotInfo>> {
    let snap = match fsops::open_child_dir(root, id) {
        Ok(fd) => fd,
        Err(Errno::NOENT) | Err(Errno::LOOP) | Err(Errno::NOTDIR) => return Ok(None),
        Err(e) => return Err(Error::io(format!("opening snapshot {id}"), e)),
    };
    let names = fsops::list_names(snap.as_fd()).map_err(|e| Error::io("reading snapshot", e))?;
    let source = names
        .into_iter()
        .filter(|n| n != DATA_DIR && validate::check_id("volume id", n).is_ok())
        .find(|n| matches!(fsops::entry(snap.as_fd(), n), Ok(Entry::Dir { .. })));
    let Some(source_volume_id) = source else {
        // No source marker: not a snapshot (or a foreign directory); ignore it.
        return Ok(None);
    };
    let st = rustix::fs::fstat(&snap).map_err(|e| Error::io("stat snapshot", e))?;
    let created = SystemTime::UNIX_EPOCH
        + std::time::Duration::new(
            u64::try_from(st.st_ctime).unwrap_or(0),
            u32::try_from(st.st_ctime_nsec).unwrap_or(0),
        );
    Ok(Some(SnapshotInfo {
        id: id.to_owned(),
        pool: pool.name.clone(),
        source_volume_id,
        created,
    }))
}

/// Every snapshot in `pool`.
pub fn list(pool: &Pool) -> Result<Vec<SnapshotInfo>> {
    if pool.snapshot_path.is_none() {
        return Ok(Vec::new());
    }
    let Some(root) = open_root(pool, false)? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for name in fsops::list_names(root.as_fd()).map_err(|e| Error::io("listing snapshots", e))? {
        if name.starts_with(INTERNAL_PREFIX) || validate::check_id("snapshot id", &name).is_err() {
            continue;
        }
        if let Some(info) = read_info(pool, root.as_fd(), &name)? {
            out.push(info);
        }
    }
    Ok(out)
}

/// Creates snapshot `id` of the open volume `source` (named `source_id`) in `pool`.
pub fn create(pool: &Pool, id: &str, source_id: &str, source: &OwnedFd) -> Result<SnapshotInfo> {
    if source_id == DATA_DIR {
        // KubeVirt's layout keeps the data in `<id>/data` and records the source as a sibling
        // directory named after it, so a source named `data` cannot be recorded.
        return Err(Error::FailedPrecondition(format!(
            "volume {source_id} cannot be snapshotted: the snapshot layout records the source volume as a \
             directory next to `{DATA_DIR}`, and the two names collide"
        )));
    }
    let root = open_root(pool, true)?.ok_or_else(|| Error::Internal("snapshot root vanished".into()))?;
    let tmp = temp_name(id);
    let tmp_fd = fsops::mkdir_exact(root.as_fd(), &tmp, 0o750).map_err(|e| Error::io("creating snapshot", e))?;
    let result = (|| {
        fsops::mkdir_exact(tmp_fd.as_fd(), source_id, 0o750).map_err(|e| Error::io("creating source marker", e))?;
        // A read-only subvolume snapshot where the pool's backend has one (btrfs), else a
        // (reflink) copy.
        if pool.quota.snapshot(tmp_fd.as_fd(), DATA_DIR, source.as_fd())? {
            return Ok(copy::CopyStats::default());
        }
        let data =
            fsops::mkdir_exact(tmp_fd.as_fd(), DATA_DIR, 0o750).map_err(|e| Error::io("creating snapshot data", e))?;
        let stats = copy::copy_tree(source.as_fd(), data.as_fd())?;
        pool.snapshot_commits().data(data.as_fd())?;
        Ok::<_, Error>(stats)
    })();
    drop(tmp_fd);
    let stats = match result {
        Ok(s) => s,
        Err(e) => {
            let _ = pool.quota.remove(root.as_fd(), &tmp);
            return Err(e);
        }
    };
    match fsops::rename_noreplace(root.as_fd(), &tmp, id) {
        Ok(()) => {}
        Err(Errno::EXIST) | Err(Errno::NOTEMPTY) => {
            let _ = pool.quota.remove(root.as_fd(), &tmp);
            // Under the snapshot's exclusive key nothing of ours can have appeared meanwhile
            // (another node's driver on a shared pool could); a directory that is no snapshot
            // stays in the way for good, which retrying cannot change.
            if read_info(pool, root.as_fd(), id)?.is_none() {
                return Err(Error::AlreadyExists(format!(
                    "{} exists and is not a snapshot; it is left alone",
                    snapshot_root(pool)?.join(id).display()
                )));
            }
            return Err(Error::Aborted(format!("snapshot {id} appeared concurrently; retry")));
        }
        Err(e) => return Err(Error::io(format!("renaming snapshot {id} into place"), e)),
    }
    pool.snapshot_commits().entries(root.as_fd())?;
    tracing::info!(
        snapshot = id,
        files = stats.files,
        reflinked = stats.reflinked,
        bytes = stats.bytes,
        "snapshot data copied"
    );
    read_info(pool, root.as_fd(), id)?.ok_or_else(|| Error::Internal(format!("snapshot {id} vanished after creation")))
}

/// Removes temporaries and interrupted deletions left in `pool`'s snapshot directory.
pub fn sweep(pool: &Pool) -> Result<usize> {
    if pool.snapshot_path.is_none() {
        return Ok(0);
    }
    match open_root(pool, false)? {
        Some(root) => crate::ops::volumes::sweep(root.as_fd(), &*pool.quota),
        None => Ok(0),
    }
}

/// Syncs `pool`'s snapshot directory, so that a snapshot found there (perhaps renamed into
/// place just before a crash) is durable before it is acknowledged again.
pub fn sync_entries(pool: &Pool) -> Result<()> {
    if let Some(root) = open_root(pool, false)? {
        pool.snapshot_commits().entries(root.as_fd())?;
    }
    Ok(())
}

/// Deletes snapshot `id` from `pool`; missing is success. Only a snapshot is deleted: an entry
/// of that name that is not one (no source marker: a directory someone else put there, or a
/// volume when paths overlap) is left alone and counts as no snapshot.
pub fn delete(pool: &Pool, id: &str) -> Result<bool> {
    if pool.snapshot_path.is_none() {
        return Ok(false);
    }
    let Some(root) = open_root(pool, false)? else {
        return Ok(false);
    };
    let gone = deleting_name(id);
    pool.quota.remove(root.as_fd(), &gone)?;
    match fsops::entry(root.as_fd(), id).map_err(|e| Error::io("stat snapshot", e))? {
        Entry::Missing => {
            // Gone, but maybe by a rename a crash kept from being synced: sync before saying so.
            pool.snapshot_commits().entries(root.as_fd())?;
            return Ok(false);
        }
        Entry::Dir { .. } => {}
        Entry::Symlink | Entry::Other => {
            return Err(Error::FailedPrecondition(format!(
                "snapshot entry {id} in storage pool {} is not a directory; left alone",
                pool.name
            )));
        }
    }
    if read_info(pool, root.as_fd(), id)?.is_none() {
        tracing::warn!(
            snapshot_id = id,
            pool = %pool.name,
            "not deleting {}: it is not a snapshot (no source marker)",
            snapshot_root(pool)?.join(id).display()
        );
        return Ok(false);
    }
    fsops::rename_noreplace(root.as_fd(), id, &gone).map_err(|e| Error::io("renaming snapshot for deletion", e))?;
    pool.snapshot_commits().entries(root.as_fd())?;
    pool.quota.remove(root.as_fd(), &gone)?;
    Ok(true)
}

/// Opens the data directory of snapshot `id` for a restore.
pub fn open_data(pool: &Pool, id: &str) -> Result<OwnedFd> {
    let not_found = || Error::NotFound(format!("snapshot {id} does not exist in storage pool {}", pool.name));
    let root = open_root(pool, false)?.ok_or_else(not_found)?;
    let snap = match fsops::open_child_dir(root.as_fd(), id) {
        Ok(fd) => fd,
        Err(Errno::NOENT) | Err(Errno::LOOP) | Err(Errno::NOTDIR) => return Err(not_found()),
        Err(e) => return Err(Error::io("opening snapshot", e)),
    };
    match fsops::open_child_dir(snap.as_fd(), DATA_DIR) {
        Ok(fd) => Ok(fd),
        Err(Errno::NOENT) | Err(Errno::LOOP) | Err(Errno::NOTDIR) => Err(not_found()),
        Err(e) => Err(Error::io("opening snapshot data", e)),
    }
}
