//! What a copy preserves: holes, hard links, extended attributes, modes, links and times.

#![allow(clippy::unwrap_used)]

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use hpp_fs::{CopyOptions, WalkError, copy_tree};
use rustix::fs::{Mode, OFlags};

fn open_dir(path: &std::path::Path) -> OwnedFd {
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .unwrap()
}

#[test]
fn copy_keeps_holes_hardlinks_xattrs_modes_and_links() {
    let src = tempfile::tempdir().unwrap();
    let s = src.path();
    std::fs::create_dir(s.join("d")).unwrap();
    std::fs::write(s.join("d/file"), b"hello").unwrap();
    std::fs::set_permissions(s.join("d/file"), std::fs::Permissions::from_mode(0o640)).unwrap();
    std::fs::hard_link(s.join("d/file"), s.join("link2")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", s.join("sym")).unwrap();
    // 64 MiB sparse file with 4 KiB of data in the middle.
    let sparse = std::fs::File::create(s.join("sparse")).unwrap();
    sparse.set_len(64 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&sparse, &[7u8; 4096], 32 << 20).unwrap();
    drop(sparse);
    let xattr_ok = rustix::fs::setxattr(
        s.join("d/file").as_path(),
        "user.hpp",
        b"v1",
        rustix::fs::XattrFlags::empty(),
    )
    .is_ok();

    let dst = tempfile::tempdir().unwrap();
    let d = dst.path();
    let stats = copy_tree(open_dir(s).as_fd(), open_dir(d).as_fd(), CopyOptions::default()).unwrap();
    assert_eq!(stats.hardlinks, 1);
    assert_eq!(std::fs::read(d.join("d/file")).unwrap(), b"hello");
    assert_eq!(
        std::fs::metadata(d.join("d/file")).unwrap().permissions().mode() & 0o777,
        0o640
    );
    assert_eq!(
        std::fs::metadata(d.join("d/file")).unwrap().ino(),
        std::fs::metadata(d.join("link2")).unwrap().ino(),
        "hard links stay hard links"
    );
    assert_eq!(
        std::fs::read_link(d.join("sym")).unwrap(),
        std::path::Path::new("/etc/passwd")
    );
    let meta = std::fs::metadata(d.join("sparse")).unwrap();
    assert_eq!(meta.len(), 64 << 20);
    assert!(meta.blocks() * 512 < 1 << 20, "holes kept: {} blocks", meta.blocks());
    let data = std::fs::read(d.join("sparse")).unwrap();
    assert_eq!(&data[(32 << 20)..(32 << 20) + 4096], &[7u8; 4096]);
    if xattr_ok {
        let mut buf = vec![0u8; 16];
        let n = rustix::fs::getxattr(d.join("d/file").as_path(), "user.hpp", &mut buf).unwrap();
        assert_eq!(&buf[..n], b"v1");
    } else {
        eprintln!("skipping xattr check: user xattrs unsupported here");
    }
    assert_eq!(
        std::fs::metadata(s.join("d/file")).unwrap().modified().unwrap(),
        std::fs::metadata(d.join("d/file")).unwrap().modified().unwrap()
    );
}

#[test]
fn a_copy_that_cannot_fit_is_refused_before_anything_is_copied() {
    let dir = tempfile::tempdir().unwrap();
    let small = dir.path().join("small");
    std::fs::create_dir(&small).unwrap();
    if rustix::mount::mount("tmpfs", &small, "tmpfs", rustix::mount::MountFlags::empty(), c"size=1m").is_err() {
        eprintln!("skipping: mounting tmpfs needs root");
        return;
    }
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("big"), vec![1u8; 4 << 20]).unwrap();
    let err = hpp_fs::copy::check_fits(open_dir(&src).as_fd(), open_dir(&small).as_fd());
    let empty = std::fs::read_dir(&small).unwrap().count() == 0;
    rustix::mount::unmount(&small, rustix::mount::UnmountFlags::empty()).unwrap();
    assert!(matches!(err, Err(WalkError::NoSpace { .. })), "{err:?}");
    assert!(empty);
}
