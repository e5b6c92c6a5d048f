//! `mount_setattr(2)`: change the flags of a mount (or a detached mount tree) through a file
//! descriptor. Used to make a detached bind mount read-only *before* it is attached, so a
//! read-only publish is never writable, not even for an instant.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Mount attribute: read-only.
pub const ATTR_RDONLY: u64 = libc::MOUNT_ATTR_RDONLY;
/// Mount attribute: ignore set-user-id and set-group-id bits.
pub const ATTR_NOSUID: u64 = libc::MOUNT_ATTR_NOSUID;
/// Mount attribute: no device files.
pub const ATTR_NODEV: u64 = libc::MOUNT_ATTR_NODEV;
/// Mount attribute: no program execution.
pub const ATTR_NOEXEC: u64 = libc::MOUNT_ATTR_NOEXEC;

/// Mount attribute: do not update directory access times.
pub const ATTR_NODIRATIME: u64 = libc::MOUNT_ATTR_NODIRATIME;
/// The access-time mode field; clear it when setting one of the modes below.
pub const ATTR_ATIME_MASK: u64 = libc::MOUNT_ATTR__ATIME;
/// Access-time mode: never update access times.
pub const ATTR_NOATIME: u64 = libc::MOUNT_ATTR_NOATIME;
/// Access-time mode: update access times relative to modification times.
pub const ATTR_RELATIME: u64 = libc::MOUNT_ATTR_RELATIME;

/// `AT_EMPTY_PATH`: act on the descriptor itself.
const AT_EMPTY_PATH: u32 = libc::AT_EMPTY_PATH as u32;
/// `AT_RECURSIVE`: apply to the whole tree under the mount.
const AT_RECURSIVE: u32 = libc::AT_RECURSIVE as u32;

/// Which attributes to set and clear; see `mount_setattr(2)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MountAttr {
    /// `MOUNT_ATTR_*` bits to set.
    pub set: u64,
    /// `MOUNT_ATTR_*` bits to clear.
    pub clear: u64,
}

/// Applies `attr` to the mount (or detached tree) `fd` refers to, and with `recursive` to every
/// mount below it. `fd` is typically the result of `open_tree(OPEN_TREE_CLONE)`.
///
/// Fails with `ENOSYS` on kernels before 5.12; callers fall back to bind + remount there.
#[allow(unsafe_code)]
pub fn mount_setattr(fd: BorrowedFd<'_>, attr: MountAttr, recursive: bool) -> io::Result<()> {
    let empty: &CStr = c"";
    let flags = AT_EMPTY_PATH | if recursive { AT_RECURSIVE } else { 0 };
    let mut raw: libc::mount_attr = libc::mount_attr {
        attr_set: attr.set,
        attr_clr: attr.clear,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: `fd` is a live descriptor for the duration of the call (it is borrowed); `empty`
    // is a NUL-terminated string that outlives the call; `raw` is a properly initialised
    // `struct mount_attr` the kernel only reads, and the size passed is its exact size. The
    // syscall neither retains the pointers nor touches memory beyond them.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            empty.as_ptr(),
            flags,
            &mut raw as *mut libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use rustix::mount::{MoveMountFlags, OpenTreeFlags, move_mount, open_tree};
    use std::os::fd::AsFd;

    /// Runs only as root (CI and this machine): builds a detached read-only bind, attaches it,
    /// and checks a write through it fails with EROFS while the source stays writable.
    #[test]
    fn a_detached_bind_is_attached_already_read_only() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: needs root for mounts");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        let dst = tmp.path().join("dst");
        std::fs::create_dir(&src).unwrap();
        std::fs::create_dir(&dst).unwrap();
        let tree = open_tree(
            rustix::fs::CWD,
            &src,
            OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
        )
        .unwrap();
        match mount_setattr(
            tree.as_fd(),
            MountAttr {
                set: ATTR_RDONLY | ATTR_NOSUID,
                clear: 0,
            },
            true,
        ) {
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                eprintln!("skipped: kernel has no mount_setattr");
                return;
            }
            r => r.unwrap(),
        }
        move_mount(
            tree.as_fd(),
            "",
            rustix::fs::CWD,
            &dst,
            MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
        )
        .unwrap();
        let write = std::fs::write(dst.join("f"), b"x");
        let _ = rustix::mount::unmount(&dst, rustix::mount::UnmountFlags::DETACH);
        assert_eq!(write.unwrap_err().raw_os_error(), Some(libc::EROFS));
        std::fs::write(src.join("f"), b"x").unwrap();
    }

    #[test]
    fn a_descriptor_that_is_not_a_mount_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = std::fs::File::open(tmp.path()).unwrap();
        let err = mount_setattr(
            dir.as_fd(),
            MountAttr {
                set: ATTR_RDONLY,
                clear: 0,
            },
            false,
        )
        .unwrap_err();
        assert!(err.raw_os_error().is_some());
    }
}
