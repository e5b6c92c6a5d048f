//! What an enforcing pool can still promise. The ledger is derived from the volumes on disk on
//! every call (the capacity recorded on each volume, see [`volumes::CAPACITY_XATTR`]), so it
//! never drifts from what exists. The only in-memory state is the set of creations and
//! expansions in flight, which have checked the budget but not yet recorded their size: they
//! are counted too, so two concurrent requests cannot both take the last bytes.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::pool::{Pool, PoolHealth};
use crate::volumes;

/// Sizes promised by operations in flight, per pool and volume.
#[derive(Debug, Default)]
pub struct Ledger {
    in_flight: Mutex<HashMap<(String, String), u64>>,
}

/// What a pool has promised and can still promise, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Budget {
    /// Filesystem size × overcommit percent / 100.
    pub promisable: u64,
    /// Sum of the capacities of the volumes (and operations in flight).
    pub committed: u64,
    /// Bytes free on the filesystem.
    pub free: u64,
}

impl Budget {
    /// The budget of a pool with `health`, `committed` bytes already promised.
    pub fn new(pool: &Pool, health: &PoolHealth, committed: u64) -> Budget {
        let promisable = u128::from(health.total_bytes) * u128::from(pool.overcommit_percent) / 100;
        Budget {
            promisable: u64::try_from(promisable).unwrap_or(u64::MAX),
            committed,
            free: health.available_bytes,
        }
    }

    /// What can still be promised: the smaller of free space and the unpromised share.
    pub fn available(&self) -> u64 {
        self.free.min(self.promisable.saturating_sub(self.committed))
    }
}

/// A size promised to one volume until its operation ends (then the volume's own record counts).
#[derive(Debug)]
pub struct Reservation<'a> {
    ledger: &'a Ledger,
    key: (String, String),
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if let Ok(mut m) = self.ledger.in_flight.lock() {
            m.remove(&self.key);
        }
    }
}

impl Ledger {
    fn lock(&self) -> Result<std::sync::MutexGuard<'_, HashMap<(String, String), u64>>> {
        self.in_flight
            .lock()
            .map_err(|_| Error::Internal("capacity ledger poisoned".into()))
    }

    /// The budget of `pool` now. Blocking: reads every volume's record.
    pub fn budget(&self, pool: &Pool, health: &PoolHealth) -> Result<Budget> {
        let in_flight = self.lock()?;
        Ok(Budget::new(pool, health, committed(pool, &in_flight, None)?))
    }

    /// Promises `bytes` to volume `id` of `pool` (which has `current` bytes today, 0 for a new
    /// volume), or answers ResourceExhausted when the pool cannot promise them. Hold the
    /// returned reservation until the volume records its new size.
    pub fn reserve(
        &self,
        pool: &Pool,
        health: &PoolHealth,
        id: &str,
        bytes: u64,
        current: u64,
    ) -> Result<Reservation<'_>> {
        let mut in_flight = self.lock()?;
        let budget = Budget::new(pool, health, committed(pool, &in_flight, Some(id))?);
        let promisable = budget.promisable.saturating_sub(budget.committed);
        let growth = bytes.saturating_sub(current);
        if bytes > promisable || growth > budget.free {
            return Err(Error::ResourceExhausted(format!(
                "storage pool {} cannot promise {bytes} bytes to volume {id}: {} of {} promisable bytes \
                 ({}% of the filesystem) are promised to other volumes and {} bytes are free",
                pool.name, budget.committed, budget.promisable, pool.overcommit_percent, budget.free
            )));
        }
        let key = (pool.name.clone(), id.to_owned());
        in_flight.insert(key.clone(), bytes);
        Ok(Reservation { ledger: self, key })
    }
}

/// Sum of what `pool` promised: every volume's recorded capacity (a volume with a reservation
/// counts at its reserved size instead), leaving out `except`.
fn committed(pool: &Pool, in_flight: &HashMap<(String, String), u64>, except: Option<&str>) -> Result<u64> {
    let dir = pool.open()?;
    let mut sum: u64 = 0;
    for id in pool.list_volumes()? {
        if Some(id.as_str()) == except || in_flight.contains_key(&(pool.name.clone(), id.clone())) {
            continue;
        }
        sum = sum.saturating_add(volumes::recorded_capacity(dir.as_fd(), &id)?.unwrap_or(0));
    }
    for ((p, id), bytes) in in_flight {
        if *p == pool.name && Some(id.as_str()) != except {
            sum = sum.saturating_add(*bytes);
        }
    }
    Ok(sum)
}
