//! The mount table, parsed once per change instead of once per call.
//!
//! Reading `/proc/self/mountinfo` costs the kernel a line per mount and us a parse per line;
//! on a node with hundreds of pods that is most of a DeleteVolume or NodePublishVolume. The
//! kernel keeps a change counter per mount namespace, and an open `mountinfo` file reports
//! `POLLPRI` from `poll` when the counter moved since that file's last `poll` (or its open).
//! So a zero-timeout `poll` says whether a table read after the previous `poll` is still the
//! current one. For what the counter covers (mount, unmount, move, remount, propagation of
//! those) it is exact: a change made at any moment after that `poll` is reported by the next one,
//! so the table is never older than a fresh read at the start of the call. A few changes to the
//! text do not move the counter (renaming a directory above a mount point, superblock options
//! changed from another namespace); no caller of the cache asks about those.

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, PoisonError};

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::fs::{Mode, OFlags};

use crate::mountinfo::MountTable;

const MOUNTINFO: &str = "/proc/self/mountinfo";

/// A mount table shared by concurrent callers and re-read only after the mount table changed.
#[derive(Debug, Default)]
pub struct MountTableCache {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Open `mountinfo`, polled for changes only (the table is read through a fresh open).
    watch: Option<OwnedFd>,
    table: Option<Arc<MountTable>>,
    reads: u64,
}

impl MountTableCache {
    /// An empty cache: the first [`current`](Self::current) reads the table.
    pub fn new() -> Self {
        Self::default()
    }

    /// The current mount table: the cached one if no mount was added, removed or changed in this
    /// mount namespace since it was read, else a fresh read. Callers arriving while a read is in
    /// progress wait for it and share it.
    pub fn current(&self) -> std::io::Result<Arc<MountTable>> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let unchanged = match &state.watch {
            Some(fd) => !changed(fd)?,
            None => {
                // Opened before the read: a change during the read shows at the next poll.
                state.watch = Some(rustix::fs::open(
                    MOUNTINFO,
                    OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK,
                    Mode::empty(),
                )?);
                false
            }
        };
        if unchanged && let Some(table) = &state.table {
            return Ok(Arc::clone(table));
        }
        state.table = None;
        let table = Arc::new(MountTable::read()?);
        state.reads += 1;
        state.table = Some(Arc::clone(&table));
        Ok(table)
    }

    /// How many times the table was actually parsed; the calls beyond it were answered from
    /// the cache.
    pub fn reads(&self) -> u64 {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).reads
    }
}

/// Whether the mount table changed since the last poll of `fd` (or its open). Resets the mark.
fn changed(fd: &OwnedFd) -> std::io::Result<bool> {
    let mut fds = [PollFd::new(fd, PollFlags::PRI)];
    let now = Timespec { tv_sec: 0, tv_nsec: 0 };
    loop {
        match poll(&mut fds, Some(&now)) {
            Ok(_) => break,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    // NVAL (the descriptor is not open any more) cannot say "unchanged": read again.
    let seen = fds[0].revents();
    Ok(seen.intersects(PollFlags::PRI | PollFlags::ERR | PollFlags::NVAL))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn an_unchanged_table_is_read_once_and_shared() {
        let cache = MountTableCache::new();
        let first = cache.current().unwrap();
        let second = cache.current().unwrap();
        // Another test in this process may mount concurrently; then a second read is right.
        if cache.reads() == 1 {
            assert!(Arc::ptr_eq(&first, &second));
        }
        assert!(!first.mounts().is_empty());
    }

    #[test]
    fn a_mount_and_an_unmount_are_seen_by_the_next_call() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: mounting a tmpfs needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().canonicalize().unwrap();
        let cache = MountTableCache::new();
        assert!(!cache.current().unwrap().is_mount_point(&target));
        rustix::mount::mount("tmpfs", &target, "tmpfs", rustix::mount::MountFlags::empty(), None).unwrap();
        let mounted = cache.current().unwrap().is_mount_point(&target);
        rustix::mount::unmount(&target, rustix::mount::UnmountFlags::DETACH).unwrap();
        assert!(mounted, "the cache missed a mount made after its last read");
        assert!(
            !cache.current().unwrap().is_mount_point(&target),
            "the cache missed an unmount"
        );
    }
}
