//! Cursor pagination for ListVolumes and ListSnapshots. The token is the key `(id, pool)` of the
//! first entry of the next page, encoded `id/pool`, so pages stay correct when entries are added
//! or removed between calls (KubeVirt's integer-vs-name token mix-up broke page 2 entirely).
//! Entries are sorted and compared by the same key, the `(id, pool)` pair: comparing the encoded
//! string instead would order `vol/p` after `vol-2/p` (`-` sorts before `/`) while the pair
//! orders `vol` first, losing or repeating entries.

use crate::error::{Error, Result};

/// One page of `items`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    /// Entries of this page.
    pub items: Vec<T>,
    /// Token for the next page; empty when this is the last.
    pub next_token: String,
}

/// Sort key of an object that lives in a pool.
pub type Key = (String, String);

/// Cuts a page out of `items`, sorted here by `key`, starting at the first item whose key is
/// `>=` the key in `starting_token`. `max_entries == 0` means no limit; negative is invalid.
pub fn paginate<T: Clone>(
    mut items: Vec<T>,
    key: impl Fn(&T) -> Key,
    max_entries: i32,
    starting_token: &str,
) -> Result<Page<T>> {
    items.sort_by_cached_key(&key);
    page_of(&items, key, max_entries, starting_token)
}

/// [`paginate`] over items already sorted by `key`: finds the page's start by binary search
/// and copies out only that page, so walking every page of a large listing costs one pass,
/// not one per page.
pub fn page_of<T: Clone>(
    sorted: &[T],
    key: impl Fn(&T) -> Key,
    max_entries: i32,
    starting_token: &str,
) -> Result<Page<T>> {
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
    let limit = usize::try_from(max_entries).unwrap_or(0);
    if limit == 0 || rest.len() <= limit {
        return Ok(Page {
            items: rest.to_vec(),
            next_token: String::new(),
        });
    }
    Ok(Page {
        items: rest[..limit].to_vec(),
        next_token: rest.get(limit).map(|t| encode(&key(t))).unwrap_or_default(),
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
            let page = paginate(all.to_vec(), |s| s.clone(), size, &token).unwrap();
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
                proptest::prop_assert!(matches!(paginate(keys(3), |s| s.clone(), 1, &token), Err(Error::Aborted(_))));
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
        let p = paginate(all.clone(), |s| s.clone(), 4, "").unwrap();
        assert_eq!(p.items.len(), 4);
        let p2 = paginate(all.clone(), |s| s.clone(), 4, &p.next_token).unwrap();
        assert_eq!(p2.items.len(), 4);
        assert!(p2.next_token.is_empty());
        let p = paginate(keys(5), |s| s.clone(), 4, "").unwrap();
        assert!(!p.next_token.is_empty(), "one remaining entry still needs a token");
    }

    #[test]
    fn survives_deletion_of_the_token_entry_and_rejects_garbage() {
        let mut all = keys(6);
        let p = paginate(all.clone(), |s| s.clone(), 3, "").unwrap();
        all.retain(|k| encode(k) != p.next_token);
        let p2 = paginate(all, |s| s.clone(), 3, &p.next_token).unwrap();
        assert_eq!(p2.items.len(), 2);
        assert!(matches!(
            paginate(keys(3), |s| s.clone(), 1, "17"),
            Err(Error::Aborted(_))
        ));
        assert!(matches!(
            paginate(keys(3), |s| s.clone(), -1, ""),
            Err(Error::InvalidArgument(_))
        ));
    }
}
