//! ListVolumes' view of the pools: every volume's id, pool and recorded size, sorted by the
//! page key. A CO walking a large node page by page would otherwise have every page list and
//! stat every pool directory again (at 100,000 volumes in pages of 500: 200 passes over
//! 100,000 entries, a few syscalls each). The view is built once and reused while every pool
//! directory keeps its stamp (an entry made, removed or renamed changes it) and for at most
//! [`MAX_AGE`], which bounds what the stamp cannot see (a size recorded inside a volume).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::pool::{DirStamp, Pool};

/// The longest a view is reused.
pub const MAX_AGE: Duration = Duration::from_secs(5);

/// One volume of the view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Volume id.
    pub id: String,
    /// Index of its pool in the driver's pools.
    pub pool: usize,
    /// Its recorded size, where its pool enforces sizes.
    pub size: Option<u64>,
}

/// The last view and what it was built from.
#[derive(Debug, Default)]
pub struct Listings {
    memo: Mutex<Option<Memo>>,
}

#[derive(Debug)]
struct Memo {
    stamps: Vec<Option<DirStamp>>,
    built: Instant,
    entries: Arc<[Listed]>,
}

impl Listings {
    /// Every volume of `pools`, sorted by `(id, pool name)`: the last view when nothing
    /// changed, else a new one (blocking: lists and reads every pool). A pool that cannot be
    /// read lists nothing, and its view is never reused.
    pub fn current(&self, pools: &[Pool]) -> Arc<[Listed]> {
        let stamps: Vec<Option<DirStamp>> = pools.iter().map(|p| p.stamp().ok()).collect();
        {
            let memo = self.memo.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(m) = memo.as_ref()
                && m.stamps == stamps
                && stamps.iter().all(Option::is_some)
                && m.built.elapsed() < MAX_AGE
            {
                return m.entries.clone();
            }
        }
        let entries: Arc<[Listed]> = build(pools).into();
        *self.memo.lock().unwrap_or_else(PoisonError::into_inner) = Some(Memo {
            stamps,
            built: Instant::now(),
            entries: entries.clone(),
        });
        entries
    }
}

/// Lists every pool once (one descriptor per pool for the size records).
fn build(pools: &[Pool]) -> Vec<Listed> {
    let mut all = Vec::new();
    for (idx, pool) in pools.iter().enumerate() {
        let Ok(ids) = pool.list_volumes() else { continue };
        let dir = match pool.quota.enforces() {
            true => pool.open_unguarded().ok(),
            false => None,
        };
        all.extend(ids.into_iter().map(|id| {
            let size = dir.as_ref().and_then(|d| {
                crate::ops::volumes::recorded_capacity(std::os::fd::AsFd::as_fd(d), &id)
                    .ok()
                    .flatten()
            });
            Listed { id, pool: idx, size }
        }));
    }
    all.sort_by(|a, b| (&a.id, &pools[a.pool].name).cmp(&(&b.id, &pools[b.pool].name)));
    all
}
