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

/// Every volume of the pools, sorted by `(id, pool name)`. The ids are kept in one buffer and
/// each volume is 16 bytes besides its id: at 100,000 volumes the view is about a third of the
/// size of one `String` per id, and it is held while a CO walks the pages.
#[derive(Debug, Default)]
pub struct View {
    ids: String,
    slots: Vec<Slot>,
}

/// One volume of a [`View`]: where its id is in the view's buffer, its pool, its recorded size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    start: u32,
    /// Ids are at most [`MAX_ID_LEN`](crate::pool::validate::MAX_ID_LEN) (230) bytes.
    len: u8,
    sized: bool,
    pool: u16,
    size: u64,
}

impl Slot {
    /// Index of its pool in the driver's pools.
    pub fn pool(&self) -> usize {
        usize::from(self.pool)
    }

    /// Its recorded size, where its pool enforces sizes.
    pub fn size(&self) -> Option<u64> {
        self.sized.then_some(self.size)
    }
}

impl View {
    /// The volumes, in order.
    pub fn slots(&self) -> &[Slot] {
        &self.slots
    }

    /// The id of a volume of this view.
    pub fn id(&self, slot: &Slot) -> &str {
        id_in(&self.ids, slot)
    }

    /// Forgets the volumes from the `len`th on (their ids too).
    fn truncate(&mut self, len: usize) {
        if let Some(first) = self.slots.get(len) {
            self.ids.truncate(first.start as usize);
        }
        self.slots.truncate(len);
    }

    fn push(&mut self, id: &str, pool: usize, size: Option<u64>) {
        // Never false for what a pool lists (valid ids, a handful of pools) or below 4 GiB
        // of ids (18 million volumes of the longest ids).
        let (Ok(start), Ok(len), Ok(pool)) = (
            u32::try_from(self.ids.len()),
            u8::try_from(id.len()),
            u16::try_from(pool),
        ) else {
            return;
        };
        self.ids.push_str(id);
        self.slots.push(Slot {
            start,
            len,
            sized: size.is_some(),
            pool,
            size: size.unwrap_or(0),
        });
    }
}

fn id_in<'a>(ids: &'a str, slot: &Slot) -> &'a str {
    let start = slot.start as usize;
    ids.get(start..start + usize::from(slot.len)).unwrap_or_default()
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
    view: Arc<View>,
}

impl Listings {
    /// Every volume of `pools`, sorted by `(id, pool name)`: the last view when nothing
    /// changed, else a new one (blocking: lists and reads every pool). A pool that cannot be
    /// read lists nothing, and its view is never reused.
    pub fn current(&self, pools: &[Pool]) -> Arc<View> {
        let stamps: Vec<Option<DirStamp>> = pools.iter().map(|p| p.stamp().ok()).collect();
        {
            let memo = self.memo.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(m) = memo.as_ref()
                && m.stamps == stamps
                && stamps.iter().all(Option::is_some)
                && m.built.elapsed() < MAX_AGE
            {
                return m.view.clone();
            }
        }
        let view = Arc::new(build(pools));
        *self.memo.lock().unwrap_or_else(PoisonError::into_inner) = Some(Memo {
            stamps,
            built: Instant::now(),
            view: view.clone(),
        });
        view
    }
}

/// Lists every pool once (one descriptor per pool for the size records).
fn build(pools: &[Pool]) -> View {
    let mut view = View::default();
    for (idx, pool) in pools.iter().enumerate() {
        let dir = match pool.quota.enforces() {
            true => pool.open_unguarded().ok(),
            false => None,
        };
        let mark = view.slots.len();
        let listed = pool.visit_volumes(|id| {
            let size = dir.as_ref().and_then(|d| {
                crate::ops::volumes::recorded_capacity(std::os::fd::AsFd::as_fd(d), id)
                    .ok()
                    .flatten()
            });
            view.push(id, idx, size);
        });
        // A pool that cannot be listed lists nothing, not the part read before the failure.
        if listed.is_err() {
            view.truncate(mark);
        }
    }
    let View { mut ids, mut slots } = view;
    // The view outlives the pages; the room left by doubling would outlive them too.
    ids.shrink_to_fit();
    slots.shrink_to_fit();
    // (id, pool name) is unique: no two entries are equal, so an unstable sort is exact.
    let key = |s: &Slot| (id_in(&ids, s), &pools[s.pool()].name);
    slots.sort_unstable_by(|a, b| key(a).cmp(&key(b)));
    View { ids, slots }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::config::PoolConfig;

    fn pools(root: &std::path::Path, layout: &[(&str, &[&str])]) -> Vec<Pool> {
        layout
            .iter()
            .map(|(name, ids)| {
                for id in *ids {
                    std::fs::create_dir_all(root.join(name).join(id)).unwrap();
                }
                Pool::prepare(&PoolConfig::new(*name, root.join(name))).unwrap()
            })
            .collect()
    }

    fn listed(view: &View, pools: &[Pool]) -> Vec<(String, String)> {
        view.slots()
            .iter()
            .map(|s| (view.id(s).to_owned(), pools[s.pool()].name.clone()))
            .collect()
    }

    #[test]
    fn the_view_is_sorted_by_id_then_pool_and_reused_until_a_pool_changes() {
        let root = tempfile::tempdir().unwrap();
        let pools = pools(root.path(), &[("b", &["v1", "v0"]), ("a", &["v2", "v1"])]);
        let listings = Listings::default();
        let first = listings.current(&pools);
        let pair = |id: &str, pool: &str| (id.to_owned(), pool.to_owned());
        assert_eq!(
            listed(&first, &pools),
            vec![pair("v0", "b"), pair("v1", "a"), pair("v1", "b"), pair("v2", "a")]
        );
        assert!(
            Arc::ptr_eq(&first, &listings.current(&pools)),
            "nothing changed: the same view"
        );
        std::fs::create_dir(root.path().join("a/v3")).unwrap();
        let second = listings.current(&pools);
        assert_eq!(listed(&second, &pools).last(), Some(&pair("v3", "a")));
    }
}
