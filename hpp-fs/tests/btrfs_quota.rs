//! The btrfs backend on a real, loop-mounted btrfs: limits are enforced per volume, raised
//! while files are open, read back without a walk, and deletion takes the subvolume and its
//! qgroup.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use hpp_fs::quota::{Btrfs, QuotaBackend};

const MIB: u64 = 1 << 20;

/// Writes `mib` MiB of data to `path` and syncs; returns the first error.
fn fill(file: &mut std::fs::File, mib: u64) -> std::io::Result<()> {
    let chunk = vec![0x5au8; MIB as usize];
    for _ in 0..mib {
        file.write_all(&chunk)?;
    }
    file.sync_all()
}

fn is_quota_error(e: &std::io::Error) -> bool {
    matches!(
        rustix::io::Errno::from_io_error(e),
        Some(rustix::io::Errno::DQUOT | rustix::io::Errno::NOSPC)
    )
}

#[test]
fn limits_are_enforced_per_volume_raised_online_and_removed_with_the_volume() {
    let Some(fs) = common::LoopFs::new("btrfs", 512, "") else {
        return;
    };
    let pool_dir = std::fs::File::open(fs.path()).unwrap();
    let pool = pool_dir.as_fd();
    let backend = Btrfs::open(pool).unwrap();
    assert_eq!(backend.granularity(), 4096);

    backend.create(pool, "small", 8 * MIB).unwrap();
    backend.create(pool, "big", 64 * MIB).unwrap();
    assert_eq!(
        std::fs::metadata(fs.path().join("small")).unwrap().permissions().mode() & 0o7777,
        0o755
    );

    // Past the limit: EDQUOT inside the small volume.
    let mut f = std::fs::File::create(fs.path().join("small/f")).unwrap();
    let err = fill(&mut f, 16).unwrap_err();
    assert!(is_quota_error(&err), "{err}");

    // The other volume is unaffected.
    let mut g = std::fs::File::create(fs.path().join("big/g")).unwrap();
    fill(&mut g, 16).unwrap();

    // Raise the limit while the file is open: writing through the same handle works again.
    backend.set_limit(pool, "small", 64 * MIB).unwrap();
    fill(&mut f, 16).unwrap();
    drop(f);

    rustix::fs::syncfs(&pool_dir).unwrap();
    let usage = backend.usage(pool, "small").unwrap().unwrap();
    assert_eq!(usage.limit_bytes, 64 * MIB);
    assert!(usage.used_bytes >= 16 * MIB, "{usage:?}");

    // Deletion takes the subvolume; its qgroup goes once the kernel has dropped it.
    let id = hpp_sys::btrfs::subvolume_id(std::fs::File::open(fs.path().join("small")).unwrap().as_fd()).unwrap();
    backend.remove(pool, "small").unwrap();
    assert!(!fs.path().join("small").exists());
    backend.remove(pool, "small").unwrap();
    let _ = Command::new("btrfs")
        .arg("subvolume")
        .arg("sync")
        .arg(fs.path())
        .status();
    let uuid = hpp_sys::btrfs::fs_uuid(pool).unwrap();
    let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    let qgroup = format!(
        "/sys/fs/btrfs/{}-{}-{}-{}-{}/qgroups/0_{id}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    );
    // Either our remove or the kernel's cleanup after the drop took it.
    let _ = hpp_sys::btrfs::qgroup_remove(pool, id);
    assert!(!std::path::Path::new(&qgroup).exists(), "{qgroup} still exists");
    assert!(backend.usage(pool, "big").unwrap().is_some());
}

#[test]
fn clones_and_snapshots_are_subvolume_snapshots_with_their_own_limit() {
    let Some(fs) = common::LoopFs::new("btrfs", 512, "") else {
        return;
    };
    let pool_dir = std::fs::File::open(fs.path()).unwrap();
    let pool = pool_dir.as_fd();
    let backend = Btrfs::open(pool).unwrap();
    backend.create(pool, "src", 32 * MIB).unwrap();
    std::fs::write(fs.path().join("src/data"), b"hello").unwrap();

    std::fs::create_dir(fs.path().join("snaps")).unwrap();
    let snaps = std::fs::File::open(fs.path().join("snaps")).unwrap();
    let src = std::fs::File::open(fs.path().join("src")).unwrap();
    assert!(backend.snapshot(snaps.as_fd(), "s1", src.as_fd()).unwrap());
    assert_eq!(std::fs::read(fs.path().join("snaps/s1/data")).unwrap(), b"hello");
    // Read-only.
    assert!(std::fs::write(fs.path().join("snaps/s1/new"), b"x").is_err());

    let s1 = std::fs::File::open(fs.path().join("snaps/s1")).unwrap();
    let clone = backend.clone_volume(pool, "clone", s1.as_fd(), 4 * MIB).unwrap();
    assert!(clone.is_some());
    assert_eq!(std::fs::read(fs.path().join("clone/data")).unwrap(), b"hello");
    std::fs::write(fs.path().join("clone/new"), b"writable").unwrap();
    let mut f = std::fs::File::create(fs.path().join("clone/big")).unwrap();
    assert!(fill(&mut f, 8).is_err(), "the clone has its own 4 MiB limit");

    // A plain directory is no subvolume: the caller copies instead.
    std::fs::create_dir(fs.path().join("plain")).unwrap();
    let plain = std::fs::File::open(fs.path().join("plain")).unwrap();
    assert!(backend.clone_volume(pool, "c2", plain.as_fd(), MIB).unwrap().is_none());
    assert!(backend.usage(pool, "plain").unwrap().is_none());

    // Read-only snapshots are removed too.
    drop(s1);
    backend.remove(snaps.as_fd(), "s1").unwrap();
    assert!(!fs.path().join("snaps/s1").exists());
    drop(f);
    backend.remove(pool, "clone").unwrap();
    backend.remove(pool, "plain").unwrap();
    assert!(!fs.path().join("plain").exists());
}

#[test]
fn a_pool_that_is_not_btrfs_is_refused_with_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = std::fs::File::open(tmp.path()).unwrap();
    if hpp_sys::btrfs::is_btrfs(dir.as_fd()).unwrap() {
        eprintln!("skipped: the temporary directory is on btrfs");
        return;
    }
    let err = Btrfs::open(dir.as_fd()).unwrap_err();
    assert!(err.to_string().contains("btrfs"), "{err}");
}

#[test]
fn compression_is_a_per_volume_parameter_applied_while_in_use() {
    let Some(fs) = common::LoopFs::new("btrfs", 512, "") else {
        return;
    };
    let pool_dir = std::fs::File::open(fs.path()).unwrap();
    let pool = pool_dir.as_fd();
    let backend = Btrfs::open(pool).unwrap();
    backend.create(pool, "v", 64 * MIB).unwrap();
    let open_file = std::fs::File::create(fs.path().join("v/busy")).unwrap();
    assert!(backend.parameters().iter().any(|(k, _)| *k == "compression"));
    backend.set_parameter(pool, "v", "compression", "zstd").unwrap();
    let dir = std::fs::File::open(fs.path().join("v")).unwrap();
    let mut buf = [0u8; 16];
    let n = rustix::fs::fgetxattr(&dir, "btrfs.compression", &mut buf[..]).unwrap();
    assert_eq!(&buf[..n], b"zstd");
    for (key, value) in [("compression", "gzip"), ("colour", "blue")] {
        let err = backend.set_parameter(pool, "v", key, value).unwrap_err();
        assert!(matches!(err, hpp_fs::quota::QuotaError::Invalid(_)), "{err}");
    }
    drop((open_file, dir));
    backend.remove(pool, "v").unwrap();
}
