//! The quota backend of a guarded pool whose filesystem is not mounted yet when the driver
//! starts (the pool mounter, or the node's fstab, comes after the driver). What is at the pool
//! path then is the root filesystem's directory: choosing the backend from it would crash-loop
//! the driver for an explicit mode (no btrfs, no project quota there) or, for `auto`, pick the
//! wrong one for the life of the process. So the choice waits until the pool is a mount point;
//! until then the pool is unusable anyway (the mount guard), and nothing reaches the backend
//! but a question about its mode.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use hpp_api::quota::QuotaMode;
use hpp_fs::quota::image::IMAGE_FILE;
use hpp_fs::quota::{Layout, QuotaBackend, QuotaError, QuotaUsage};

use crate::pool::fsops;

/// Chooses the real backend the first time it is needed with the pool mounted.
#[derive(Debug)]
pub struct Deferred {
    pool: String,
    mode: QuotaMode,
    path: PathBuf,
    chosen: OnceLock<Arc<dyn QuotaBackend>>,
}

impl Deferred {
    /// The backend `mode` of pool `pool` at `path`, chosen once `path` is a mount point.
    pub fn new(pool: &str, mode: QuotaMode, path: &Path) -> Self {
        Self {
            pool: pool.to_owned(),
            mode,
            path: path.to_path_buf(),
            chosen: OnceLock::new(),
        }
    }

    /// The chosen backend, choosing it now if the pool is mounted.
    fn backend(&self) -> Result<&Arc<dyn QuotaBackend>, QuotaError> {
        if let Some(chosen) = self.chosen.get() {
            return Ok(chosen);
        }
        if !fsops::is_mount_point(&self.path) {
            return Err(QuotaError::Unsupported(format!(
                "storage pool {} is not mounted yet; its quota backend ({}) is set up once it is",
                self.pool, self.mode
            )));
        }
        let built = crate::pool::build_quota_backend(&self.pool, self.mode, &self.path)
            .map_err(|e| QuotaError::Unsupported(e.to_string()))?;
        tracing::info!(pool = %self.pool, quota = built.name(), "pool mounted; quota backend set up");
        Ok(self.chosen.get_or_init(|| built))
    }
}

impl QuotaBackend for Deferred {
    fn name(&self) -> &'static str {
        match self.backend() {
            Ok(b) => b.name(),
            Err(_) => self.mode.as_str(),
        }
    }

    fn granularity(&self) -> u64 {
        self.backend().map_or(1, |b| b.granularity())
    }

    /// Before the pool is mounted: what the mode promises (`auto` promises nothing yet).
    fn enforces(&self) -> bool {
        match self.backend() {
            Ok(b) => b.enforces(),
            Err(_) => !matches!(self.mode, QuotaMode::None | QuotaMode::Auto),
        }
    }

    fn layout(&self) -> Layout {
        match self.backend() {
            Ok(b) => b.layout(),
            Err(_) if self.mode == QuotaMode::Image => Layout::Image(IMAGE_FILE),
            Err(_) => Layout::Directory,
        }
    }

    fn needs_node_expansion(&self) -> bool {
        match self.backend() {
            Ok(b) => b.needs_node_expansion(),
            Err(_) => self.mode == QuotaMode::Image,
        }
    }

    fn create(&self, pool: BorrowedFd<'_>, name: &str, limit_bytes: u64) -> Result<OwnedFd, QuotaError> {
        self.backend()?.create(pool, name, limit_bytes)
    }

    /// Before the pool is mounted: as often as btrfs with full quotas would need it, so the
    /// task that runs it exists when the backend is chosen (it does nothing until then).
    fn nested_containment(&self) -> Option<std::time::Duration> {
        match self.backend() {
            Ok(b) => b.nested_containment(),
            Err(_) => matches!(self.mode, QuotaMode::Btrfs | QuotaMode::Auto)
                .then_some(hpp_fs::quota::btrfs::CONTAIN_INTERVAL),
        }
    }

    fn contain_nested(&self, pool: BorrowedFd<'_>) -> Result<usize, QuotaError> {
        match self.backend() {
            Ok(b) => b.contain_nested(pool),
            Err(_) => Ok(0),
        }
    }

    fn set_limit(&self, pool: BorrowedFd<'_>, name: &str, limit_bytes: u64) -> Result<(), QuotaError> {
        self.backend()?.set_limit(pool, name, limit_bytes)
    }

    fn usage(&self, pool: BorrowedFd<'_>, name: &str) -> Result<Option<QuotaUsage>, QuotaError> {
        self.backend()?.usage(pool, name)
    }

    fn release(&self, pool: BorrowedFd<'_>, name: &str) -> Result<(), QuotaError> {
        self.backend()?.release(pool, name)
    }

    fn remove(&self, pool: BorrowedFd<'_>, name: &str) -> Result<(), QuotaError> {
        self.backend()?.remove(pool, name)
    }

    fn clone_volume(
        &self,
        pool: BorrowedFd<'_>,
        name: &str,
        source: BorrowedFd<'_>,
        limit_bytes: u64,
    ) -> Result<Option<OwnedFd>, QuotaError> {
        self.backend()?.clone_volume(pool, name, source, limit_bytes)
    }

    fn snapshot(&self, dir: BorrowedFd<'_>, name: &str, source: BorrowedFd<'_>) -> Result<bool, QuotaError> {
        self.backend()?.snapshot(dir, name, source)
    }

    fn parameters(&self) -> &'static [(&'static str, &'static str)] {
        self.backend().map_or(&[], |b| b.parameters())
    }

    fn set_parameter(&self, pool: BorrowedFd<'_>, name: &str, key: &str, value: &str) -> Result<(), QuotaError> {
        self.backend()?.set_parameter(pool, name, key, value)
    }

    fn in_use(&self, pool: BorrowedFd<'_>, name: &str) -> Result<Option<String>, QuotaError> {
        self.backend()?.in_use(pool, name)
    }

    fn mount_at(
        &self,
        volume: BorrowedFd<'_>,
        target: &Path,
        flags: rustix::mount::MountFlags,
    ) -> Result<bool, QuotaError> {
        self.backend()?.mount_at(volume, target, flags)
    }

    fn shared_mount(
        &self,
        volume: BorrowedFd<'_>,
        target: &Path,
        read_only: bool,
    ) -> Result<Option<OwnedFd>, QuotaError> {
        self.backend()?.shared_mount(volume, target, read_only)
    }

    fn expand_mounted(&self, target: &Path) -> Result<(), QuotaError> {
        self.backend()?.expand_mounted(target)
    }
}
