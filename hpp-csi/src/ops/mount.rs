//! Bind mounts for NodePublishVolume. The source is an already-open volume directory and the
//! target an already-open, symlink-free directory, so what gets mounted is exactly what was
//! checked.
//!
//! The mount is built detached and attached last: `open_tree(OPEN_TREE_CLONE)` clones the
//! volume directory into a mount nobody can see yet, `mount_setattr` gives it its final flags
//! (read-only, `nosuid`/`nodev`/`noexec`, atime), and `move_mount` attaches it at the target.
//! A read-only publish is therefore never writable, not even between two system calls, and a
//! crash leaves either no mount or the finished one. The clone keeps the source mount's own
//! restrictions. Kernels before 5.12 (no `mount_setattr`) fall back to bind then
//! `MS_REMOUNT | MS_BIND`, whose interrupted publish is corrected by its retry (see
//! `node::publish`). `mount_setattr` comes from `hpp-sys`, the one crate allowed `unsafe`.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;

use hpp_sys::mount::MountAttr;
use rustix::io::Errno;
use rustix::mount::{MountFlags, MoveMountFlags, OpenTreeFlags, UnmountFlags, move_mount, open_tree};

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

/// Bind-mounts `source` onto `target` (both open directories) with `opts` in force from the
/// moment the mount becomes visible. `target_path` is the path of `target`, for messages and
/// for the fallback's remount and rollback.
pub fn bind(source: &OwnedFd, target: &OwnedFd, target_path: &Path, opts: BindOptions) -> Result<BindMethod> {
    match bind_detached(source, target, opts) {
        Ok(()) => Ok(BindMethod::Detached),
        Err(e) if e == Errno::NOSYS => {
            bind_then_remount(source, target, target_path, opts)?;
            Ok(BindMethod::BindThenRemount)
        }
        Err(e) => Err(Error::io(format!("bind mount onto {}", target_path.display()), e)),
    }
}

/// Whether this kernel has `mount_setattr` (5.12), so [`bind`] builds every mount detached
/// with its final flags. Asked once: an empty attribute change on a directory is a no-op where
/// the call exists and `ENOSYS` where it does not.
pub fn binds_are_atomic() -> bool {
    static ATOMIC: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ATOMIC.get_or_init(|| {
        let Ok(root) = rustix::fs::open(
            "/",
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        ) else {
            return false;
        };
        match hpp_sys::mount::mount_setattr(root.as_fd(), MountAttr::default(), false) {
            Err(e) => Errno::from_io_error(&e) != Some(Errno::NOSYS),
            Ok(()) => true,
        }
    })
}

/// How [`bind`] made the mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindMethod {
    /// Built detached with its final flags, then attached: never visible with other flags.
    Detached,
    /// The pre-5.12 fallback: visible with the source's flags until the remount.
    BindThenRemount,
}

/// The `MOUNT_ATTR_*` set and clear masks equivalent to `flags`.
fn mount_attr(flags: MountFlags) -> MountAttr {
    let mut attr = MountAttr::default();
    for (from, to) in [
        (MountFlags::RDONLY, hpp_sys::mount::ATTR_RDONLY),
        (MountFlags::NOSUID, hpp_sys::mount::ATTR_NOSUID),
        (MountFlags::NODEV, hpp_sys::mount::ATTR_NODEV),
        (MountFlags::NOEXEC, hpp_sys::mount::ATTR_NOEXEC),
        (MountFlags::NODIRATIME, hpp_sys::mount::ATTR_NODIRATIME),
    ] {
        if flags.contains(from) {
            attr.set |= to;
        }
    }
    // The atime mode is one field: setting it means clearing the whole field first.
    if flags.contains(MountFlags::NOATIME) {
        attr.clear |= hpp_sys::mount::ATTR_ATIME_MASK;
        attr.set |= hpp_sys::mount::ATTR_NOATIME;
    } else if flags.contains(MountFlags::RELATIME) {
        attr.clear |= hpp_sys::mount::ATTR_ATIME_MASK;
        attr.set |= hpp_sys::mount::ATTR_RELATIME;
    }
    attr
}

/// Clones `source` into a detached mount, gives it its flags, then attaches it at `target`.
/// `Errno::NOSYS` means the kernel lacks the new mount API (nothing was mounted).
fn bind_detached(source: &OwnedFd, target: &OwnedFd, opts: BindOptions) -> std::result::Result<(), Errno> {
    let tree = open_tree(
        source,
        "",
        OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC | OpenTreeFlags::AT_EMPTY_PATH,
    )?;
    let attr = mount_attr(opts.flags);
    if attr != MountAttr::default() {
        hpp_sys::mount::mount_setattr(tree.as_fd(), attr, false)
            .map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::INVAL))?;
    }
    // Dropping `tree` before the move would discard the detached mount; after it, the mount
    // belongs to the target.
    move_mount(
        tree.as_fd(),
        "",
        target,
        "",
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
    )
}

/// The pre-5.12 path: bind, then remount with the flags (the kernel ignores them on the bind).
fn bind_then_remount(source: &OwnedFd, target: &OwnedFd, target_path: &Path, opts: BindOptions) -> Result<()> {
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
    fn flags_map_to_mount_attributes_with_one_atime_mode() {
        use hpp_sys::mount::*;
        let a = mount_attr(MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NOATIME);
        assert_eq!(a.set, ATTR_RDONLY | ATTR_NOSUID | ATTR_NOATIME);
        assert_eq!(a.clear, ATTR_ATIME_MASK);
        assert_eq!(mount_attr(MountFlags::empty()), MountAttr::default());
        let r = mount_attr(MountFlags::RELATIME | MountFlags::NODIRATIME);
        assert_eq!((r.set, r.clear), (ATTR_RELATIME | ATTR_NODIRATIME, ATTR_ATIME_MASK));
    }

    /// As root on a 5.12+ kernel: a read-only bind is made detached and arrives read-only.
    #[test]
    fn read_only_binds_are_attached_already_read_only() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: needs root for mounts");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
        std::fs::create_dir(&src).unwrap();
        std::fs::create_dir(&dst).unwrap();
        let open = |p: &Path| -> OwnedFd { std::fs::File::open(p).unwrap().into() };
        let opts = BindOptions::parse(&["nodev".into()], true).unwrap();
        let method = bind(&open(&src), &open(&dst), &dst, opts).unwrap();
        let write = std::fs::write(dst.join("f"), b"x");
        let table = crate::mountinfo::MountTable::read().unwrap();
        let options = table.mount_at(&dst).map(|m| m.options.clone());
        unmount(&dst).unwrap();
        assert_eq!(write.unwrap_err().raw_os_error(), Some(30), "EROFS");
        assert!(options.unwrap().iter().any(|o| o == "nodev"));
        if method == BindMethod::BindThenRemount {
            eprintln!("kernel without mount_setattr: the fallback was used");
        }
    }

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
