//! Waiting for mount-table changes without a thread: `/proc/self/mountinfo` reports
//! `POLLPRI` whenever a mount is added, removed or changed in this mount namespace, and tokio
//! can wait for that on its reactor.
//!
//! The `unsafe` is tokio's: registering a descriptor with the reactor is unsafe since tokio
//! 1.52 because the caller must keep it open while registered. Here the [`AsyncFd`] owns the
//! [`OwnedFd`], so the descriptor lives exactly as long as the registration.

use std::io;
use std::os::fd::OwnedFd;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// A watch on this process's mount table.
#[derive(Debug)]
pub struct MountTableWatch {
    fd: AsyncFd<OwnedFd>,
}

impl MountTableWatch {
    /// Opens `/proc/self/mountinfo` and registers it with the current tokio runtime (call it
    /// inside one). Changes from this moment on are reported.
    pub fn open() -> io::Result<Self> {
        let fd = rustix::fs::open(
            "/proc/self/mountinfo",
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC | rustix::fs::OFlags::NONBLOCK,
            rustix::fs::Mode::empty(),
        )?;
        #[allow(unsafe_code)]
        // SAFETY: the descriptor is moved into the `AsyncFd`, which deregisters it before
        // dropping (closing) it; nothing else can close it while it is registered.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::PRIORITY) }.map_err(io::Error::from)?;
        Ok(MountTableWatch { fd })
    }

    /// Waits until the mount table has changed since the last call (or since [`open`](Self::open)).
    pub async fn changed(&mut self) -> io::Result<()> {
        let mut guard = self.fd.ready(Interest::PRIORITY).await?;
        guard.clear_ready();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn a_mount_in_this_namespace_wakes_the_watch() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: mounting a tmpfs needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let mut watch = MountTableWatch::open().unwrap();
        rustix::mount::mount("tmpfs", dir.path(), "tmpfs", rustix::mount::MountFlags::empty(), None).unwrap();
        // A change made before waiting is still reported; a hang fails the test harness.
        watch.changed().await.unwrap();
        rustix::mount::unmount(dir.path(), rustix::mount::UnmountFlags::DETACH).unwrap();
        watch.changed().await.unwrap();
    }
}
