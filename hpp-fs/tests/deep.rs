//! Walks over trees far deeper than any recursion could survive: removal and usage of a
//! 100,000-level chain with a bounded number of open descriptors, and a copy beyond the depth
//! limit that is refused with the offending path.

#![allow(clippy::unwrap_used)]

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};

use hpp_fs::{CopyOptions, Step, WalkError, Walker, copy_tree, remove_tree, usage};
use rustix::fs::{Mode, OFlags};

const DEEP: usize = 100_000;

fn open_dir(path: &std::path::Path) -> OwnedFd {
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .unwrap()
}

/// Builds `<dir>/top/d/d/d/...` `levels` deep through descriptors (paths would exceed
/// PATH_MAX), with a file at the bottom.
fn chain(dir: &std::path::Path, levels: usize) {
    let mut fd = open_dir(dir);
    rustix::fs::mkdirat(&fd, "top", Mode::from_raw_mode(0o755)).unwrap();
    fd = rustix::fs::openat(&fd, "top", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
    for _ in 0..levels {
        rustix::fs::mkdirat(&fd, "d", Mode::from_raw_mode(0o755)).unwrap();
        fd = rustix::fs::openat(&fd, "d", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
    }
    let f = rustix::fs::openat(
        &fd,
        "bottom",
        OFlags::WRONLY | OFlags::CREATE,
        Mode::from_raw_mode(0o644),
    )
    .unwrap();
    rustix::io::write(&f, b"deep").unwrap();
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn usage_and_removal_survive_100000_levels_with_bounded_fds() {
    let tmp = tempfile::tempdir().unwrap();
    chain(tmp.path(), DEEP);
    let root = open_dir(tmp.path());
    let top = rustix::fs::openat(&root, "top", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();

    // The walker never holds more than a small, fixed number of descriptors.
    let mut walk = Walker::new_dup(top.as_fd()).unwrap();
    let (mut max_open, mut deepest) = (0, 0);
    while let Some(step) = walk.step().unwrap() {
        if let Step::Entry(name, meta) = step
            && meta.is_dir()
        {
            walk.descend(&name).unwrap();
            deepest = deepest.max(walk.depth());
            max_open = max_open.max(walk.open_count());
        }
    }
    assert_eq!(deepest, DEEP);
    assert!(max_open <= hpp_fs::stack::MAX_OPEN + 1, "{max_open} descriptors open");

    let u = usage(top.as_fd()).unwrap();
    assert_eq!(u.inodes, DEEP as u64 + 2, "every directory plus the file and the root");

    let before = open_fds();
    drop(top);
    remove_tree(root.as_fd(), OsStr::new("top")).unwrap();
    assert!(!tmp.path().join("top").exists());
    assert!(open_fds() < before, "no descriptor leaked");
}

#[test]
fn copy_beyond_the_depth_limit_is_refused_naming_the_path() {
    let tmp = tempfile::tempdir().unwrap();
    chain(tmp.path(), 50);
    std::fs::create_dir(tmp.path().join("dst")).unwrap();
    let src = open_dir(&tmp.path().join("top"));
    let dst = open_dir(&tmp.path().join("dst"));
    let err = copy_tree(src.as_fd(), dst.as_fd(), CopyOptions { max_depth: 20 }).unwrap_err();
    match err {
        WalkError::TooDeep { path, limit } => {
            assert_eq!(limit, 20);
            assert_eq!(path.components().count(), 21, "{}", path.display());
        }
        other => panic!("unexpected {other}"),
    }
    // Within the limit the same tree copies completely.
    std::fs::create_dir(tmp.path().join("dst2")).unwrap();
    let dst2 = open_dir(&tmp.path().join("dst2"));
    copy_tree(src.as_fd(), dst2.as_fd(), CopyOptions { max_depth: 60 }).unwrap();
    let bottom = tmp.path().join("dst2").join(["d"; 50].join("/")).join("bottom");
    assert_eq!(std::fs::read(bottom).unwrap(), b"deep");
}

#[test]
fn removal_refuses_to_cross_a_bind_mount_of_the_same_filesystem() {
    let tmp = tempfile::tempdir().unwrap();
    let vol = tmp.path().join("vol");
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(vol.join("sub/mnt")).unwrap();
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("precious"), b"keep").unwrap();
    if rustix::mount::mount_bind(&outside, vol.join("sub/mnt")).is_err() {
        eprintln!("skipping: bind mounts need root");
        return;
    }
    let root = open_dir(tmp.path());
    let err = remove_tree(root.as_fd(), OsStr::new("vol")).unwrap_err();
    rustix::mount::unmount(vol.join("sub/mnt"), rustix::mount::UnmountFlags::empty()).unwrap();
    assert!(
        matches!(err, WalkError::CrossesMount { ref path } if path.ends_with("sub/mnt")),
        "{err}"
    );
    assert_eq!(std::fs::read(outside.join("precious")).unwrap(), b"keep");
}

#[test]
fn an_empty_directory_is_removed_but_an_empty_mount_point_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let root = open_dir(tmp.path());
    std::fs::create_dir(tmp.path().join("empty")).unwrap();
    remove_tree(root.as_fd(), OsStr::new("empty")).unwrap();
    assert!(!tmp.path().join("empty").exists());
    remove_tree(root.as_fd(), OsStr::new("empty")).unwrap(); // missing is success

    // An empty directory whose (empty) contents are another mount: `rmdir` says EBUSY and the
    // walk names the mount.
    let empty_outside = tmp.path().join("outside");
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&empty_outside).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    if rustix::mount::mount_bind(&empty_outside, &mnt).is_err() {
        eprintln!("skipping: bind mounts need root");
        return;
    }
    let err = remove_tree(root.as_fd(), OsStr::new("mnt")).unwrap_err();
    rustix::mount::unmount(&mnt, rustix::mount::UnmountFlags::empty()).unwrap();
    assert!(matches!(err, WalkError::CrossesMount { .. }), "{err}");
    assert!(mnt.is_dir() && empty_outside.is_dir());
}
