//! The `btrfs` backend: every volume is a subvolume whose qgroup `0/<id>` carries the limit
//! on referenced bytes. Usage is read from the qgroup's sysfs counters (no tree walk), clones
//! and snapshots are subvolume snapshots (instant, copy-on-write), deletion destroys the
//! subvolume in one ioctl.
//!
//! Quotas are a filesystem-wide switch: a pool configured for btrfs turns them on when it is
//! opened (logged; the kernel rescans existing data once). A subvolume's qgroup is removed
//! with it; when the kernel is still dropping the subvolume's extents it refuses (`EBUSY`) and
//! removes the qgroup itself when the drop finishes (Linux 6.7+; older kernels keep a stale
//! qgroup, visible as `<stale>` in `btrfs qgroup show`, harmless and removable by hand).

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

/// The btrfs backend for one pool.
#[derive(Debug, Clone)]
pub struct Btrfs {
    /// `/sys/fs/btrfs/<uuid>/qgroups`, where the kernel publishes every qgroup's counters.
    qgroups: PathBuf,
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
            tracing::warn!(fs = %uuid_string(&uuid), "btrfs quotas are off on the pool's filesystem; turning them on");
            hpp_sys::btrfs::quota_enable(pool).map_err(io_err("enabling btrfs quotas"))?;
            if !qgroups.is_dir() {
                return Err(QuotaError::Unsupported(format!(
                    "btrfs quotas were enabled but {} does not exist (kernel older than 5.9?)",
                    qgroups.display()
                )));
            }
        }
        Ok(Btrfs { qgroups })
    }

    fn read_counter(&self, id: u64, counter: &str) -> Result<u64, QuotaError> {
        let path = self.qgroups.join(format!("0_{id}")).join(counter);
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

    /// Finishes a fresh subvolume: mode, limit. Destroys it on failure.
    fn finish(&self, pool: BorrowedFd<'_>, name: &str, limit_bytes: u64) -> Result<OwnedFd, QuotaError> {
        let result = self.subvolume(pool, name).and_then(|(fd, id)| {
            hpp_sys::btrfs::qgroup_limit(fd.as_fd(), id, limit_bytes)
                .map_err(io_err(format!("setting the qgroup limit of {name}")))?;
            Ok(fd)
        });
        if result.is_err() {
            let _ = hpp_sys::btrfs::subvolume_destroy(pool, name);
        }
        result
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
fn destroy_nested(dir: BorrowedFd<'_>, name: &str) -> Result<(), QuotaError> {
    let prefix = Path::new(name);
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
    Ok(())
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
        match hpp_sys::btrfs::snapshot_create(dir, name, source, true) {
            Ok(()) => Ok(true),
            Err(e) if Errno::from_io_error(&e) == Some(Errno::XDEV) => Ok(false),
            Err(e) => Err(io_err(format!("taking read-only snapshot {name}"))(e)),
        }
    }

    fn set_limit(&self, pool: BorrowedFd<'_>, name: &str, limit_bytes: u64) -> Result<(), QuotaError> {
        let (fd, id) = self.subvolume(pool, name)?;
        hpp_sys::btrfs::qgroup_limit(fd.as_fd(), id, limit_bytes)
            .map_err(io_err(format!("setting the qgroup limit of {name}")))
    }

    fn usage(&self, pool: BorrowedFd<'_>, name: &str) -> Result<Option<QuotaUsage>, QuotaError> {
        let fd = crate::open_child_dir(pool, name).map_err(errno(format!("opening volume {name}")))?;
        if !is_subvolume(fd.as_fd()) {
            // A volume from before the pool used btrfs: the caller walks it.
            return Ok(None);
        }
        let id = hpp_sys::btrfs::subvolume_id(fd.as_fd()).map_err(io_err(format!("subvolume id of {name}")))?;
        let limit = self.read_counter(id, "max_referenced")?;
        Ok(Some(QuotaUsage {
            used_bytes: self.read_counter(id, "referenced")?,
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
        if let Err(e) = hpp_sys::btrfs::subvolume_destroy(pool, name) {
            // Subvolumes the tenant made inside the volume block the one-shot destroy: destroy
            // them (deepest first), then the volume; its tree is walked only if that still fails.
            tracing::debug!(volume = name, error = %e, "destroying the subvolume failed; destroying the subvolumes inside first");
            let fd = crate::open_child_dir(pool, name).map_err(errno(format!("opening {name}")))?;
            destroy_nested(fd.as_fd(), name)?;
            drop(fd);
            if let Err(e) = hpp_sys::btrfs::subvolume_destroy(pool, name) {
                tracing::debug!(volume = name, error = %e, "destroying the subvolume failed; removing its tree");
                super::remove_tree(pool, name)?;
            }
        }
        match hpp_sys::btrfs::qgroup_remove(pool, id) {
            Ok(()) => {}
            Err(e) if matches!(Errno::from_io_error(&e), Some(Errno::BUSY | Errno::NOENT)) => {
                tracing::debug!(
                    volume = name,
                    qgroup = id,
                    "the kernel removes the qgroup once the subvolume is dropped"
                );
            }
            Err(e) => {
                tracing::warn!(volume = name, qgroup = id, error = %e, "cannot remove the qgroup of a deleted subvolume")
            }
        }
        Ok(())
    }

    fn release(&self, _pool: BorrowedFd<'_>, _name: &str) -> Result<(), QuotaError> {
        // The qgroup goes with the subvolume in `remove`.
        Ok(())
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
