//! Cursor pagination for ListVolumes and ListSnapshots. The token is the sort key of the first
//! entry of the next page, so pages stay correct when entries are added or removed between calls
//! (KubeVirt's integer-vs-name token mix-up broke page 2 entirely).

use crate::error::{Error, Result};

/// One page of `items`, which must be sorted by `key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    /// Entries of this page.
    pub items: Vec<T>,
    /// Token for the next page; empty when this is the last.
    pub next_token: String,
}

/// Cuts a page out of `items` (sorted ascending by `key`), starting at the first item whose key
/// is `>= starting_token`. `max_entries == 0` means no limit; negative is invalid.
pub fn paginate<T>(
    items: Vec<T>,
    key: impl Fn(&T) -> String,
    max_entries: i32,
    starting_token: &str,
) -> Result<Page<T>> {
    if max_entries < 0 {
        return Err(Error::InvalidArgument(format!(
            "max_entries must not be negative, got {max_entries}"
        )));
    }
    if !starting_token.is_empty() && !valid_token(starting_token) {
        return Err(Error::Aborted(format!(
            "starting_token {starting_token:?} was not issued by this driver"
        )));
    }
    let mut rest: Vec<T> = items
        .into_iter()
        .filter(|t| starting_token.is_empty() || key(t).as_str() >= starting_token)
        .collect();
    let limit = usize::try_from(max_entries).unwrap_or(0);
    if limit == 0 || rest.len() <= limit {
        return Ok(Page {
            items: rest,
            next_token: String::new(),
        });
    }
    let tail = rest.split_off(limit);
    let next_token = tail.first().map(&key).unwrap_or_default();
    Ok(Page {
        items: rest,
        next_token,
    })
}

/// Sort key of an object that lives in a pool: `<id>/<pool>` (neither may contain `/`).
pub fn pool_key(id: &str, pool: &str) -> String {
    format!("{id}/{pool}")
}

fn valid_token(token: &str) -> bool {
    match token.split_once('/') {
        Some((id, pool)) => {
            crate::validate::check_id("token", id).is_ok() && crate::validate::check_pool_name(pool).is_ok()
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn keys(n: usize) -> Vec<String> {
        let mut v: Vec<String> = (0..n).map(|i| pool_key(&format!("pvc-{i:03}"), "p")).collect();
        v.sort();
        v
    }

    #[test]
    fn walks_every_page_exactly_once() {
        let all = keys(25);
        let mut seen = Vec::new();
        let mut token = String::new();
        let mut pages = 0;
        loop {
            let page = paginate(all.clone(), |s| s.clone(), 7, &token).unwrap();
            pages += 1;
            seen.extend(page.items);
            if page.next_token.is_empty() {
                break;
            }
            token = page.next_token;
        }
        assert_eq!(pages, 4);
        assert_eq!(seen, all);
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
        all.retain(|k| *k != p.next_token);
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
