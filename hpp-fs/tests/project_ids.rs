//! The project id allocator: never one id for two directories, whatever the concurrency;
//! ids come back only when the directory carrying them is gone (crash leftovers included);
//! on a real XFS the ids are the filesystem's project ids and are inherited.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};

use hpp_fs::quota::project::{Allocator, FIRST_ID, FsProjectIds, IdStore, LAST_ID};
use hpp_fs::quota::{Project, ProjectFs};

/// Keeps the id in a file inside the directory: works on any filesystem, and is read by the
/// same scan as the real project ids.
#[derive(Debug, Clone, Copy)]
struct FileIds;

impl IdStore for FileIds {
    fn get(&self, dir: BorrowedFd<'_>) -> io::Result<u32> {
        use rustix::fs::{Mode, OFlags};
        match rustix::fs::openat(dir, ".id", OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()) {
            Ok(fd) => {
                let mut s = String::new();
                std::fs::File::from(fd).read_to_string(&mut s)?;
                Ok(s.trim().parse().unwrap_or(0))
            }
            Err(rustix::io::Errno::NOENT) => Ok(0),
            Err(e) => Err(e.into()),
        }
    }

    fn set(&self, dir: BorrowedFd<'_>, id: u32) -> io::Result<()> {
        use rustix::fs::{Mode, OFlags};
        let fd = rustix::fs::openat(
            dir,
            ".id",
            OFlags::WRONLY | OFlags::CREATE | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        std::fs::File::from(fd).write_all(id.to_string().as_bytes())
    }
}

#[test]
fn concurrent_creators_never_share_an_id() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().to_path_buf();
    const THREADS: usize = 8;
    const EACH: usize = 25;
    let ids: Vec<Vec<u32>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let path = path.clone();
                s.spawn(move || {
                    // Each thread its own allocator and pool descriptor, like separate processes.
                    let alloc = Allocator::new(FileIds, 100, 10_000);
                    let pool = std::fs::File::open(&path).unwrap();
                    (0..EACH)
                        .map(|i| alloc.create_dir(pool.as_fd(), &format!("v-{t}-{i}")).unwrap().1)
                        .collect::<Vec<u32>>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let all: Vec<u32> = ids.into_iter().flatten().collect();
    let distinct: BTreeSet<u32> = all.iter().copied().collect();
    assert_eq!(distinct.len(), THREADS * EACH, "an id was handed out twice");
    // Dense: the allocator fills from the bottom.
    assert_eq!(distinct, (100..100 + (THREADS * EACH) as u32).collect());
    // What is on disk is what was handed out.
    let pool = std::fs::File::open(&path).unwrap();
    assert_eq!(
        Allocator::new(FileIds, 100, 10_000).used(pool.as_fd()).unwrap(),
        distinct
    );
}

#[test]
fn ids_survive_restarts_and_crash_leftovers_until_removed() {
    let tmp = tempfile::tempdir().unwrap();
    let pool = std::fs::File::open(tmp.path()).unwrap();
    let alloc = Allocator::new(FileIds, 1, 3);
    let (_, a) = alloc.create_dir(pool.as_fd(), "a").unwrap();
    // A crash after stamping a temporary: it keeps its id until the sweep removes it.
    let (_, t) = alloc.create_dir(pool.as_fd(), ".hpp-tmp-b-0badf00d").unwrap();
    // A crash between mkdir and stamping: an unstamped directory holds no id.
    std::fs::create_dir(tmp.path().join(".hpp-tmp-c-0badf00d")).unwrap();
    // "Restart": a new allocator sees the same ids.
    let again = Allocator::new(FileIds, 1, 3);
    let (_, c) = again.create_dir(pool.as_fd(), "c").unwrap();
    assert_eq!((a, t, c), (1, 2, 3));
    let err = again.create_dir(pool.as_fd(), "d").unwrap_err();
    assert!(err.to_string().contains("in use"), "{err}");
    assert!(!tmp.path().join("d").exists(), "no directory without an id");
    // The sweep removes the temporary: its id is free again.
    std::fs::remove_dir_all(tmp.path().join(".hpp-tmp-b-0badf00d")).unwrap();
    assert_eq!(again.create_dir(pool.as_fd(), "d").unwrap().1, 2);
}

#[test]
fn on_xfs_the_ids_are_real_project_ids_and_inherited() {
    let Some(fs) = hpp_testkit::loopfs::LoopFs::new("xfs", 320, "") else {
        return;
    };
    let pool = std::fs::File::open(fs.path()).unwrap();
    let alloc = Allocator::new(FsProjectIds, FIRST_ID, LAST_ID);
    let (dir, id) = alloc.create_dir(pool.as_fd(), "v1").unwrap();
    assert_eq!(id, FIRST_ID);
    assert_eq!(hpp_sys::quota::project_id(dir.as_fd()).unwrap(), (FIRST_ID, true));
    std::fs::create_dir(fs.path().join("v1/sub")).unwrap();
    std::fs::write(fs.path().join("v1/sub/f"), b"x").unwrap();
    let f = std::fs::File::open(fs.path().join("v1/sub/f")).unwrap();
    assert_eq!(hpp_sys::quota::project_id(f.as_fd()).unwrap().0, FIRST_ID, "inherited");
    assert_eq!(alloc.create_dir(pool.as_fd(), "v2").unwrap().1, FIRST_ID + 1);

    // Enforcement needs the kernel's XFS quota support, which this machine may lack.
    match Project::open(pool.as_fd(), ProjectFs::Xfs) {
        Err(e) => {
            assert!(e.to_string().contains("prjquota"), "{e}");
            eprintln!("skipped the enforcement half: {e}");
        }
        Ok(_) => eprintln!("the pool's filesystem enforces project quota without prjquota?"),
    }
}

#[test]
fn limits_are_enforced_where_the_kernel_has_project_quota() {
    let Some(fs) = hpp_testkit::loopfs::LoopFs::new("xfs", 320, "prjquota") else {
        eprintln!("skipped: `mount -o prjquota` fails here (no XFS quota in this kernel)");
        return;
    };
    use hpp_fs::quota::QuotaBackend;
    let pool = std::fs::File::open(fs.path()).unwrap();
    let backend = Project::open(pool.as_fd(), ProjectFs::Xfs).unwrap();
    backend.create(pool.as_fd(), "small", 4 << 20).unwrap();
    let mut f = std::fs::File::create(fs.path().join("small/f")).unwrap();
    let err = (0..8)
        .try_for_each(|_| f.write_all(&vec![0u8; 1 << 20]))
        .and_then(|()| f.sync_all())
        .unwrap_err();
    assert!(matches!(
        rustix::io::Errno::from_io_error(&err),
        Some(rustix::io::Errno::DQUOT | rustix::io::Errno::NOSPC)
    ));
    let st = rustix::fs::statvfs(fs.path().join("small")).unwrap();
    assert!(st.f_blocks * st.f_frsize <= 4 << 20, "df shows the limit");
    backend.set_limit(pool.as_fd(), "small", 16 << 20).unwrap();
    f.write_all(&[0u8; 4096]).unwrap();
    assert_eq!(
        backend.usage(pool.as_fd(), "small").unwrap().unwrap().limit_bytes,
        16 << 20
    );
    drop(f);
    backend.remove(pool.as_fd(), "small").unwrap();
}
