//! What an enforcing pool can still promise. The ledger is derived from the volumes on disk
//! (the capacity recorded on each volume, see [`volumes::CAPACITY_XATTR`]), so it never drifts
//! from what exists.
//!
//! Reading every volume's record costs a directory walk (about 140 ms at 10,000 volumes), so
//! each node-local pool keeps a memo of its last scan: the size per volume, stamped with the
//! pool directory's identity, link count and change times. This driver's own creations,
//! expansions and deletions update the memo under the pool's lock and stamp it again; any other
//! change to the directory (a volume made or removed behind the driver's back) changes the
//! stamp and the next call scans again. The memo is only a cache of the scan, never a record
//! of its own: it is dropped on any doubt (a failed operation, a stamp it cannot read) and
//! is never older than [`MEMO_MAX_AGE`], which also bounds what the stamp cannot see (a record
//! rewritten inside a volume by another tool, a change racing one of ours). Shared pools are
//! written by the drivers of every node, so they are scanned on every call.
//!
//! The only other state is the set of creations and expansions in flight, which have checked
//! the budget but not yet recorded their size: they are counted too, so two concurrent requests
//! cannot both take the last bytes.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::ops::volumes;
use crate::pool::{DirStamp as Stamp, Pool, PoolHealth};

/// The longest a pool's memo is trusted without a full scan.
pub const MEMO_MAX_AGE: Duration = Duration::from_secs(60);

/// Per-pool books: sizes in flight and the memo of the last scan.
#[derive(Debug, Default)]
pub struct Ledger {
    pools: Mutex<HashMap<String, Arc<Mutex<Book>>>>,
    scans: AtomicU64,
}

/// One pool's book, behind its own lock (pools never wait for each other).
#[derive(Debug, Default)]
struct Book {
    in_flight: HashMap<String, u64>,
    memo: Option<Memo>,
}

/// The result of the last scan of a pool, kept current by this driver's own changes.
#[derive(Debug)]
struct Memo {
    sizes: HashMap<String, u64>,
    total: u64,
    stamp: Stamp,
    scanned: Instant,
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

/// A size promised to one volume until its operation ends. [`Reservation::settle`] hands it
/// to the memo once the size is recorded; dropped unsettled (the operation failed somewhere),
/// it also drops the memo, as the disk may have changed halfway.
#[derive(Debug)]
pub struct Reservation {
    book: Arc<Mutex<Book>>,
    id: String,
    settled: bool,
}

impl Reservation {
    /// The operation recorded `recorded` bytes on the volume (in `pool`, whose directory it
    /// may have changed): the memo takes them and is stamped again.
    pub fn settle(mut self, pool: &Pool, recorded: Option<u64>) {
        self.settled = true;
        if let Ok(mut book) = lock(&self.book) {
            book.in_flight.remove(&self.id);
            book.note(pool, &self.id, recorded);
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        if let Ok(mut book) = lock(&self.book) {
            book.in_flight.remove(&self.id);
            book.memo = None;
        }
    }
}

fn lock(book: &Mutex<Book>) -> Result<MutexGuard<'_, Book>> {
    book.lock()
        .map_err(|_| Error::Internal("capacity ledger poisoned".into()))
}

impl Ledger {
    fn book(&self, pool: &Pool) -> Result<Arc<Mutex<Book>>> {
        let mut pools = self
            .pools
            .lock()
            .map_err(|_| Error::Internal("capacity ledger poisoned".into()))?;
        Ok(pools.entry(pool.name.clone()).or_default().clone())
    }

    /// Full scans of pool directories so far (each reads every volume's record).
    pub fn scans(&self) -> u64 {
        self.scans.load(Ordering::Relaxed)
    }

    /// The budget of `pool` now. Blocking: may scan every volume's record.
    pub fn budget(&self, pool: &Pool, health: &PoolHealth) -> Result<Budget> {
        let book = self.book(pool)?;
        let mut book = lock(&book)?;
        let committed = self.committed(pool, &mut book, None)?;
        Ok(Budget::new(pool, health, committed))
    }

    /// Promises `bytes` to volume `id` of `pool` (which has `current` bytes today, 0 for a new
    /// volume), or answers ResourceExhausted when the pool cannot promise them. Settle the
    /// returned reservation once the volume records its new size.
    pub fn reserve(&self, pool: &Pool, health: &PoolHealth, id: &str, bytes: u64, current: u64) -> Result<Reservation> {
        let shared = self.book(pool)?;
        let mut book = lock(&shared)?;
        let budget = Budget::new(pool, health, self.committed(pool, &mut book, Some(id))?);
        let promisable = budget.promisable.saturating_sub(budget.committed);
        let growth = bytes.saturating_sub(current);
        if bytes > promisable || growth > budget.free {
            return Err(Error::ResourceExhausted(format!(
                "storage pool {} cannot promise {bytes} bytes to volume {id}: {} of {} promisable bytes \
                 ({}% of the filesystem) are promised to other volumes and {} bytes are free",
                pool.name, budget.committed, budget.promisable, pool.overcommit_percent, budget.free
            )));
        }
        book.in_flight.insert(id.to_owned(), bytes);
        drop(book);
        Ok(Reservation {
            book: shared,
            id: id.to_owned(),
            settled: false,
        })
    }

    /// About to change `pool`'s directory outside a reservation (a deletion): drops the memo
    /// if the directory already changed behind the driver's back, so the stamp taken after
    /// the change cannot hide that earlier change.
    pub fn check(&self, pool: &Pool) {
        if let Ok(book) = self.book(pool)
            && let Ok(mut book) = lock(&book)
            && book.memo.as_ref().is_some_and(|m| !m.fresh(pool))
        {
            book.memo = None;
        }
    }

    /// Volume `id` of `pool` was deleted by this driver: the memo forgets it.
    pub fn forget(&self, pool: &Pool, id: &str) {
        if let Ok(book) = self.book(pool)
            && let Ok(mut book) = lock(&book)
        {
            book.note(pool, id, None);
        }
    }

    /// Sum of what `pool` promised: every volume's recorded capacity (a volume with a
    /// reservation counts at its reserved size instead), leaving out `except`.
    fn committed(&self, pool: &Pool, book: &mut Book, except: Option<&str>) -> Result<u64> {
        let memo = match book.memo.take() {
            Some(m) if m.fresh(pool) => m,
            _ => {
                self.scans.fetch_add(1, Ordering::Relaxed);
                scan(pool)?
            }
        };
        let mut sum = memo.total;
        let in_flight = book
            .in_flight
            .keys()
            .map(String::as_str)
            .filter(|id| Some(*id) != except);
        for id in in_flight.chain(except) {
            sum = sum.saturating_sub(memo.sizes.get(id).copied().unwrap_or(0));
        }
        for (id, bytes) in &book.in_flight {
            if Some(id.as_str()) != except {
                sum = sum.saturating_add(*bytes);
            }
        }
        // A shared pool changes under every node's driver: never trusted, never kept.
        if !pool.shared {
            book.memo = Some(memo);
        }
        Ok(sum)
    }
}

impl Book {
    /// This driver changed volume `id` of `pool` (now `size` bytes, `None` when gone): the
    /// memo follows and takes the directory's new stamp.
    fn note(&mut self, pool: &Pool, id: &str, size: Option<u64>) {
        let Some(memo) = self.memo.as_mut() else {
            return;
        };
        let old = match size {
            Some(bytes) => memo.sizes.insert(id.to_owned(), bytes),
            None => memo.sizes.remove(id),
        };
        memo.total = memo
            .total
            .saturating_sub(old.unwrap_or(0))
            .saturating_add(size.unwrap_or(0));
        match stamp(pool) {
            Ok(s) => memo.stamp = s,
            Err(_) => self.memo = None,
        }
    }
}

impl Memo {
    /// Whether the pool directory is as this memo last saw it, and the memo young enough.
    fn fresh(&self, pool: &Pool) -> bool {
        self.scanned.elapsed() < MEMO_MAX_AGE && stamp(pool).is_ok_and(|s| s == self.stamp)
    }
}

/// The pool directory's stamp now.
fn stamp(pool: &Pool) -> Result<Stamp> {
    pool.stamp()
}

/// Reads every volume's record. The stamp is taken first, so a change during the scan makes
/// the memo stale at once.
fn scan(pool: &Pool) -> Result<Memo> {
    let stamp = stamp(pool)?;
    let scanned = Instant::now();
    let dir = pool.open()?;
    let mut sizes = HashMap::new();
    let mut total: u64 = 0;
    for id in pool.list_volumes()? {
        let bytes = volumes::recorded_capacity(dir.as_fd(), &id)?.unwrap_or(0);
        total = total.saturating_add(bytes);
        sizes.insert(id, bytes);
    }
    Ok(Memo {
        sizes,
        total,
        stamp,
        scanned,
    })
}
