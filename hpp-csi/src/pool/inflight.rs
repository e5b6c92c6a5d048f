//! Per-object in-flight guards: a second conflicting operation on the same volume, snapshot or
//! target path fails fast with `Aborted` (the CO retries) instead of racing the first one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    Exclusive,
    Shared(u32),
}

/// Set of objects with an operation in flight. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct InFlight {
    held: Arc<Mutex<HashMap<String, Hold>>>,
}

/// Releases its keys when dropped.
#[derive(Debug)]
pub struct Guard {
    held: Arc<Mutex<HashMap<String, Hold>>>,
    keys: Vec<String>,
}

impl InFlight {
    /// Takes `exclusive` keys exclusively and `shared` keys shared (readers of a clone source may
    /// overlap; a delete of that source may not). All or nothing.
    pub fn acquire(&self, exclusive: &[String], shared: &[String]) -> Result<Guard> {
        let mut held = self
            .held
            .lock()
            .map_err(|_| Error::Internal("in-flight table poisoned".into()))?;
        for k in exclusive {
            if held.contains_key(k) {
                return Err(busy(k));
            }
        }
        for k in shared {
            if held.get(k) == Some(&Hold::Exclusive) || exclusive.contains(k) {
                return Err(busy(k));
            }
        }
        for k in exclusive {
            held.insert(k.clone(), Hold::Exclusive);
        }
        for k in shared {
            let e = held.entry(k.clone()).or_insert(Hold::Shared(0));
            if let Hold::Shared(n) = e {
                *n += 1;
            }
        }
        Ok(Guard {
            held: self.held.clone(),
            keys: exclusive.iter().chain(shared).cloned().collect(),
        })
    }

    /// Number of objects currently held (for tests and debugging).
    pub fn len(&self) -> usize {
        self.held.lock().map(|h| h.len()).unwrap_or(0)
    }

    /// Whether nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn busy(key: &str) -> Error {
    Error::Aborted(format!("an operation on {key} is already in progress"))
}

impl Drop for Guard {
    fn drop(&mut self) {
        let Ok(mut held) = self.held.lock() else {
            return;
        };
        for k in &self.keys {
            match held.get_mut(k) {
                Some(Hold::Shared(n)) if *n > 1 => *n -= 1,
                _ => {
                    held.remove(k);
                }
            }
        }
    }
}

/// Key of a volume.
pub fn volume_key(id: &str) -> String {
    format!("volume {id}")
}

/// Key of a snapshot.
pub fn snapshot_key(id: &str) -> String {
    format!("snapshot {id}")
}

/// Key of a node publish target.
pub fn target_key(path: &std::path::Path) -> String {
    format!("target {}", path.display())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn exclusive_conflicts_and_releases() {
        let f = InFlight::default();
        let g = f.acquire(&[volume_key("a")], &[]).unwrap();
        assert!(matches!(f.acquire(&[volume_key("a")], &[]), Err(Error::Aborted(_))));
        assert!(matches!(f.acquire(&[], &[volume_key("a")]), Err(Error::Aborted(_))));
        assert!(f.acquire(&[volume_key("b")], &[]).is_ok());
        drop(g);
        assert!(f.is_empty());
        assert!(f.acquire(&[volume_key("a")], &[]).is_ok());
    }

    #[test]
    fn shared_holders_overlap_but_block_exclusive() {
        let f = InFlight::default();
        let g1 = f.acquire(&[volume_key("c1")], &[volume_key("src")]).unwrap();
        let g2 = f.acquire(&[volume_key("c2")], &[volume_key("src")]).unwrap();
        assert!(f.acquire(&[volume_key("src")], &[]).is_err());
        drop(g1);
        assert!(f.acquire(&[volume_key("src")], &[]).is_err());
        drop(g2);
        assert!(f.acquire(&[volume_key("src")], &[]).is_ok());
        // Failure to take one key leaves nothing held.
        let _x = f.acquire(&[volume_key("x")], &[]).unwrap();
        assert!(f.acquire(&[volume_key("y")], &[volume_key("x")]).is_err());
        assert!(f.acquire(&[volume_key("y")], &[]).is_ok());
    }
}
