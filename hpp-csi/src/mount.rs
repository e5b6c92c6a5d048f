//! Bind mounts for NodePublishVolume. The source is an already-open volume directory and the
//! target an already-open, symlink-free directory, both passed to mount(2) as `/proc/self/fd/N`,
//! so what gets mounted is exactly what was checked. Read-only and per-mount flags need a second
//! `MS_REMOUNT | MS_BIND` call (the kernel ignores them on the initial bind); that remount keeps
//! the source's `nosuid`/`nodev`/`noexec` (a remount replaces all per-mount flags). rustix 1.x
//! exposes `open_tree` and `move_mount` but not `mount_setattr`, so a detached mount cannot be
//! made read-only before it is attached; a publish interrupted between bind and remount is
//! corrected by its retry (see `node::publish`).

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use rustix::mount::{MountFlags, UnmountFlags};

use crate::error::{Error, Result};

/// Per-mount flags requested through the volume capability (and `readonly`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindOptions {
    /// Flags for the remount; empty means no remount is needed.
    pub flags: MountFlags,
}

impl BindOptions {
    /// Parses CSI `mount_flags` plus the `readonly` bit. Only flags that make sense on a bind
    /// mount are accepted; anything else is InvalidArgument rather than silently ignored.
    pub fn parse(mount_flags: &[String], readonly: bool) -> Result<Self> {
        let mut flags = MountFlags::empty();
        if readonly {
            flags |= MountFlags::RDONLY;
        }
        for raw in mount_flags {
            for flag in raw.split(',').map(str::trim).filter(|f| !f.is_empty()) {
                match flag {
                    "ro" => flags |= MountFlags::RDONLY,
                    "rw" | "bind" | "defaults" => {}
                    "nosuid" => flags |= MountFlags::NOSUID,
                    "nodev" => flags |= MountFlags::NODEV,
                    "noexec" => flags |= MountFlags::NOEXEC,
                    "noatime" => flags |= MountFlags::NOATIME,
                    "nodiratime" => flags |= MountFlags::NODIRATIME,
                    "relatime" => flags |= MountFlags::RELATIME,
                    other => {
                        return Err(Error::InvalidArgument(format!(
                            "mount flag {other:?} is not supported on a bind mount (supported: ro, rw, \
                             nosuid, nodev, noexec, noatime, nodiratime, relatime)"
                        )));
                    }
                }
            }
        }
        Ok(BindOptions { flags })
    }

    /// Whether the mount will be read-only.
    pub fn read_only(&self) -> bool {
        self.flags.contains(MountFlags::RDONLY)
    }

    /// Adds the per-mount restrictions of the mount `source` lives on (`nosuid`, `nodev`,
    /// `noexec`): a bind must never be laxer than the pool it comes from.
    pub fn with_source_flags(mut self, source: &OwnedFd) -> Self {
        use rustix::fs::StatVfsMountFlags as F;
        if let Ok(st) = rustix::fs::fstatvfs(source) {
            for (from, to) in [
                (F::NOSUID, MountFlags::NOSUID),
                (F::NODEV, MountFlags::NODEV),
                (F::NOEXEC, MountFlags::NOEXEC),
            ] {
                if st.f_flag.contains(from) {
                    self.flags |= to;
                }
            }
        }
        self
    }
}

/// Remounts the bind at `target_path` with exactly `opts` (used to correct a retry that finds
/// our bind with the wrong flags).
pub fn remount(target_path: &Path, opts: BindOptions) -> Result<()> {
    rustix::mount::mount_remount(target_path, MountFlags::BIND | opts.flags, "")
        .map_err(|e| Error::io(format!("remounting {} with flags", target_path.display()), e))
}

fn fd_path(fd: &OwnedFd) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// Bind-mounts `source` onto `target` (both open directories) and applies `opts`. `target_path`
/// is the path of `target`, used for the remount and for rollback.
pub fn bind(source: &OwnedFd, target: &OwnedFd, target_path: &Path, opts: BindOptions) -> Result<()> {
    rustix::mount::mount_bind(fd_path(source), fd_path(target))
        .map_err(|e| Error::io(format!("bind mount onto {}", target_path.display()), e))?;
    if !opts.flags.is_empty()
        && let Err(e) = rustix::mount::mount_remount(target_path, MountFlags::BIND | opts.flags, "")
    {
        let _ = unmount(target_path);
        return Err(Error::io(format!("remounting {} with flags", target_path.display()), e));
    }
    Ok(())
}

/// Unmounts `target` without following a symlink at its last component.
pub fn unmount(target: &Path) -> Result<()> {
    rustix::mount::unmount(target, UnmountFlags::NOFOLLOW)
        .map_err(|e| Error::io(format!("unmounting {}", target.display()), e))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_supported_flags_and_rejects_others() {
        let o = BindOptions::parse(&["nosuid,nodev".into(), "noexec".into()], false).unwrap();
        assert_eq!(o.flags, MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC);
        assert!(!o.read_only());
        assert!(BindOptions::parse(&["ro".into()], false).unwrap().read_only());
        assert!(BindOptions::parse(&[], true).unwrap().read_only());
        assert!(BindOptions::parse(&[], false).unwrap().flags.is_empty());
        assert!(BindOptions::parse(&["discard".into()], false).is_err());
        assert!(BindOptions::parse(&["uid=0".into()], false).is_err());
    }

    proptest::proptest! {
        /// Any mix of supported flags parses to exactly those flags; `ro` always means read-only.
        #[test]
        fn bind_flags_parse_exactly(
            picked in proptest::sample::subsequence(vec!["ro", "rw", "nosuid", "nodev", "noexec", "noatime", "defaults"], 0..7),
            readonly in proptest::bool::ANY,
            joined in proptest::bool::ANY,
        ) {
            let input: Vec<String> = if joined { vec![picked.join(",")] } else { picked.iter().map(|s| (*s).to_owned()).collect() };
            let o = BindOptions::parse(&input, readonly).unwrap();
            proptest::prop_assert_eq!(o.read_only(), readonly || picked.contains(&"ro"));
            proptest::prop_assert_eq!(o.flags.contains(MountFlags::NOSUID), picked.contains(&"nosuid"));
            proptest::prop_assert_eq!(o.flags.contains(MountFlags::NOEXEC), picked.contains(&"noexec"));
        }

        /// Anything outside the supported set is refused, never silently dropped.
        #[test]
        fn unknown_bind_flags_are_refused(flag in "[a-z_=0-9]{1,12}") {
            let known = ["ro", "rw", "bind", "defaults", "nosuid", "nodev", "noexec", "noatime", "nodiratime", "relatime"];
            if !known.contains(&flag.as_str()) {
                proptest::prop_assert!(BindOptions::parse(&[flag], false).is_err());
            }
        }
    }
}
