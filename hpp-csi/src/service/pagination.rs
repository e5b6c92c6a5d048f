//! Cursor pagination for ListVolumes and ListSnapshots. The token is the key `(id, pool)` of the
//! first entry of the next page, encoded `id/pool`, so pages stay correct when entries are added
//! or removed between calls (KubeVirt's integer-vs-name token mix-up broke page 2 entirely).
//! Entries are sorted and compared by the same key, the `(id, pool)` pair: comparing the encoded
//! string instead would order `vol/p` after `vol-2/p` (`-` sorts before `/`) while the pair
//! orders `vol` first, losing or repeating entries.

use crate::error::{Error, Result};

/// The most bytes of entries one response carries. gRPC clients refuse a message past 4 MiB
/// by default (grpc-go: the CSI sidecars, csi-sanity; tonic), so a CO that asks for every
/// entry (`max_entries` 0, as the external health monitor does) or for more than fit gets them
/// over several pages, where one answer would fail on every call (at 100,000 volumes it would
/// be about 12 MiB). A page's entries take several times their encoded size in the driver's
/// memory while they are built and sent (4 MiB pages took the driver to 40 MiB at 100,000
/// volumes), so pages stay at a quarter of that limit: 1 MiB, about 8,000 volumes of
/// `pvc-<uuid>` ids, 12 pages at 100,000.
pub const MAX_PAGE_BYTES: usize = 1024 * 1024;

/// One page of entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<U> {
    /// Entries of this page.
    pub items: Vec<U>,
    /// Token for the next page; empty when this is the last.
    pub next_token: String,
}

/// Sort key of an object that lives in a pool.
pub type Key = (String, String);

/// Cuts a page out of `items`, sorted here by `key`: see [`page_of`].
pub fn paginate<T, U: prost::Message>(
    mut items: Vec<T>,
    key: impl Fn(&T) -> Key,
    max_entries: i32,
    starting_token: &str,
    budget: usize,
    build: impl FnMut(&T) -> U,
) -> Result<Page<U>> {
    items.sort_by_cached_key(&key);
    page_of(&items, key, max_entries, starting_token, budget, build)
}

/// The page of `sorted` (sorted by `key`) that starts at the first item whose key is `>=` the
/// key in `starting_token`, each item made into its entry by `build`. It ends after
/// `max_entries` entries (0: no limit; negative is invalid) or before the entry that would
/// take the page's encoded entries past `budget` bytes, whichever comes first; a page always
/// holds at least one entry, so a walk always ends. The start is found by binary search and
/// only this page's entries are built, so walking every page of a large listing costs one
/// pass, not one per page.
pub fn page_of<T, U: prost::Message>(
    sorted: &[T],
    key: impl Fn(&T) -> Key,
    max_entries: i32,
    starting_token: &str,
    budget: usize,
    mut build: impl FnMut(&T) -> U,
) -> Result<Page<U>> {
    if max_entries < 0 {
        return Err(Error::InvalidArgument(format!(
            "max_entries must not be negative, got {max_entries}"
        )));
    }
    let first = if starting_token.is_empty() {
        0
    } else {
        let start = parse_token(starting_token).ok_or_else(|| {
            Error::Aborted(format!(
                "starting_token {starting_token:?} was not issued by this driver"
            ))
        })?;
        sorted.partition_point(|t| key(t) < start)
    };
    let rest = sorted.get(first..).unwrap_or_default();
    let limit = match usize::try_from(max_entries).unwrap_or(0) {
        0 => rest.len(),
        n => n.min(rest.len()),
    };
    let mut items = Vec::with_capacity(limit.min(1024));
    let mut bytes = 0usize;
    for item in &rest[..limit] {
        let entry = build(item);
        // A repeated message field: one byte of tag, the length, the message.
        let len = entry.encoded_len();
        bytes += 1 + prost::encoding::encoded_len_varint(len as u64) + len;
        if bytes > budget && !items.is_empty() {
            break;
        }
        items.push(entry);
    }
    Ok(Page {
        next_token: rest.get(items.len()).map(|t| encode(&key(t))).unwrap_or_default(),
        items,
    })
}

/// Key of an object that lives in a pool.
pub fn pool_key(id: &str, pool: &str) -> Key {
    (id.to_owned(), pool.to_owned())
}

/// `id/pool` (neither may contain `/`).
fn encode((id, pool): &Key) -> String {
    format!("{id}/{pool}")
}

fn parse_token(token: &str) -> Option<Key> {
    let (id, pool) = token.split_once('/')?;
    crate::pool::validate::check_id("token", id).ok()?;
    crate::pool::validate::check_pool_name(pool).ok()?;
    Some(pool_key(id, pool))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;

    /// The entry built for a key in these tests: the key, encoded.
    fn entry(k: &Key) -> crate::csi::VolumeCondition {
        crate::csi::VolumeCondition {
            abnormal: false,
            message: encode(k),
        }
    }

    /// [`paginate`] without a byte budget, its entries read back as keys.
    fn paginate_keys(items: Vec<Key>, size: i32, token: &str) -> Result<Page<Key>> {
        paginate_within(items, size, token, usize::MAX)
    }

    fn paginate_within(items: Vec<Key>, size: i32, token: &str, budget: usize) -> Result<Page<Key>> {
        let page = paginate(items, |s| s.clone(), size, token, budget, entry)?;
        Ok(Page {
            items: page.items.iter().map(|e| parse_token(&e.message).unwrap()).collect(),
            next_token: page.next_token,
        })
    }

    fn keys(n: usize) -> Vec<Key> {
        let mut v: Vec<Key> = (0..n).map(|i| pool_key(&format!("pvc-{i:03}"), "p")).collect();
        v.sort();
        v
    }

    /// Walks all pages; returns the entries in the order they came back.
    fn walk(all: &[Key], size: i32) -> Vec<Key> {
        let mut seen = Vec::new();
        let mut token = String::new();
        for _ in 0..=all.len() + 1 {
            let page = paginate_keys(all.to_vec(), size, &token).unwrap();
            seen.extend(page.items);
            if page.next_token.is_empty() {
                return seen;
            }
            token = page.next_token;
        }
        panic!("pagination did not terminate");
    }

    #[test]
    fn ids_that_sort_differently_as_strings_are_each_returned_once() {
        let all: Vec<Key> = ["a", "vol", "vol-2"].iter().map(|i| pool_key(i, "legacy")).collect();
        assert_eq!(walk(&all, 1).len(), 3);
        let all: Vec<Key> = ["vol", "vol-2"].iter().map(|i| pool_key(i, "legacy")).collect();
        assert_eq!(walk(&all, 1).len(), 2);
    }

    proptest::proptest! {
        /// Any set of (id, pool) pairs, any page size: every entry comes back exactly once.
        #[test]
        fn every_entry_comes_back_exactly_once(
            set in proptest::collection::btree_set(("[a-z0-9][a-z0-9._ -]{0,6}", "[a-z][a-z0-9-]{0,3}"), 0..40),
            size in 0i32..8,
        ) {
            let all: Vec<Key> = set.into_iter().collect();
            let mut seen = walk(&all, size);
            seen.sort();
            proptest::prop_assert_eq!(seen, all);
        }

        /// A token is accepted exactly when it encodes a valid id and pool name.
        #[test]
        fn tokens_round_trip(id in "[a-z0-9][a-z0-9._ -]{0,20}", pool in "[a-z][a-z0-9-]{0,10}") {
            proptest::prop_assert_eq!(parse_token(&encode(&pool_key(&id, &pool))), Some(pool_key(&id, &pool)));
        }

        /// Garbage tokens are refused with Aborted, never a panic.
        #[test]
        fn garbage_tokens_are_refused(token in ".{1,40}") {
            if parse_token(&token).is_none() {
                proptest::prop_assert!(matches!(paginate_keys(keys(3), 1, &token), Err(Error::Aborted(_))));
            }
        }
    }

    #[test]
    fn walks_every_page_exactly_once() {
        let all = keys(25);
        assert_eq!(walk(&all, 7), all);
    }

    #[test]
    fn exact_multiple_and_one_remaining() {
        let all = keys(8);
        let p = paginate_keys(all.clone(), 4, "").unwrap();
        assert_eq!(p.items.len(), 4);
        let p2 = paginate_keys(all.clone(), 4, &p.next_token).unwrap();
        assert_eq!(p2.items.len(), 4);
        assert!(p2.next_token.is_empty());
        let p = paginate_keys(keys(5), 4, "").unwrap();
        assert!(!p.next_token.is_empty(), "one remaining entry still needs a token");
    }

    #[test]
    fn survives_deletion_of_the_token_entry_and_rejects_garbage() {
        let mut all = keys(6);
        let p = paginate_keys(all.clone(), 3, "").unwrap();
        all.retain(|k| encode(k) != p.next_token);
        let p2 = paginate_keys(all, 3, &p.next_token).unwrap();
        assert_eq!(p2.items.len(), 2);
        assert!(matches!(paginate_keys(keys(3), 1, "17"), Err(Error::Aborted(_))));
        assert!(matches!(paginate_keys(keys(3), -1, ""), Err(Error::InvalidArgument(_))));
    }

    /// Entries past the byte budget go to the next page, whatever `max_entries` allows (0
    /// too), and every entry still comes back exactly once; one entry larger than the budget
    /// is a page of its own rather than a walk that never ends.
    #[test]
    fn a_page_ends_before_the_entry_that_would_pass_the_byte_budget() {
        let all = keys(10);
        // Each entry: "pvc-000/p" (9 bytes) as a message field (2 + 9), framed (1 + 1 + 11).
        let framed = 13;
        for size in [0, 4, 100] {
            let p = paginate_within(all.clone(), size, "", 3 * framed).unwrap();
            assert_eq!(p.items, all[..3], "max_entries {size}");
            assert_eq!(p.next_token, encode(&all[3]));
        }
        let mut token = String::new();
        let mut seen = Vec::new();
        loop {
            let p = paginate_within(all.clone(), 0, &token, 1).unwrap();
            assert_eq!(p.items.len(), 1);
            seen.extend(p.items);
            if p.next_token.is_empty() {
                break;
            }
            token = p.next_token;
        }
        assert_eq!(seen, all);
    }
}
