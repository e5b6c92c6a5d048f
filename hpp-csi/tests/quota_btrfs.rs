//! Volumes and snapshots of a `quota: btrfs` pool on a real, loop-mounted btrfs: every volume
//! is a size-limited subvolume, clones and snapshots are subvolume snapshots, deletion and the
//! start-up sweep take subvolumes (read-only ones included) away.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../hpp-fs/tests/common/mod.rs"]
mod loopfs;

use std::io::Write;
use std::os::fd::AsFd;

use hpp_api::quota::QuotaMode;
use hpp_csi::mountinfo::MountTable;
use hpp_csi::pool::Pool;
use hpp_csi::volumes::{self, Created, Requested};
use hpp_csi::{PoolConfig, snapshots};
use hpp_fs::quota::btrfs::is_subvolume;

const MIB: u64 = 1 << 20;

fn is_subvol(path: &std::path::Path) -> bool {
    is_subvolume(std::fs::File::open(path).unwrap().as_fd())
}

fn write_mib(path: &std::path::Path, mib: u64) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    for _ in 0..mib {
        f.write_all(&vec![7u8; MIB as usize])?;
    }
    f.sync_all()
}

#[test]
fn a_btrfs_pool_builds_limited_subvolumes_snapshots_and_clones_and_removes_them() {
    let Some(fs) = loopfs::LoopFs::new("btrfs", 512, "") else {
        return;
    };
    let root = fs.path();
    let cfg = PoolConfig::new("b", root.join("pool"))
        .with_snapshots(root.join("snaps"))
        .quota(QuotaMode::Btrfs, 100);
    let pool = Pool::prepare(&cfg).unwrap();
    assert_eq!(pool.quota.name(), "btrfs");
    let want = |bytes| Requested {
        required: bytes,
        limit: 0,
    };

    assert!(matches!(
        volumes::create(&pool, "pvc-1", None, want(8 * MIB)).unwrap(),
        Created::New(_)
    ));
    let vol = root.join("pool/pvc-1");
    assert!(is_subvol(&vol));
    assert!(write_mib(&vol.join("big"), 16).is_err(), "the 8 MiB limit holds");
    std::fs::remove_file(vol.join("big")).unwrap();
    std::fs::write(vol.join("hello"), b"world").unwrap();
    // Idempotent retry.
    assert_eq!(
        volumes::create(&pool, "pvc-1", None, want(8 * MIB)).unwrap(),
        Created::Existing
    );

    let src = volumes::open(&pool, "pvc-1").unwrap();
    snapshots::create(&pool, "snap-1", "pvc-1", &src).unwrap();
    assert!(is_subvol(&root.join("snaps/snap-1/data")));

    let data = snapshots::open_data(&pool, "snap-1").unwrap();
    volumes::create(&pool, "pvc-2", Some(&data), want(32 * MIB)).unwrap();
    let clone = root.join("pool/pvc-2");
    assert!(is_subvol(&clone));
    assert_eq!(std::fs::read(clone.join("hello")).unwrap(), b"world");
    let dir = pool.open().unwrap();
    let usage = pool.quota.usage(dir.as_fd(), "pvc-2").unwrap().unwrap();
    assert_eq!(usage.limit_bytes, 32 * MIB);

    // Leftovers of crashed attempts: a temporary subvolume and a half-made snapshot.
    pool.quota.create(dir.as_fd(), ".hpp-tmp-pvc-3-0badf00d", MIB).unwrap();
    let snaps = std::fs::File::open(root.join("snaps")).unwrap();
    std::fs::create_dir(root.join("snaps/.hpp-tmp-snap-2-0badf00d")).unwrap();
    let half = std::fs::File::open(root.join("snaps/.hpp-tmp-snap-2-0badf00d")).unwrap();
    assert!(pool.quota.snapshot(half.as_fd(), "data", src.as_fd()).unwrap());
    drop(half);
    assert_eq!(volumes::sweep(dir.as_fd(), &*pool.quota).unwrap(), 1);
    assert_eq!(snapshots::sweep(&pool).unwrap(), 1);
    assert!(!root.join("pool/.hpp-tmp-pvc-3-0badf00d").exists());
    assert!(!root.join("snaps/.hpp-tmp-snap-2-0badf00d").exists());
    drop(snaps);

    // A plain directory from before the pool used btrfs is still served and deleted.
    std::fs::create_dir(root.join("pool/legacy")).unwrap();
    assert!(pool.quota.usage(dir.as_fd(), "legacy").unwrap().is_none());

    drop((src, data));
    let mounts = MountTable::read().unwrap();
    for id in ["pvc-1", "pvc-2", "legacy"] {
        assert!(volumes::delete(&pool, id, &mounts).unwrap(), "{id}");
        assert!(!root.join("pool").join(id).exists());
    }
    assert!(snapshots::delete(&pool, "snap-1").unwrap());
    assert!(!root.join("snaps/snap-1").exists());
}
