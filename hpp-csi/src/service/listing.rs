//! ListVolumes' view of the pools: every volume's id, pool and recorded size, sorted by the
//! page key. A CO walking a large node page by page would otherwise have every page list and
//! stat every pool directory again (at 100,000 volumes in pages of 500: 200 passes over
//! 100,000 entries, a few syscalls each). The view is built once and reused while every pool
//! directory keeps its stamp (an entry made, removed or renamed changes it) and for at most
//! [`MAX_AGE`], which bounds what the stamp cannot see (a size recorded inside a volume).
//! It is let go as soon as it cannot serve again: when its last page was served, or once it
//! is too old ([`Listings::expire`]), so a node walked once a minute by the health monitor
//! does not hold a listing of every volume between walks.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::pool::{DirStamp, Pool};

/// The longest a view is reused.
pub const MAX_AGE: Duration = Duration::from_secs(5);

/// A freed view at least this large is worth asking the allocator to hand pages back for
/// (about 8,000 volumes, whose listing left twice that in freed buffers); a smaller one's
/// room is reused by the next requests, and the executables release memory every few seconds
/// anyway.
pub const RELEASE_AFTER_BYTES: usize = 256 * 1024;

/// How long after a walk's last page is answered its memory is handed back: by then the
/// page's messages were sent and freed too.
pub const RELEASE_DELAY: Duration = Duration::from_millis(200);

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

    /// The heap bytes the view holds.
    pub fn bytes(&self) -> usize {
        self.ids.capacity() + self.slots.capacity() * std::mem::size_of::<Slot>()
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
    /// The second value says whether the view was built by this call (so the caller can
    /// arrange for it to [`expire`](Self::expire)).
    pub fn current(&self, pools: &[Pool]) -> (Arc<View>, bool) {
        let stamps: Vec<Option<DirStamp>> = pools.iter().map(|p| p.stamp().ok()).collect();
        {
            let memo = self.memo.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(m) = memo.as_ref()
                && m.stamps == stamps
                && stamps.iter().all(Option::is_some)
                && m.built.elapsed() < MAX_AGE
            {
                return (m.view.clone(), false);
            }
        }
        let started = Instant::now();
        let view = Arc::new(build(pools));
        tracing::debug!(
            volumes = view.slots.len(),
            elapsed_ms = started.elapsed().as_secs_f64() * 1000.0,
            "listed the pools for ListVolumes"
        );
        *self.memo.lock().unwrap_or_else(PoisonError::into_inner) = Some(Memo {
            stamps,
            built: Instant::now(),
            view: view.clone(),
        });
        (view, true)
    }

    /// Forgets `view` (if it is still the last one): its last page was served, and the walk
    /// that follows starts with a fresh listing anyway. A walk still going on elsewhere keeps
    /// its own handle and lists again for its next page. Returns the bytes freed here: the
    /// view's, or 0 when another walk still holds it.
    pub fn finished(&self, view: Arc<View>) -> usize {
        let mut memo = self.memo.lock().unwrap_or_else(PoisonError::into_inner);
        if memo.as_ref().is_some_and(|m| Arc::ptr_eq(&m.view, &view)) {
            *memo = None;
        }
        drop(memo);
        Arc::into_inner(view).map_or(0, |v| v.bytes())
    }

    /// Forgets the last view once it is too old to be reused ([`MAX_AGE`]), for the walks
    /// that stop before their last page. Returns the bytes freed (0 when nothing was
    /// forgotten, or a walk still holds the view).
    pub fn expire(&self) -> usize {
        let mut memo = self.memo.lock().unwrap_or_else(PoisonError::into_inner);
        if memo.as_ref().is_none_or(|m| m.built.elapsed() < MAX_AGE) {
            return 0;
        }
        let view = memo.take().map(|m| m.view);
        drop(memo);
        view.and_then(Arc::into_inner).map_or(0, |v| v.bytes())
    }

    /// Hands freed pages back to the kernel after a view of `freed` bytes went, when that is
    /// worth it ([`RELEASE_AFTER_BYTES`]).
    pub fn release_after(freed: usize) {
        if freed >= RELEASE_AFTER_BYTES {
            hpp_sys::malloc::release_free_memory();
        }
    }

    /// [`release_after`](Self::release_after), [`RELEASE_DELAY`] from now: a walk's last
    /// page is answered before its messages are sent and freed, and they go back with it.
    pub fn release_soon(freed: usize) {
        if freed >= RELEASE_AFTER_BYTES {
            tokio::spawn(async {
                tokio::time::sleep(RELEASE_DELAY).await;
                hpp_sys::malloc::release_free_memory();
            });
        }
    }

    /// Whether a view is held (for tests).
    #[cfg(test)]
    fn holds_a_view(&self) -> bool {
        self.memo.lock().unwrap_or_else(PoisonError::into_inner).is_some()
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
    let View { ids, slots } = view;
    let mut slots = sorted(&ids, slots, pools);
    // The ids are copied in page order, so each page reads one stretch of the buffer, not
    // 500 places scattered over megabytes of it. The copy is exactly sized: the view
    // outlives the pages, and room left by doubling would outlive them too.
    let mut in_order = String::with_capacity(ids.len());
    for slot in &mut slots {
        let id = id_in(&ids, slot);
        // Not past u32: the same bytes fitted in `ids`.
        slot.start = u32::try_from(in_order.len()).unwrap_or(u32::MAX);
        in_order.push_str(id);
    }
    View { ids: in_order, slots }
}

/// `slots` sorted by `(id, pool name)`. Each is sorted first by eight bytes of its id
/// taken past the prefix every id shares (`pvc-`), packed with its index into one integer:
/// comparing ids in the buffer reads two scattered places per comparison, which was most of
/// the sort's time at 100,000 volumes. Ids never hold a NUL, so zero padding orders a
/// shorter id first, as comparing the ids does; the few runs of equal words are then sorted
/// by the whole key.
fn sorted(ids: &str, slots: Vec<Slot>, pools: &[Pool]) -> Vec<Slot> {
    let shared = shared_prefix_len(ids, &slots);
    let mut order: Vec<u128> = slots
        .iter()
        .enumerate()
        .map(|(i, s)| u128::from(word_at(id_in(ids, s).as_bytes(), shared)) << 64 | i as u128)
        .collect();
    order.sort_unstable();
    let mut sorted: Vec<Slot> = Vec::with_capacity(slots.len());
    sorted.extend(order.iter().filter_map(|&k| slots.get(k as u64 as usize).copied()));
    drop(slots);
    // (id, pool name) is unique: no two entries are equal, so an unstable sort is exact.
    let key = |s: &Slot| (id_in(ids, s), &pools[s.pool()].name);
    let mut start = 0;
    while start < order.len() {
        let word = order[start] >> 64;
        let len = order[start..].iter().take_while(|&&k| k >> 64 == word).count();
        if len > 1 {
            sorted[start..start + len].sort_unstable_by(|a, b| key(a).cmp(&key(b)));
        }
        start += len;
    }
    sorted
}

/// Length of the prefix every id of `slots` shares.
fn shared_prefix_len(ids: &str, slots: &[Slot]) -> usize {
    let mut all = slots.iter().map(|s| id_in(ids, s).as_bytes());
    let Some(first) = all.next() else {
        return 0;
    };
    all.fold(first.len(), |len, id| {
        first[..len].iter().zip(id).take_while(|(a, b)| a == b).count()
    })
}

/// Eight bytes of `id` from `at`, big-endian, zero-padded past its end.
fn word_at(id: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    let tail = id.get(at..).unwrap_or_default();
    let n = tail.len().min(8);
    word[..n].copy_from_slice(&tail[..n]);
    u64::from_be_bytes(word)
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
        let first = listings.current(&pools).0;
        let pair = |id: &str, pool: &str| (id.to_owned(), pool.to_owned());
        assert_eq!(
            listed(&first, &pools),
            vec![pair("v0", "b"), pair("v1", "a"), pair("v1", "b"), pair("v2", "a")]
        );
        assert!(
            Arc::ptr_eq(&first, &listings.current(&pools).0),
            "nothing changed: the same view"
        );
        std::fs::create_dir(root.path().join("a/v3")).unwrap();
        let second = listings.current(&pools).0;
        assert_eq!(listed(&second, &pools).last(), Some(&pair("v3", "a")));
    }

    #[test]
    fn the_sort_orders_as_the_ids_do_whatever_prefix_and_length_they_share() {
        let root = tempfile::tempdir().unwrap();
        let names: Vec<String> = [
            "pvc-a",
            "pvc-ab",
            "pvc-a0",
            "pvc-aaaaaaaaaz",
            "pvc-aaaaaaaaa",
            "pvc-aaaaaaaab",
            "pvc-b",
            "pvc-",
            "pvc-9",
            "pvc-aaaaaaaaaa1",
            "pvc-aaaaaaaaaa",
        ]
        .map(str::to_owned)
        .into_iter()
        .chain((0..200).map(|i| format!("pvc-{:x}", (i * 7919) % 1000)))
        .collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let pools = pools(root.path(), &[("p2", &refs), ("p1", &refs[3..9])]);
        let view = Listings::default().current(&pools).0;
        let got = listed(&view, &pools);
        let mut want = got.clone();
        want.sort();
        assert_eq!(got, want);
        let distinct = |ids: &[&str]| ids.iter().collect::<std::collections::BTreeSet<_>>().len();
        assert_eq!(got.len(), distinct(&refs) + distinct(&refs[3..9]));
    }

    #[test]
    fn one_id_or_none_sorts() {
        let root = tempfile::tempdir().unwrap();
        let one = pools(root.path(), &[("a", &["pvc-1"])]);
        assert_eq!(listed(&Listings::default().current(&one).0, &one).len(), 1);
        let none = pools(root.path(), &[("b", &[])]);
        assert!(Listings::default().current(&none).0.slots().is_empty());
    }

    #[test]
    fn a_view_is_let_go_after_its_last_page_or_once_too_old() {
        let root = tempfile::tempdir().unwrap();
        let pools = pools(root.path(), &[("a", &["v1", "v2"])]);
        let listings = Listings::default();
        let walk = listings.current(&pools).0;
        let other_walk = listings.current(&pools).0;
        let size = walk.bytes();
        assert_eq!(size, 4 + 2 * std::mem::size_of::<Slot>(), "ids v1 v2 and their slots");
        assert_eq!(listings.finished(walk), 0, "another walk still holds the view");
        assert!(!listings.holds_a_view());
        assert_eq!(listings.finished(other_walk), size, "the last holder frees it");

        let abandoned = listings.current(&pools).0;
        drop(abandoned);
        assert_eq!(listings.expire(), 0, "a young view is kept for the next page");
        assert!(listings.holds_a_view());
        if let Some(m) = listings.memo.lock().unwrap().as_mut() {
            m.built -= MAX_AGE;
        }
        assert_eq!(listings.expire(), size);
        assert!(!listings.holds_a_view());
    }
}
