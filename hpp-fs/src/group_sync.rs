//! Group commit: concurrent callers that each need "everything I changed is on disk" share one
//! sync instead of issuing one each.
//!
//! A caller finishes its change (a `mkdir` + `rename` into the pool directory, say), then calls
//! [`GroupSync::commit`]. Its change is covered by the first sync that *starts* after it
//! registered; at most one sync runs at a time, and every caller that arrived while it ran is
//! covered together by the next one. Nothing returns before a sync that covers it has finished,
//! and a failed sync fails every caller it was meant to cover (after a failed `fsync` the kernel
//! may report success for the same lost writes next time, so nobody retries it silently).
//!
//! On a journaling filesystem one directory `fsync` costs a journal commit whatever it covers,
//! so sixteen concurrent creates pay for about two commits, not sixteen.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use rustix::io::Errno;

/// How many failed rounds are remembered for callers that have not yet woken to read theirs.
const REMEMBERED_FAILURES: usize = 64;

/// Shares syncs of one object (a directory, a filesystem) between concurrent callers.
#[derive(Debug, Default)]
pub struct GroupSync {
    state: Mutex<Rounds>,
    finished: Condvar,
}

/// Sync rounds, numbered from 1; only one runs at a time.
#[derive(Debug, Default)]
struct Rounds {
    /// The last round that started (it may still be running).
    started: u64,
    /// The last round that finished.
    finished: u64,
    /// Recent rounds whose sync failed.
    failures: VecDeque<(u64, Errno)>,
    /// Syncs actually issued, for metrics and tests.
    issued: u64,
}

impl Rounds {
    fn running(&self) -> bool {
        self.started > self.finished
    }

    fn failure_of(&self, round: u64) -> Option<Errno> {
        self.failures.iter().find(|(r, _)| *r == round).map(|(_, e)| *e)
    }
}

impl GroupSync {
    /// A group with no sync issued yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Returns once a `sync` that started after this call began has finished, running `sync`
    /// itself when no other caller is about to. `sync` must make durable everything any caller
    /// changed before calling `commit` (all callers of one `GroupSync` must pass the same kind of
    /// sync on the same object). Blocks the calling thread: call it from blocking code.
    pub fn commit(&self, sync: impl FnOnce() -> Result<(), Errno>) -> Result<(), Errno> {
        let mut st = self.lock();
        // A round already running may have started before our change: we need the next one.
        let mine = st.started + 1;
        let mut sync = Some(sync);
        loop {
            if st.finished >= mine {
                return st.failure_of(mine).map_or(Ok(()), Err);
            }
            if !st.running() {
                // We lead round `mine`: it starts now, after our change, and covers every caller
                // waiting for it.
                st.started = mine;
                st.issued += 1;
                drop(st);
                let result = match sync.take() {
                    Some(f) => f(),
                    // Unreachable: a caller leads at most one round, since the round it leads
                    // is its own and it returns once that round finishes.
                    None => Ok(()),
                };
                st = self.lock();
                st.finished = mine;
                if let Err(e) = result {
                    st.failures.push_back((mine, e));
                    if st.failures.len() > REMEMBERED_FAILURES {
                        st.failures.pop_front();
                    }
                }
                self.finished.notify_all();
                continue;
            }
            st = self.finished.wait(st).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Syncs actually issued so far (each covered one or more callers).
    pub fn issued(&self) -> u64 {
        self.lock().issued
    }

    fn lock(&self) -> MutexGuard<'_, Rounds> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Barrier};
    use std::time::Duration;

    /// A fake disk: a clock of events, and the event number at which each finished sync began.
    #[derive(Default)]
    struct Disk {
        clock: AtomicU64,
        synced_from: Mutex<Vec<u64>>,
    }

    impl Disk {
        fn change(&self) -> u64 {
            self.clock.fetch_add(1, Ordering::SeqCst)
        }
        fn sync(&self) -> Result<(), Errno> {
            let began = self.clock.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(5));
            self.synced_from.lock().unwrap().push(began);
            Ok(())
        }
        /// Whether a sync that began after event `change` has finished.
        fn covers(&self, change: u64) -> bool {
            self.synced_from.lock().unwrap().iter().any(|&b| b > change)
        }
    }

    #[test]
    fn nobody_returns_before_a_sync_that_began_after_their_change_and_syncs_are_shared() {
        let group = Arc::new(GroupSync::new());
        let disk = Arc::new(Disk::default());
        let callers = 32;
        let start = Arc::new(Barrier::new(callers));
        let threads: Vec<_> = (0..callers)
            .map(|_| {
                let (group, disk, start) = (group.clone(), disk.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    for _ in 0..10 {
                        let change = disk.change();
                        group.commit(|| disk.sync()).unwrap();
                        assert!(
                            disk.covers(change),
                            "acknowledged change {change} before a sync covered it"
                        );
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let issued = group.issued();
        assert_eq!(issued as usize, disk.synced_from.lock().unwrap().len());
        // 320 commits by 32 threads released together: rounds are shared.
        assert!(issued < 320 / 2, "{issued} syncs for 320 commits");
    }

    #[test]
    fn a_failed_sync_fails_every_caller_it_covered_and_the_next_round_is_fresh() {
        let group = Arc::new(GroupSync::new());
        let gate = Arc::new(Barrier::new(2));
        // The leader's sync waits until a second caller has registered behind it.
        let leader = {
            let (group, gate) = (group.clone(), gate.clone());
            std::thread::spawn(move || {
                group.commit(|| {
                    gate.wait();
                    std::thread::sleep(Duration::from_millis(20));
                    Err(Errno::IO)
                })
            })
        };
        gate.wait();
        // Registered while round 1 runs: covered by round 2, which this caller leads.
        let second = group.commit(|| Err(Errno::NOSPC));
        assert_eq!(leader.join().unwrap(), Err(Errno::IO));
        assert_eq!(second, Err(Errno::NOSPC));
        assert_eq!(group.commit(|| Ok(())), Ok(()));
        assert_eq!(group.issued(), 3);
    }
}
