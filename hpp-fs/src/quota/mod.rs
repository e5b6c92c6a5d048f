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
    /// tree was removed; the caller removes the tree itself.
    fn release(&self, pool: BorrowedFd<'_>, name: &str) -> Result<(), QuotaError>;

    /// Node side of an online expansion, called only when [`Self::needs_node_expansion`]:
    /// makes the raised limit usable in the volume published at `mount` (for example grows the
    /// filesystem inside an image). Must be idempotent.
    fn grow_published(&self, _pool: BorrowedFd<'_>, name: &str, _mount: &Path) -> Result<(), QuotaError> {
        Err(QuotaError::Unsupported(format!(
            "backend {} cannot grow published volume {name}",
            self.name()
        )))
    }

    /// The mutable parameters ([`KNOWN_KEYS`]) this backend applies with [`Self::tune`].
    fn tunables(&self) -> &'static [&'static str] {
        &[]
    }

    /// Applies `tuning` (only keys listed in [`Self::tunables`]) to volume `name` while it may
    /// be in use. Must be idempotent.
    fn tune(&self, _pool: BorrowedFd<'_>, name: &str, tuning: &Tuning) -> Result<(), QuotaError> {
        match tuning.is_empty() {
            true => Ok(()),
            false => Err(QuotaError::Unsupported(format!(
                "backend {} cannot change {} of volume {name}",
                self.name(),
                tuning.keys().join(", ")
            ))),
        }
    }
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
        use rustix::fs::{Mode, OFlags};
        let io = |op: &str, e: rustix::io::Errno| QuotaError::Io {
            op: format!("{op} {name}"),
            source: e.into(),
        };
        rustix::fs::mkdirat(pool, name, Mode::from_raw_mode(0o755)).map_err(|e| io("mkdir", e))?;
        rustix::fs::openat(
            pool,
            name,
            OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::RDONLY,
            Mode::empty(),
        )
        .map_err(|e| io("open", e))
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
