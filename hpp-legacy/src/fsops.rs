//! Volume directories on disk: created and removed through directory file descriptors with
//! `O_NOFOLLOW`, so a symlink planted inside the base directory can never redirect a mkdir,
//! chmod or recursive delete elsewhere, and deletion stops at mount points. The recursive
//! delete is hpp's one tree walker ([`hpp_fs::remove_tree`]): any depth, bounded descriptors.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use hpp_fs::quota::{QuotaBackend, QuotaError, Unlimited};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, StatxFlags};
use rustix::io::Errno;

use crate::config::ARCHIVE_PREFIX;
use crate::selinux::Labeler;
use crate::{Error, Result};

/// Mode of intermediate directories created by templates with `/`.
const INTERMEDIATE_MODE: u32 = 0o755;

/// Ownership and permissions of a new volume directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirSpec {
    /// Permission bits, applied with `fchmod` (so the umask does not matter).
    pub mode: u32,
    /// Owner, if set.
    pub uid: Option<u32>,
    /// Group, if set.
    pub gid: Option<u32>,
    /// CephFS quota in bytes (`ceph.quota.max_bytes`), if requested.
    pub ceph_quota_bytes: Option<u64>,
}

/// Extended attribute CephFS reads a directory quota from.
pub const CEPH_QUOTA_XATTR: &str = "ceph.quota.max_bytes";

/// What creating a directory did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Created {
    /// False when it already existed (a retry after a failed PV create).
    pub newly_created: bool,
    /// SELinux context set, if the host enforces SELinux.
    pub selinux_context: Option<String>,
}

/// What deleting a directory did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Removed {
    /// Removed with its content.
    Deleted,
    /// Renamed to this name in the same parent.
    Archived(String),
    /// Moved into the base directory's trash as this entry.
    Trashed(String),
    /// Was not there (already cleaned up).
    Missing,
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

fn normal_components(rel: &Path) -> Result<Vec<&std::ffi::OsStr>> {
    let mut out = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(n) => out.push(n),
            _ => {
                return Err(Error::UnsafeDelete {
                    path: rel.to_path_buf(),
                    reason: "path has a component that is not a plain name".into(),
                });
            }
        }
    }
    if out.is_empty() {
        return Err(Error::UnsafeDelete {
            path: rel.to_path_buf(),
            reason: "empty relative path".into(),
        });
    }
    Ok(out)
}

fn open_base(base: &Path) -> Result<OwnedFd> {
    rustix::fs::open(
        base,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::fs("open base directory", base, e))
}

fn open_child(parent: impl AsFd, name: &std::ffi::OsStr, full: &Path) -> Result<OwnedFd> {
    rustix::fs::openat(parent, name, dir_flags(), Mode::empty()).map_err(|e| match e {
        Errno::LOOP | Errno::NOTDIR => Error::UnsafeDelete {
            path: full.to_path_buf(),
            reason: "is a symlink or not a directory".into(),
        },
        e => Error::fs("open", full, e),
    })
}

/// Total size in bytes of the filesystem holding `dir`.
pub fn filesystem_size(dir: &Path) -> Result<u64> {
    let st = rustix::fs::statvfs(dir).map_err(|e| Error::fs("statvfs", dir, e))?;
    Ok(st.f_blocks.saturating_mul(st.f_frsize))
}

/// Creates `base/rel` (parents as needed, never through symlinks), then sets mode, owner and
/// SELinux label. `base` must exist: it is never created here.
pub fn create_volume_dir(base: &Path, rel: &Path, spec: DirSpec, labeler: &Labeler) -> Result<Created> {
    create_volume_dir_in(base, rel, spec, labeler, &Unlimited, 0)
}

/// [`create_volume_dir`] through a quota backend: the leaf is made by `backend` (a subvolume,
/// a directory with a project id, ...) limited to `limit_bytes`, so node-local pools of the
/// legacy provisioner get the same enforcement as the CSI driver's.
pub fn create_volume_dir_in(
    base: &Path,
    rel: &Path,
    spec: DirSpec,
    labeler: &Labeler,
    backend: &dyn QuotaBackend,
    limit_bytes: u64,
) -> Result<Created> {
    let parts = normal_components(rel)?;
    let mut parent = open_base(base)?;
    let mut path = base.to_path_buf();
    let (leaf, dirs) = parts.split_last().ok_or_else(|| Error::Config("empty path".into()))?;
    for name in dirs {
        path.push(name);
        match rustix::fs::mkdirat(&parent, *name, Mode::from_raw_mode(INTERMEDIATE_MODE)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(Error::fs("mkdir", &path, e)),
        }
        parent = open_child(&parent, name, &path)?;
    }
    path.push(leaf);
    let leaf_name = leaf
        .to_str()
        .ok_or_else(|| Error::Config(format!("{} is not UTF-8", path.display())))?;
    let newly_created = match rustix::fs::statat(&parent, *leaf, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(_) => false,
        Err(Errno::NOENT) => match backend.create(parent.as_fd(), leaf_name, limit_bytes) {
            Ok(_) => true,
            Err(QuotaError::Io { source, .. }) if source.raw_os_error() == Some(Errno::EXIST.raw_os_error()) => false,
            Err(e) => return Err(e.into()),
        },
        Err(e) => return Err(Error::fs("stat", &path, e)),
    };
    let result = open_child(&parent, leaf, &path).and_then(|dir| set_up(&parent, &dir, &path, spec, labeler));
    match result {
        Ok(selinux_context) => Ok(Created {
            newly_created,
            selinux_context,
        }),
        Err(e) => {
            if newly_created {
                // Leave nothing half-configured behind; the next attempt starts clean.
                let _ = backend.remove(parent.as_fd(), leaf_name);
            }
            Err(e)
        }
    }
}

fn set_up(parent: &OwnedFd, dir: &OwnedFd, path: &Path, spec: DirSpec, labeler: &Labeler) -> Result<Option<String>> {
    if spec.uid.is_some() || spec.gid.is_some() {
        rustix::fs::fchown(
            dir,
            spec.uid.map(rustix::fs::Uid::from_raw),
            spec.gid.map(rustix::fs::Gid::from_raw),
        )
        .map_err(|e| Error::fs("chown", path, e))?;
    }
    rustix::fs::fchmod(dir, Mode::from_raw_mode(spec.mode)).map_err(|e| Error::fs("chmod", path, e))?;
    if let Some(bytes) = spec.ceph_quota_bytes {
        rustix::fs::fsetxattr(
            dir,
            CEPH_QUOTA_XATTR,
            bytes.to_string().as_bytes(),
            rustix::fs::XattrFlags::empty(),
        )
        .map_err(|e| Error::fs("setxattr ceph.quota.max_bytes", path, e))?;
    }
    labeler.label(parent, dir, path)
}

/// Removes `base/rel` if it is an empty directory (undo of a create whose PV failed).
pub fn remove_if_empty(base: &Path, rel: &Path) -> Result<()> {
    let (parent, leaf, path) = open_parent(base, rel)?;
    match rustix::fs::unlinkat(&parent, leaf, AtFlags::REMOVEDIR) {
        Ok(()) | Err(Errno::NOENT) | Err(Errno::NOTEMPTY) | Err(Errno::EXIST) => Ok(()),
        Err(e) => Err(Error::fs("rmdir", path, e)),
    }
}

fn open_parent<'a>(base: &Path, rel: &'a Path) -> Result<(OwnedFd, &'a std::ffi::OsStr, PathBuf)> {
    let parts = normal_components(rel)?;
    let mut parent = open_base(base)?;
    let mut path = base.to_path_buf();
    let (leaf, dirs) = parts.split_last().ok_or_else(|| Error::Config("empty path".into()))?;
    for name in dirs {
        path.push(name);
        parent = open_child(&parent, name, &path)?;
    }
    path.push(leaf);
    Ok((parent, leaf, path))
}

/// Identity of the mount an open file lives on: the mount id where the kernel has it (a btrfs
/// subvolume has a device of its own but is no mount), else the device.
fn mount_key(fd: impl AsFd, path: &Path) -> Result<(u64, u32, u32)> {
    let st = rustix::fs::statx(
        fd,
        "",
        AtFlags::EMPTY_PATH,
        StatxFlags::BASIC_STATS | StatxFlags::MNT_ID,
    )
    .map_err(|e| Error::fs("statx", path, e))?;
    if st.stx_mask & StatxFlags::MNT_ID.bits() != 0 {
        Ok((st.stx_mnt_id, 0, 0))
    } else {
        Ok((0, st.stx_dev_major, st.stx_dev_minor))
    }
}

/// Removes (or archives) the volume directory `dir`, which must be strictly inside `base`.
/// Never follows symlinks (they are unlinked as links) and refuses to cross into another mount.
pub fn remove_volume_dir(base: &Path, dir: &Path, archive: bool) -> Result<Removed> {
    remove_volume_dir_in(base, dir, archive, &Unlimited)
}

/// [`remove_volume_dir`] through the quota backend that made the directory (a subvolume is
/// destroyed, a project id's limit cleared).
pub fn remove_volume_dir_in(base: &Path, dir: &Path, archive: bool, backend: &dyn QuotaBackend) -> Result<Removed> {
    let rel = dir.strip_prefix(base).map_err(|_| Error::UnsafeDelete {
        path: dir.to_path_buf(),
        reason: format!("not inside {}", base.display()),
    })?;
    let (parent, leaf, path) = match open_parent(base, rel) {
        Ok(v) => v,
        Err(Error::Fs { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => return Ok(Removed::Missing),
        Err(e) => return Err(e),
    };
    let st = match rustix::fs::statat(&parent, leaf, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::NOENT) => return Ok(Removed::Missing),
        Err(e) => return Err(Error::fs("stat", &path, e)),
    };
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return Err(Error::UnsafeDelete {
            path,
            reason: "is not a directory (symlink?)".into(),
        });
    }
    if archive {
        return archive_dir(&parent, leaf, &path);
    }
    check_same_mount(&parent, leaf, &path)?;
    match leaf.to_str() {
        Some(name) => backend.remove(parent.as_fd(), name).map_err(|e| match e {
            QuotaError::Walk(w) => walk_error(w, &path),
            other => other.into(),
        })?,
        None => hpp_fs::remove_tree(parent.as_fd(), leaf).map_err(|e| walk_error(e, &path))?,
    }
    Ok(Removed::Deleted)
}

/// Refuses a directory that is the root of another mount: deleting or moving it would touch
/// another filesystem.
fn check_same_mount(parent: &OwnedFd, leaf: &std::ffi::OsStr, path: &Path) -> Result<()> {
    let top = open_child(parent, leaf, path)?;
    if mount_key(&top, path)? != mount_key(parent, path)? {
        return Err(Error::UnsafeDelete {
            path: path.to_path_buf(),
            reason: "is a mount point".into(),
        });
    }
    Ok(())
}

/// Moves the volume directory `dir` (strictly inside `base`) into `<base>/.hpp-trash` as
/// `<leaf name>@<now>` instead of removing it, durably (both directories synced) before it
/// returns. The same checks as a removal: a real directory on the base's filesystem.
pub fn trash_volume_dir(base: &Path, dir: &Path, now: std::time::SystemTime) -> Result<Removed> {
    let rel = dir.strip_prefix(base).map_err(|_| Error::UnsafeDelete {
        path: dir.to_path_buf(),
        reason: format!("not inside {}", base.display()),
    })?;
    let (parent, leaf, path) = match open_parent(base, rel) {
        Ok(v) => v,
        Err(Error::Fs { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => return Ok(Removed::Missing),
        Err(e) => return Err(e),
    };
    match rustix::fs::statat(&parent, leaf, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {}
        Ok(_) => {
            return Err(Error::UnsafeDelete {
                path,
                reason: "is not a directory (symlink?)".into(),
            });
        }
        Err(Errno::NOENT) => return Ok(Removed::Missing),
        Err(e) => return Err(Error::fs("stat", &path, e)),
    }
    check_same_mount(&parent, leaf, &path)?;
    let name = leaf.to_str().ok_or_else(|| Error::UnsafeDelete {
        path: path.clone(),
        reason: "its name is not UTF-8; it cannot be named in the trash".into(),
    })?;
    let base_fd = open_base(base)?;
    let trash_err = |e: hpp_fs::trash::TrashError| Error::UnsafeDelete {
        path: base.join(hpp_fs::trash::TRASH_DIR),
        reason: e.to_string(),
    };
    let trash = hpp_fs::trash::open(base_fd.as_fd(), true)
        .map_err(trash_err)?
        .ok_or_else(|| Error::Config("the trash directory was not made".into()))?;
    let entry = match hpp_fs::trash::move_in(parent.as_fd(), name, trash.as_fd(), now) {
        Ok(entry) => entry,
        Err(hpp_fs::trash::TrashError::Missing(_)) => return Ok(Removed::Missing),
        Err(e) => return Err(trash_err(e)),
    };
    for fd in [&parent, &trash] {
        rustix::fs::fsync(fd).map_err(|e| Error::fs("fsync", base, e))?;
    }
    Ok(Removed::Trashed(entry.to_string()))
}

/// Purges the trash of `base` by `settings` (entries older than the retention, then the
/// oldest while free space is under the floor), removing each through `backend`. Nothing when
/// `base` has no trash.
pub fn purge_trash(
    base: &Path,
    settings: hpp_fs::trash::Settings,
    now: std::time::SystemTime,
    backend: &dyn QuotaBackend,
) -> Result<hpp_fs::trash::PurgeReport> {
    let base_fd = open_base(base)?;
    let trash_err = |e: hpp_fs::trash::TrashError| Error::UnsafeDelete {
        path: base.join(hpp_fs::trash::TRASH_DIR),
        reason: e.to_string(),
    };
    let Some(trash) = hpp_fs::trash::open(base_fd.as_fd(), false).map_err(trash_err)? else {
        return Ok(hpp_fs::trash::PurgeReport::default());
    };
    hpp_fs::trash::purge(
        trash.as_fd(),
        hpp_fs::trash::Purge::Due { settings, now },
        |fd, name| backend.remove(fd, name),
    )
    .map_err(trash_err)
}

fn archive_dir(parent: &OwnedFd, leaf: &std::ffi::OsStr, path: &Path) -> Result<Removed> {
    let base_name = format!("{ARCHIVE_PREFIX}{}", leaf.to_string_lossy());
    for n in 0..1000u32 {
        let name = if n == 0 {
            base_name.clone()
        } else {
            format!("{base_name}-{n}")
        };
        match rustix::fs::statat(parent, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(_) => continue,
            Err(Errno::NOENT) => {}
            Err(e) => return Err(Error::fs("stat", path.with_file_name(&name), e)),
        }
        rustix::fs::renameat(parent, leaf, parent, name.as_str()).map_err(|e| Error::fs("rename", path, e))?;
        return Ok(Removed::Archived(name));
    }
    Err(Error::UnsafeDelete {
        path: path.to_path_buf(),
        reason: "too many archived copies".into(),
    })
}

/// Maps a walk error below `dir` (whose parent the walk started in) to this crate's errors.
fn walk_error(e: hpp_fs::WalkError, dir: &Path) -> Error {
    let under = |p: &Path| dir.parent().map_or_else(|| p.to_path_buf(), |d| d.join(p));
    match e {
        hpp_fs::WalkError::CrossesMount { path } => Error::UnsafeDelete {
            path: under(&path),
            reason: "a mount point inside the volume".into(),
        },
        hpp_fs::WalkError::Io { op, path, source } => Error::fs(op, under(&path), source),
        other => Error::UnsafeDelete {
            path: dir.to_path_buf(),
            reason: other.to_string(),
        },
    }
}

#[cfg(test)]
#[path = "fsops_tests.rs"]
mod tests;
