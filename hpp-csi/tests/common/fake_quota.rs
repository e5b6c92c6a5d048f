//! An enforcing quota backend that needs no special filesystem: plain directories, limits kept
//! in memory. Tests the backend-independent CSI side (rounding, ledger, expansion, stats)
//! against the `QuotaBackend` trait only, as the real backends plug in.

use std::collections::HashMap;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use hpp_fs::quota::{INODE_LIMIT_KEY, QuotaBackend, QuotaError, QuotaUsage, Tuning};

#[derive(Debug)]
pub struct FakeQuota {
    pub granularity: u64,
    pub node_expansion: bool,
    /// Limit per volume, as the backend was told.
    pub limits: Mutex<HashMap<String, u64>>,
    /// The next set_limit fails (and is not applied).
    pub fail_next_set_limit: AtomicBool,
    /// Bytes `usage` reports as used for every volume.
    pub used: u64,
    /// Settings applied per volume by `tune`.
    pub tuned: Mutex<HashMap<String, Tuning>>,
}

impl FakeQuota {
    pub fn new(granularity: u64) -> FakeQuota {
        FakeQuota {
            granularity,
            node_expansion: false,
            limits: Mutex::new(HashMap::new()),
            fail_next_set_limit: AtomicBool::new(false),
            used: 12_288,
            tuned: Mutex::new(HashMap::new()),
        }
    }

    pub fn limit(&self, name: &str) -> Option<u64> {
        self.limits.lock().unwrap().get(name).copied()
    }
}

impl QuotaBackend for FakeQuota {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn granularity(&self) -> u64 {
        self.granularity
    }

    fn needs_node_expansion(&self) -> bool {
        self.node_expansion
    }

    fn create(&self, pool: BorrowedFd<'_>, name: &str, limit_bytes: u64) -> Result<OwnedFd, QuotaError> {
        let fd = hpp_fs::quota::Unlimited.create(pool, name, limit_bytes)?;
        self.limits.lock().unwrap().insert(name.to_owned(), limit_bytes);
        Ok(fd)
    }

    fn set_limit(&self, _pool: BorrowedFd<'_>, name: &str, limit_bytes: u64) -> Result<(), QuotaError> {
        if self.fail_next_set_limit.swap(false, Ordering::SeqCst) {
            return Err(QuotaError::Io {
                op: format!("set limit of {name}"),
                source: std::io::Error::other("injected failure"),
            });
        }
        self.limits.lock().unwrap().insert(name.to_owned(), limit_bytes);
        Ok(())
    }

    fn usage(&self, _pool: BorrowedFd<'_>, name: &str) -> Result<Option<QuotaUsage>, QuotaError> {
        Ok(Some(QuotaUsage {
            used_bytes: self.used,
            limit_bytes: self.limit(name).unwrap_or(0),
            used_inodes: Some(3),
            limit_inodes: None,
        }))
    }

    fn parameters(&self) -> &'static [(&'static str, &'static str)] {
        &[(INODE_LIMIT_KEY, "hard inode limit")]
    }

    fn set_parameter(&self, _pool: BorrowedFd<'_>, name: &str, key: &str, value: &str) -> Result<(), QuotaError> {
        let mut tuned = self.tuned.lock().unwrap();
        let entry = tuned.entry(name.to_owned()).or_default();
        match key {
            INODE_LIMIT_KEY => entry.inode_limit = value.parse().ok(),
            other => return Err(QuotaError::Invalid(format!("no parameter {other}"))),
        }
        Ok(())
    }

    fn release(&self, _pool: BorrowedFd<'_>, name: &str) -> Result<(), QuotaError> {
        self.limits.lock().unwrap().remove(name);
        Ok(())
    }
}
