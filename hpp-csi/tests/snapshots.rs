//! Snapshots, restore and clone over a real unix socket; copy-on-write on a loop-mounted XFS
//! image with reflink=1 when mkfs.xfs and loop devices are available.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use hpp_csi::PoolConfig;
use hpp_csi::csi::{self, volume_content_source};
use tonic::Code;

fn snap_req(src: &str, name: &str) -> csi::CreateSnapshotRequest {
    csi::CreateSnapshotRequest {
        source_volume_id: src.into(),
        name: name.into(),
        ..Default::default()
    }
}

fn from_snapshot(name: &str, snap: &str) -> csi::CreateVolumeRequest {
    let mut req = create_req(name);
    req.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(volume_content_source::Type::Snapshot(
            volume_content_source::SnapshotSource {
                snapshot_id: snap.into(),
            },
        )),
    });
    req
}

fn from_volume(name: &str, src: &str) -> csi::CreateVolumeRequest {
    let mut req = create_req(name);
    req.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(volume_content_source::Type::Volume(
            volume_content_source::VolumeSource { volume_id: src.into() },
        )),
    });
    req
}

#[tokio::test]
async fn snapshot_restore_and_clone_copy_contents() {
    let mut h = Harness::start().await;
    h.create("pvc-src").await;
    populate(&h.pool_path().join("pvc-src"));
    let snap = h
        .controller
        .create_snapshot(snap_req("pvc-src", "snap-1"))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(snap.snapshot_id, "snap-1");
    assert_eq!(snap.source_volume_id, "pvc-src");
    assert!(snap.ready_to_use);
    assert!(snap.creation_time.unwrap().seconds > 0);
    // KubeVirt layout: <snapshotPath>/<name>/data + <snapshotPath>/<name>/<source>.
    assert_populated(&h.snap_path().join("snap-1/data"));
    assert!(h.snap_path().join("snap-1/pvc-src").is_dir());
    // Same name, same source: the same snapshot. Same name, other source: AlreadyExists.
    let again = h
        .controller
        .create_snapshot(snap_req("pvc-src", "snap-1"))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(again, snap);
    h.create("pvc-other").await;
    assert_eq!(
        code(h.controller.create_snapshot(snap_req("pvc-other", "snap-1")).await),
        Code::AlreadyExists
    );
    // The snapshot is a point in time: later writes to the source do not leak in.
    std::fs::write(h.pool_path().join("pvc-src/top.txt"), b"changed").unwrap();
    let restored = h
        .controller
        .create_volume(from_snapshot("pvc-restored", "snap-1"))
        .await
        .unwrap()
        .into_inner();
    assert!(restored.volume.unwrap().content_source.is_some());
    assert_populated(&h.pool_path().join("pvc-restored"));
    // Clone copies the current contents.
    h.controller
        .create_volume(from_volume("pvc-clone", "pvc-src"))
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(h.pool_path().join("pvc-clone/top.txt")).unwrap(),
        b"changed"
    );
    assert_eq!(
        std::fs::read(h.pool_path().join("pvc-clone/sub/deeper/blob.bin")).unwrap(),
        vec![7u8; 256 * 1024]
    );
    // Deleting the source keeps the snapshot and the restored copy intact.
    h.delete("pvc-src").await.unwrap();
    assert_populated(&h.pool_path().join("pvc-restored"));
    assert_populated(&h.snap_path().join("snap-1/data"));
    // Delete snapshot, idempotently.
    let del = csi::DeleteSnapshotRequest {
        snapshot_id: "snap-1".into(),
        ..Default::default()
    };
    h.controller.delete_snapshot(del.clone()).await.unwrap();
    h.controller.delete_snapshot(del).await.unwrap();
    assert!(!h.snap_path().join("snap-1").exists());
    assert_eq!(
        code(h.controller.create_volume(from_snapshot("pvc-r2", "snap-1")).await),
        Code::NotFound
    );
    h.stop().await;
}

#[tokio::test]
async fn snapshot_errors() {
    let mut h = Harness::with(|root, b| {
        b.pool(legacy_pool(root))
            .pool(PoolConfig::new("nosnap", root.join("pools/nosnap")))
    })
    .await;
    assert_eq!(
        code(h.controller.create_snapshot(snap_req("pvc-none", "s1")).await),
        Code::NotFound
    );
    assert_eq!(
        code(h.controller.create_snapshot(snap_req("", "s1")).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(h.controller.create_snapshot(snap_req("pvc-a", "")).await),
        Code::InvalidArgument
    );
    let mut req = create_req("pvc-n");
    req.parameters = params("nosnap");
    h.controller.create_volume(req).await.unwrap();
    let mut s = snap_req("pvc-n", "s2");
    s.parameters = params("nosnap");
    assert_eq!(code(h.controller.create_snapshot(s).await), Code::InvalidArgument);
    let mut s = snap_req("pvc-n", "s2");
    s.parameters = params("missing-pool");
    assert_eq!(code(h.controller.create_snapshot(s).await), Code::NotFound);
    assert_eq!(
        code(
            h.controller
                .delete_snapshot(csi::DeleteSnapshotRequest::default())
                .await
        ),
        Code::InvalidArgument
    );
    // Listing before any snapshot directory exists is an empty list, not an error.
    let empty = h
        .controller
        .list_snapshots(csi::ListSnapshotsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(empty.entries.is_empty());
    h.stop().await;
}

/// A snapshot lives with its source, in whichever pool holds it: a request without a
/// `storagePool` parameter (the CLI's) or naming another pool (a class shared by the pools)
/// finds the source there instead of answering NotFound from the default pool.
#[tokio::test]
async fn a_snapshot_finds_its_source_in_any_pool() {
    let mut h = Harness::with(|root, b| {
        b.pool(legacy_pool(root))
            .pool(PoolConfig::new("second", root.join("pools/second")).with_snapshots(root.join("snapshots/second")))
    })
    .await;
    let mut req = create_req("pvc-2");
    req.parameters = params("second");
    h.controller.create_volume(req).await.unwrap();
    let snap = h
        .controller
        .create_snapshot(snap_req("pvc-2", "snap-2"))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(snap.source_volume_id, "pvc-2");
    assert!(h.root.join("snapshots/second/snap-2").is_dir());
    assert!(!h.root.join("snapshots/legacy/snap-2").exists());
    // Named by a class of the other pool, and retried: the same snapshot.
    let mut again = snap_req("pvc-2", "snap-2");
    again.parameters = params("legacy");
    let retried = h
        .controller
        .create_snapshot(again)
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(retried.snapshot_id, "snap-2");
    h.stop().await;
}

#[tokio::test]
async fn list_snapshots_filters_and_paginates() {
    let mut h = Harness::start().await;
    h.create("pvc-a").await;
    h.create("pvc-b").await;
    for i in 0..12 {
        let src = if i % 3 == 0 { "pvc-b" } else { "pvc-a" };
        h.controller
            .create_snapshot(snap_req(src, &format!("snap-{i:02}")))
            .await
            .unwrap();
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let r = h
            .controller
            .list_snapshots(csi::ListSnapshotsRequest {
                max_entries: 5,
                starting_token: token.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        pages += 1;
        seen.extend(r.entries.into_iter().map(|e| e.snapshot.unwrap().snapshot_id));
        if r.next_token.is_empty() {
            break;
        }
        token = r.next_token;
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, (0..12).map(|i| format!("snap-{i:02}")).collect::<Vec<_>>());
    let by_source = h
        .controller
        .list_snapshots(csi::ListSnapshotsRequest {
            source_volume_id: "pvc-b".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(by_source.entries.len(), 4);
    let by_id = h
        .controller
        .list_snapshots(csi::ListSnapshotsRequest {
            snapshot_id: "snap-03".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(by_id.entries.len(), 1);
    assert_eq!(by_id.entries[0].snapshot.as_ref().unwrap().source_volume_id, "pvc-b");
    for missing in ["snap-99", "../etc"] {
        let r = h
            .controller
            .list_snapshots(csi::ListSnapshotsRequest {
                snapshot_id: missing.into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(r.entries.is_empty());
    }
    let bad = h
        .controller
        .list_snapshots(csi::ListSnapshotsRequest {
            max_entries: 2,
            starting_token: "garbage".into(),
            ..Default::default()
        })
        .await;
    assert_eq!(code(bad), Code::Aborted);
    h.stop().await;
}

/// Mounts a fresh XFS image with reflink=1 at `mnt`, or says why it cannot.
fn mount_xfs(dir: &Path, mnt: &Path) -> Result<(), String> {
    if Command::new("mkfs.xfs").arg("-V").output().is_err() {
        return Err("mkfs.xfs not installed (apt-get install xfsprogs)".into());
    }
    let img = dir.join("xfs.img");
    let f = std::fs::File::create(&img).map_err(|e| e.to_string())?;
    f.set_len(512 << 20).map_err(|e| e.to_string())?;
    let out = Command::new("mkfs.xfs")
        .args(["-q", "-m", "reflink=1"])
        .arg(&img)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("mkfs.xfs failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    std::fs::create_dir_all(mnt).map_err(|e| e.to_string())?;
    let out = Command::new("mount")
        .args(["-o", "loop"])
        .arg(&img)
        .arg(mnt)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("loop mount failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(())
}

fn available(p: &Path) -> u64 {
    let st = rustix::fs::statvfs(p).unwrap();
    st.f_bavail * st.f_frsize
}

#[tokio::test]
async fn reflink_on_xfs_shares_extents() {
    let scratch = tempfile::tempdir().unwrap();
    let mnt = std::fs::canonicalize(scratch.path()).unwrap().join("xfs");
    if let Err(why) = mount_xfs(scratch.path(), &mnt) {
        println!("SKIPPED reflink_on_xfs_shares_extents: {why}");
        return;
    }
    let result = std::panic::AssertUnwindSafe(async {
        let mut h = Harness::with(|_, b| {
            b.pool(
                PoolConfig::new("xfs", mnt.join("pool"))
                    .with_snapshots(mnt.join("snapshots"))
                    .require_mount_point(false),
            )
        })
        .await;
        let mut req = create_req("pvc-big");
        req.parameters = params("xfs");
        h.controller.create_volume(req).await.unwrap();
        let big = vec![0xA5u8; 96 << 20];
        std::fs::write(mnt.join("pool/pvc-big/disk.img"), &big).unwrap();
        rustix::fs::sync();
        let before = available(&mnt);
        let mut s = snap_req("pvc-big", "snap-big");
        s.parameters = params("xfs");
        h.controller.create_snapshot(s).await.unwrap();
        let mut r = from_snapshot("pvc-restored", "snap-big");
        r.parameters = params("xfs");
        h.controller.create_volume(r).await.unwrap();
        let mut c = from_volume("pvc-cloned", "pvc-big");
        c.parameters = params("xfs");
        h.controller.create_volume(c).await.unwrap();
        rustix::fs::sync();
        let after = available(&mnt);
        // Three full copies would take 288 MiB of a 512 MiB filesystem; reflinks take ~nothing.
        let used = before.saturating_sub(after);
        assert!(used < 16 << 20, "reflink copies used {used} bytes");
        for p in [
            "snapshots/snap-big/data/disk.img",
            "pool/pvc-restored/disk.img",
            "pool/pvc-cloned/disk.img",
        ] {
            assert_eq!(std::fs::read(mnt.join(p)).unwrap(), big, "{p}");
        }
        // Copy-on-write: modifying the clone leaves the source intact.
        std::fs::write(mnt.join("pool/pvc-cloned/disk.img"), b"overwritten").unwrap();
        assert_eq!(
            std::fs::read(mnt.join("pool/pvc-big/disk.img")).unwrap().len(),
            96 << 20
        );
        h.stop().await;
    });
    let outcome = futures::FutureExt::catch_unwind(result).await;
    unmount_below(&mnt);
    if let Err(p) = outcome {
        std::panic::resume_unwind(p);
    }
}

#[tokio::test]
async fn clone_into_a_full_pool_is_resource_exhausted_and_leaves_nothing() {
    let scratch = tempfile::tempdir().unwrap();
    let small = std::fs::canonicalize(scratch.path()).unwrap().join("small");
    std::fs::create_dir_all(&small).unwrap();
    rustix::mount::mount("tmpfs", &small, "tmpfs", rustix::mount::MountFlags::empty(), c"size=1m").unwrap();
    let result = std::panic::AssertUnwindSafe(async {
        let mut h = Harness::with(|root, b| {
            b.pool(legacy_pool(root))
                .pool(PoolConfig::new("small", &small).require_mount_point(true))
        })
        .await;
        h.create("pvc-big").await;
        std::fs::write(h.pool_path().join("pvc-big/blob"), vec![1u8; 4 << 20]).unwrap();
        let mut clone = from_volume("pvc-full", "pvc-big");
        clone.parameters = params("small");
        let err = h.controller.create_volume(clone).await.unwrap_err();
        assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
        let left: Vec<_> = std::fs::read_dir(&small)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "leftovers: {left:?}");
        // The pool still works for volumes that fit.
        let mut ok = create_req("pvc-fits");
        ok.parameters = params("small");
        h.controller.create_volume(ok).await.unwrap();
        h.stop().await;
    });
    let outcome = futures::FutureExt::catch_unwind(result).await;
    unmount_below(&small);
    if let Err(p) = outcome {
        std::panic::resume_unwind(p);
    }
}

#[tokio::test]
async fn a_guarded_pools_snapshot_dir_must_be_on_a_mount() {
    let mut h = Harness::with(|root, b| {
        let pool = root.join("pools/guarded");
        std::fs::create_dir_all(&pool).unwrap();
        rustix::mount::mount("tmpfs", &pool, "tmpfs", rustix::mount::MountFlags::empty(), c"size=16m").unwrap();
        std::fs::create_dir_all(root.join("snapshots/outside")).unwrap();
        b.pool(
            hpp_csi::PoolConfig::new("legacy", pool)
                .with_snapshots(root.join("snapshots/outside"))
                .require_mount_point(true),
        )
    })
    .await;
    h.create("pvc-g").await;
    let res = h.controller.create_snapshot(snap_req("pvc-g", "snap-g")).await;
    assert_eq!(
        code(res),
        tonic::Code::FailedPrecondition,
        "snapshots would land on the root disk"
    );
    assert_eq!(std::fs::read_dir(h.root.join("snapshots/outside")).unwrap().count(), 0);
    h.stop().await;
}

/// DeleteSnapshot deletes only snapshots: a directory in the snapshot directory without a source
/// marker is someone else's (KubeVirt's `rm -rf` took it). CreateSnapshot onto such a name is
/// AlreadyExists, not an Aborted that no retry could clear.
#[tokio::test]
async fn foreign_directories_in_the_snapshot_dir_are_left_alone() {
    let mut h = Harness::start().await;
    h.create("pvc-src").await;
    let snaps = h.root.join("snapshots/legacy");
    let foreign = snaps.join("foreign");
    std::fs::create_dir_all(&foreign).unwrap();
    std::fs::write(foreign.join("keep"), b"not ours").unwrap();
    h.controller
        .delete_snapshot(csi::DeleteSnapshotRequest {
            snapshot_id: "foreign".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(std::fs::read(foreign.join("keep")).unwrap(), b"not ours");
    let err = h
        .controller
        .create_snapshot(snap_req("pvc-src", "foreign"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{}", err.message());
    assert!(foreign.join("keep").exists());
    let leftovers: Vec<_> = std::fs::read_dir(&snaps)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(".hpp-") && n != hpp_csi::ops::volume_journal::JOURNAL_NAME)
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // A real snapshot is still deleted.
    h.controller
        .create_snapshot(snap_req("pvc-src", "snap-ok"))
        .await
        .unwrap();
    h.controller
        .delete_snapshot(csi::DeleteSnapshotRequest {
            snapshot_id: "snap-ok".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(!snaps.join("snap-ok").exists());
    h.stop().await;
}

/// KubeVirt's layout records the source as a directory next to `data`: a source volume named
/// `data` gets a clear FailedPrecondition and leaves nothing behind.
#[tokio::test]
async fn a_source_named_data_is_refused_cleanly() {
    let mut h = Harness::start().await;
    h.create("data").await;
    let err = h
        .controller
        .create_snapshot(snap_req("data", "snap-d"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    h.stop().await;
}

/// A clone whose source is the volume being created can never succeed: InvalidArgument, not an
/// Aborted (its own in-flight key) that every retry would get again.
#[tokio::test]
async fn a_volume_cannot_be_cloned_from_itself() {
    let mut h = Harness::start().await;
    for exists in [false, true] {
        if exists {
            h.create("pvc-self").await;
        }
        let err = h
            .controller
            .create_volume(from_volume("pvc-self", "pvc-self"))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "exists: {exists}: {}", err.message());
    }
    h.stop().await;
}
