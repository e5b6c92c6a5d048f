//! Per-volume size limits: one [`QuotaBackend`] per pool. The driver (and the legacy
//! provisioner) build every volume through its pool's backend, so a size is enforced the same
//! way whichever component made the volume.
//!
//! A backend works on names directly inside an opened pool directory (the caller has already
//! validated them and holds the per-volume lock). It owns only what it made: a subvolume, a
//! project id, an image file. The [`Unlimited`] backend is KubeVirt's behaviour: plain
//! directories, sizes recorded but not enforced.

use std::fmt::Debug;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::Path;

pub mod btrfs;
pub mod image;
pub mod project;

pub use btrfs::Btrfs;
pub use image::{Image, ImageFs};
pub use project::{Project, ProjectFs};

use crate::WalkError;
mod tuning;
pub use tuning::{COMPRESSION_KEY, Compression, INODE_LIMIT_KEY, KNOWN_KEYS, Tuning, TuningError};

/// Why a backend operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QuotaError {
    /// A system call or tool failed.
    #[error("{op}: {source}")]
    Io {
        /// What was being done.
        op: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The pool cannot use this backend (wrong filesystem, quotas off, tool missing).
    #[error("{0}")]
    Unsupported(String),
    /// The requested limit cannot be applied (for example below what is already used).
    #[error("{0}")]
    OutOfRange(String),
    /// A parameter or value the backend does not understand.
    #[error("{0}")]
    Invalid(String),
    /// The operation would lose data or escape a limit, so it is refused (a btrfs snapshot of a
    /// volume holding subvolumes would not include them).
    #[error("{0}")]
    Refused(String),
    /// Removing a volume's tree failed (a mount inside it, a permission error).
    #[error(transparent)]
    Walk(#[from] WalkError),
}

/// Usage of one volume as the backend accounts it, read in O(1) (no tree walk).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuotaUsage {
    /// Bytes used.
    pub used_bytes: u64,
    /// The enforced limit in bytes (0 = none).
    pub limit_bytes: u64,
    /// Inodes used, when known.
    pub used_inodes: Option<u64>,
    /// The inode limit, when one is set.
    pub limit_inodes: Option<u64>,
}

/// How publish presents a volume to a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// The volume directory itself is bind-mounted.
    Directory,
    /// The volume directory holds a filesystem image (this file name) that is loop-mounted.
    Image(&'static str),
}

/// Enforces volume sizes in one pool.
pub trait QuotaBackend: Send + Sync + Debug {
    /// The backend's name as configured (`none`, `btrfs`, `xfs-project`, ...).
    fn name(&self) -> &'static str;

    /// Limits are whole multiples of this many bytes; requests are rounded up to it.
    fn granularity(&self) -> u64 {
        1
    }

    /// Whether sizes are enforced at all (false only for [`Unlimited`]).
    fn enforces(&self) -> bool {
        true
    }

    /// How publish presents the volume.
    fn layout(&self) -> Layout {
        Layout::Directory
    }

    /// Whether NodeExpandVolume has work to do after the limit was raised (growing a
    /// filesystem inside an image); false when the controller's new limit is already in force.
    fn needs_node_expansion(&self) -> bool {
        false
    }

    /// Makes an empty volume called `name` directly in `pool`, limited to `limit_bytes`
    /// (0 = no limit), and returns the opened directory its content goes into.
    fn create(&self, pool: BorrowedFd<'_>, name: &str, limit_bytes: u64) -> Result<OwnedFd, QuotaError>;

    /// Sets the limit of existing volume `name` to `limit_bytes`, while it may be in use.
    fn set_limit(&self, pool: BorrowedFd<'_>, name: &str, limit_bytes: u64) -> Result<(), QuotaError>;

    /// Usage and limit of volume `name` when the backend keeps them (`None`: walk the tree).
    fn usage(&self, pool: BorrowedFd<'_>, name: &str) -> Result<Option<QuotaUsage>, QuotaError>;

    /// Releases what the backend attached to volume `name` (qgroup, project id) after its
    /// tree was removed; [`QuotaBackend::remove`] calls it.
    fn release(&self, pool: BorrowedFd<'_>, name: &str) -> Result<(), QuotaError>;

    /// How often [`QuotaBackend::contain_nested`] must run for sizes to hold: `Some` for a
    /// backend where a tenant can make a new accounting unit inside its volume that the
    /// filesystem does not count by itself (btrfs with full quotas); `None` (the default)
    /// where nothing needs to.
    fn nested_containment(&self) -> Option<std::time::Duration> {
        None
    }

    /// Adds accounting units a tenant made inside volumes of `pool` since the last call (btrfs
    /// subvolumes) to their volume's limit; returns how many were added.
    fn contain_nested(&self, _pool: BorrowedFd<'_>) -> Result<usize, QuotaError> {
        Ok(0)
    }

    /// Removes volume (or temporary, or snapshot) `name` in `pool` with everything the backend
    /// attached to it; missing is success, so an interrupted removal is simply retried. The
    /// default walks the tree away (never crossing a mount) and then calls `release`; backends
    /// whose volumes are not plain trees (subvolumes) override it.
    fn remove(&self, pool: BorrowedFd<'_>, name: &str) -> Result<(), QuotaError> {
        remove_tree(pool, name)?;
        self.release(pool, name)
    }

    /// Makes volume `name` in `pool` as an instant copy of the volume or snapshot open as
    /// `source`, limited to `limit_bytes`. `Ok(None)` when the backend has no native clone for
    /// this source: the caller then calls `create` and copies.
    fn clone_volume(
        &self,
        _pool: BorrowedFd<'_>,
        _name: &str,
        _source: BorrowedFd<'_>,
        _limit_bytes: u64,
    ) -> Result<Option<OwnedFd>, QuotaError> {
        Ok(None)
    }

    /// Makes `name` in `dir` a read-only, instant snapshot of the volume open as `source`.
    /// `Ok(false)` when the backend has none for this source: the caller copies (reflink).
    fn snapshot(&self, _dir: BorrowedFd<'_>, _name: &str, _source: BorrowedFd<'_>) -> Result<bool, QuotaError> {
        Ok(false)
    }

    /// Names of the per-volume parameters [`QuotaBackend::set_parameter`] accepts (the mutable
    /// parameters of a VolumeAttributesClass), with what each means.
    fn parameters(&self) -> &'static [(&'static str, &'static str)] {
        &[]
    }

    /// Applies parameter `key` = `value` to volume `name` while it may be in use. Unknown keys
    /// and bad values are [`QuotaError::Invalid`].
    fn set_parameter(&self, _pool: BorrowedFd<'_>, _name: &str, key: &str, _value: &str) -> Result<(), QuotaError> {
        Err(QuotaError::Invalid(format!(
            "quota backend {} has no parameter {key:?}",
            self.name()
        )))
    }

    /// Why volume `name` must not be deleted now, when the backend knows of a user that the
    /// mount table does not show as a bind of the volume (an image attached to a loop device).
    fn in_use(&self, _pool: BorrowedFd<'_>, _name: &str) -> Result<Option<String>, QuotaError> {
        Ok(None)
    }

    /// Mounts the volume open as `volume` at `target` with the per-mount `flags` (`RDONLY`,
    /// `NOSUID`, `NOEXEC`, `NOATIME`, ...) when publish is more than a bind mount
    /// ([`Layout::Image`]: attach the image to a loop device and mount it). `Ok(false)`: the
    /// caller bind-mounts the directory. Idempotent: the same image already mounted there is
    /// success.
    fn mount_at(
        &self,
        _volume: BorrowedFd<'_>,
        _target: &Path,
        _flags: rustix::mount::MountFlags,
    ) -> Result<bool, QuotaError> {
        Ok(false)
    }

    /// An `O_PATH` descriptor of the root of a mount of the volume open as `volume` that
    /// already exists (the volume is published at another target), for publish to bind onto
    /// `target` instead of [`QuotaBackend::mount_at`]: a filesystem image must never be
    /// mounted twice (two ext4 mounts of one image corrupt it). `Ok(None)`: call `mount_at`
    /// (nothing mounted yet, or `target` itself is already the mount: a retry). Refuses a
    /// writable publish of a volume whose existing mount is read-only.
    fn shared_mount(
        &self,
        _volume: BorrowedFd<'_>,
        _target: &Path,
        _read_only: bool,
    ) -> Result<Option<OwnedFd>, QuotaError> {
        Ok(None)
    }

    /// Grows the filesystem of a volume mounted at `target` to its (raised) limit: the work of
    /// NodeExpandVolume for backends with [`QuotaBackend::needs_node_expansion`]. Nothing to do
    /// for the others.
    fn expand_mounted(&self, _target: &Path) -> Result<(), QuotaError> {
        Ok(())
    }
}

/// Mode of a new volume directory: what KubeVirt's `mkdir 0777` gives under the usual umask.
/// Set explicitly (the process umask never decides it).
pub const VOLUME_MODE: u32 = 0o755;

/// An [`QuotaError::Io`] for a failed system call, saying what was being done.
pub(crate) fn errno(op: impl Into<String>) -> impl FnOnce(rustix::io::Errno) -> QuotaError {
    let op = op.into();
    move |e| QuotaError::Io { op, source: e.into() }
}

/// An [`QuotaError::Io`] for a failed `std::io` call, saying what was being done.
pub(crate) fn io_err(op: impl Into<String>) -> impl FnOnce(io::Error) -> QuotaError {
    let op = op.into();
    move |source| QuotaError::Io { op, source }
}

/// Makes the plain directory `name` in `pool` (mode [`VOLUME_MODE`]). The caller opens it.
pub(crate) fn mkdir_volume(pool: BorrowedFd<'_>, name: &str) -> Result<(), QuotaError> {
    rustix::fs::mkdirat(pool, name, rustix::fs::Mode::from_raw_mode(VOLUME_MODE))
        .map_err(errno(format!("mkdir {name}")))
}

/// Removes `name` in `pool` and everything below it (the shared walk; missing is success).
pub(crate) fn remove_tree(pool: BorrowedFd<'_>, name: &str) -> Result<(), QuotaError> {
    Ok(crate::remove_tree(pool, std::ffi::OsStr::new(name))?)
}

/// KubeVirt's behaviour: plain directories, no enforcement.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unlimited;

impl QuotaBackend for Unlimited {
    fn name(&self) -> &'static str {
        "none"
    }

    fn enforces(&self) -> bool {
        false
    }

    fn create(&self, pool: BorrowedFd<'_>, name: &str, _limit_bytes: u64) -> Result<OwnedFd, QuotaError> {
        mkdir_volume(pool, name)?;
        crate::open_child_dir(pool, name).map_err(errno(format!("open {name}")))
    }

    fn set_limit(&self, _pool: BorrowedFd<'_>, _name: &str, _limit_bytes: u64) -> Result<(), QuotaError> {
        Ok(())
    }

    fn usage(&self, _pool: BorrowedFd<'_>, _name: &str) -> Result<Option<QuotaUsage>, QuotaError> {
        Ok(None)
    }

    fn release(&self, _pool: BorrowedFd<'_>, _name: &str) -> Result<(), QuotaError> {
        Ok(())
    }
}

/// Rounds `bytes` up to a whole multiple of `granularity` (0 stays 0; saturates at the
/// largest multiple that fits).
pub fn round_up(bytes: u64, granularity: u64) -> u64 {
    if granularity <= 1 || bytes == 0 {
        return bytes;
    }
    match bytes.div_ceil(granularity).checked_mul(granularity) {
        Some(b) => b,
        None => u64::MAX - u64::MAX % granularity,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn rounding_is_up_to_the_granularity_and_never_overflows() {
        assert_eq!(round_up(0, 4096), 0);
        assert_eq!(round_up(1, 4096), 4096);
        assert_eq!(round_up(4096, 4096), 4096);
        assert_eq!(round_up(4097, 1), 4097);
        assert_eq!(round_up(u64::MAX, 4096) % 4096, 0);
    }

    #[test]
    fn the_unlimited_backend_makes_plain_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let pool = std::fs::File::open(tmp.path()).unwrap();
        let b = Unlimited;
        b.create(pool.as_fd(), "v", 1 << 20).unwrap();
        assert!(tmp.path().join("v").is_dir());
        assert!(!b.enforces());
        assert_eq!(b.usage(pool.as_fd(), "v").unwrap(), None);
    }
}
