//! Hostile input, symlinks, concurrency and crash recovery, over a real unix socket.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

mod common;

use common::*;
use hpp_csi::csi;
use tonic::Code;

const HOSTILE_IDS: &[&str] = &[
    "..",
    ".",
    "../escape",
    "../../etc",
    "a/b",
    "/etc",
    "/",
    "pvc\0nul",
    "pvc\nnewline",
    ".hpp-tmp-pvc-1",
];

#[tokio::test]
async fn hostile_ids_get_invalid_argument_and_touch_nothing() {
    let mut h = Harness::start().await;
    let long = "a".repeat(300);
    let t = h.target("t");
    let before = std::fs::read_dir(&h.root).unwrap().count();
    for id in HOSTILE_IDS.iter().copied().chain([long.as_str()]) {
        assert_eq!(
            code(h.controller.create_volume(create_req(id)).await),
            Code::InvalidArgument,
            "create {id:?}"
        );
        let del = csi::DeleteVolumeRequest {
            volume_id: id.into(),
            ..Default::default()
        };
        assert_eq!(
            code(h.controller.delete_volume(del).await),
            Code::InvalidArgument,
            "delete {id:?}"
        );
        let get = csi::ControllerGetVolumeRequest { volume_id: id.into() };
        assert_eq!(
            code(h.controller.controller_get_volume(get).await),
            Code::InvalidArgument,
            "get {id:?}"
        );
        assert_eq!(
            code(h.publish(id, &t, false).await),
            Code::InvalidArgument,
            "publish {id:?}"
        );
        let snap = csi::CreateSnapshotRequest {
            source_volume_id: "pvc-ok".into(),
            name: id.into(),
            ..Default::default()
        };
        assert_eq!(
            code(h.controller.create_snapshot(snap).await),
            Code::InvalidArgument,
            "snapshot {id:?}"
        );
        let del_snap = csi::DeleteSnapshotRequest {
            snapshot_id: id.into(),
            ..Default::default()
        };
        assert_eq!(
            code(h.controller.delete_snapshot(del_snap).await),
            Code::InvalidArgument,
            "delete snapshot {id:?}"
        );
        let mut clone = create_req("pvc-clone");
        clone.volume_content_source = Some(csi::VolumeContentSource {
            r#type: Some(csi::volume_content_source::Type::Volume(
                csi::volume_content_source::VolumeSource { volume_id: id.into() },
            )),
        });
        assert_eq!(
            code(h.controller.create_volume(clone).await),
            Code::InvalidArgument,
            "clone {id:?}"
        );
    }
    // Hostile pool parameter.
    let mut req = create_req("pvc-ok");
    req.parameters = params("../../etc");
    assert_eq!(code(h.controller.create_volume(req).await), Code::NotFound);
    // Nothing was created anywhere.
    assert_eq!(std::fs::read_dir(&h.root).unwrap().count(), before);
    let in_pool: Vec<_> = std::fs::read_dir(h.pool_path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != hpp_csi::ops::volume_journal::JOURNAL_NAME)
        .collect();
    assert!(in_pool.is_empty(), "{in_pool:?}");
    h.stop().await;
}

#[tokio::test]
async fn hostile_target_paths_are_rejected() {
    let mut h = Harness::start().await;
    h.create("pvc-t").await;
    for target in ["relative/target", "/a/../etc", "/a/./b", "/tmp//x", "/tmp/x\0y", "/"] {
        let mut req = publish_req("pvc-t", std::path::Path::new("/unused"), false);
        req.target_path = target.into();
        assert_eq!(
            code(h.node.node_publish_volume(req).await),
            Code::InvalidArgument,
            "{target:?}"
        );
        let un = csi::NodeUnpublishVolumeRequest {
            volume_id: "pvc-t".into(),
            target_path: target.into(),
        };
        assert_eq!(
            code(h.node.node_unpublish_volume(un).await),
            Code::InvalidArgument,
            "{target:?}"
        );
    }
    // A target that is a symlink is never followed (it could point at the host's /etc).
    let outside = tempfile::tempdir().unwrap();
    let link = h.target("link-target");
    std::os::unix::fs::symlink(outside.path(), &link).unwrap();
    assert_eq!(code(h.publish("pvc-t", &link, false).await), Code::InvalidArgument);
    assert_eq!(code(h.unpublish("pvc-t", &link).await), Code::InvalidArgument);
    assert!(!is_mount_point(outside.path()));
    assert!(link.symlink_metadata().unwrap().file_type().is_symlink());
    // The pool and the snapshot directory themselves are never targets.
    assert_eq!(
        code(h.publish("pvc-t", &h.pool_path(), false).await),
        Code::InvalidArgument
    );
    assert_eq!(code(h.unpublish("pvc-t", &h.pool_path()).await), Code::InvalidArgument);
    assert_eq!(code(h.unpublish("pvc-t", &h.snap_path()).await), Code::InvalidArgument);
    assert!(h.pool_path().join("pvc-t").is_dir());
    h.stop().await;
}

#[tokio::test]
async fn symlinks_planted_in_a_pool_never_lead_out_of_it() {
    let mut h = Harness::start().await;
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), b"host data").unwrap();
    std::os::unix::fs::symlink(outside.path(), h.pool_path().join("pvc-evil")).unwrap();
    // Publishing the symlink would bind-mount the outside directory into a pod.
    let t = h.target("evil");
    assert_eq!(code(h.publish("pvc-evil", &t, false).await), Code::NotFound);
    let mut ctx_req = publish_req("pvc-evil", &t, false);
    ctx_req.volume_context = params("legacy");
    assert_eq!(code(h.node.node_publish_volume(ctx_req).await), Code::InvalidArgument);
    assert!(!t.exists() || !is_mount_point(&t));
    // Deleting it must not delete what it points to.
    let del = csi::DeleteVolumeRequest {
        volume_id: "pvc-evil".into(),
        ..Default::default()
    };
    assert_eq!(code(h.controller.delete_volume(del).await), Code::FailedPrecondition);
    assert!(outside.path().join("secret").exists());
    // Cloning or snapshotting it must not copy the outside data.
    let mut clone = create_req("pvc-clone");
    clone.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Volume(
            csi::volume_content_source::VolumeSource {
                volume_id: "pvc-evil".into(),
            },
        )),
    });
    assert_eq!(code(h.controller.create_volume(clone).await), Code::NotFound);
    let snap = csi::CreateSnapshotRequest {
        source_volume_id: "pvc-evil".into(),
        name: "s".into(),
        ..Default::default()
    };
    assert_eq!(code(h.controller.create_snapshot(snap).await), Code::InvalidArgument);
    // A symlink inside a real volume is copied as a link, not followed.
    h.create("pvc-inner").await;
    std::os::unix::fs::symlink(outside.path().join("secret"), h.pool_path().join("pvc-inner/ln")).unwrap();
    let mut clone2 = create_req("pvc-clone2");
    clone2.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Volume(
            csi::volume_content_source::VolumeSource {
                volume_id: "pvc-inner".into(),
            },
        )),
    });
    h.controller.create_volume(clone2).await.unwrap();
    let ln = h.pool_path().join("pvc-clone2/ln");
    assert!(ln.symlink_metadata().unwrap().file_type().is_symlink());
    // Deleting the volume removes the link, not its target.
    h.delete("pvc-clone2").await.unwrap();
    assert!(outside.path().join("secret").exists());
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creates_of_one_volume_converge_or_abort() {
    let h = Harness::start().await;
    for round in 0..20 {
        let name = format!("pvc-race-{round}");
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let mut c = h.controller.clone();
            let req = create_req(&name);
            tasks.push(tokio::spawn(async move { c.create_volume(req).await }));
        }
        let mut ok = 0;
        for t in tasks {
            match t.await.unwrap() {
                Ok(r) => {
                    assert_eq!(r.into_inner().volume.unwrap().volume_id, name);
                    ok += 1;
                }
                Err(s) => assert_eq!(s.code(), Code::Aborted, "{s:?}"),
            }
        }
        assert!(ok >= 1, "at least one create succeeds");
        assert!(h.pool_path().join(&name).is_dir());
        assert!(no_temporaries(&h.pool_path()), "no temporary left behind");
    }
    // Concurrent create and delete of the same volume: each outcome is OK or Aborted, never
    // anything else, and the final state is consistent with a serial order.
    for round in 0..20 {
        let name = format!("pvc-cd-{round}");
        let mut c1 = h.controller.clone();
        let mut c2 = h.controller.clone();
        let (a, b) = tokio::join!(
            c1.create_volume(create_req(&name)),
            c2.delete_volume(csi::DeleteVolumeRequest {
                volume_id: name.clone(),
                ..Default::default()
            })
        );
        for c in [code(a), code(b)] {
            assert!(matches!(c, Code::Ok | Code::Aborted), "{c:?}");
        }
        assert!(!h.pool_path().join(format!(".hpp-del-{name}")).exists());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_publishes_to_one_target_mount_once() {
    let mut h = Harness::start().await;
    h.create("pvc-cp").await;
    let target = h.target("cp");
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let mut n = h.node.clone();
        let req = publish_req("pvc-cp", &target, false);
        tasks.push(tokio::spawn(async move { n.node_publish_volume(req).await }));
    }
    for t in tasks {
        let c = code(t.await.unwrap());
        assert!(matches!(c, Code::Ok | Code::Aborted), "{c:?}");
    }
    let table = hpp_csi::mountinfo::MountTable::read().unwrap();
    let layers = table.mounts().iter().filter(|m| m.mount_point == target).count();
    assert_eq!(layers, 1, "exactly one mount layer");
    h.unpublish("pvc-cp", &target).await.unwrap();
    assert!(!target.exists());
    h.stop().await;
}

#[tokio::test]
async fn crash_leftovers_are_completed_on_retry() {
    let h = Harness::start().await;
    // A create that crashed after mkdir of the temporary and a partial copy (old and new
    // temporary names): swept when the driver starts again.
    let tmp = h.pool_path().join(".hpp-tmp-pvc-crash");
    let tmp2 = h.pool_path().join(".hpp-tmp-pvc-crash-0badcafe");
    for t in [&tmp, &tmp2] {
        std::fs::create_dir_all(t.join("partial")).unwrap();
        std::fs::write(t.join("partial/half"), b"torn").unwrap();
    }
    let stmp = h.snap_path().join(".hpp-tmp-snap-crash-12345678");
    std::fs::create_dir_all(stmp.join("data")).unwrap();
    let mut h = h.restart().await;
    assert!(
        !tmp.exists() && !tmp2.exists(),
        "stale temporaries are swept at start-up"
    );
    assert!(!stmp.exists(), "stale snapshot temporaries are swept at start-up");
    let v = h.create("pvc-crash").await;
    assert_eq!(v.volume_id, "pvc-crash");
    assert_eq!(
        std::fs::read_dir(h.pool_path().join("pvc-crash")).unwrap().count(),
        0,
        "fresh, empty volume"
    );
    // A delete that crashed after the rename: the volume is already invisible, retry finishes.
    let del = h.pool_path().join(".hpp-del-pvc-gone");
    std::fs::create_dir_all(del.join("a/b")).unwrap();
    std::fs::write(del.join("a/b/c"), b"x").unwrap();
    let all = h
        .controller
        .list_volumes(csi::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(
        all.entries
            .iter()
            .all(|e| e.volume.as_ref().unwrap().volume_id != "pvc-gone")
    );
    h.delete("pvc-gone").await.unwrap();
    assert!(!del.exists());
    // A snapshot that crashed half-way is rebuilt on retry.
    h.create("pvc-src").await;
    std::fs::write(h.pool_path().join("pvc-src/f"), b"content").unwrap();
    let snap = h
        .controller
        .create_snapshot(csi::CreateSnapshotRequest {
            source_volume_id: "pvc-src".into(),
            name: "snap-crash".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert!(snap.ready_to_use);
    assert!(no_temporaries(&h.snap_path()));
    assert_eq!(
        std::fs::read(h.snap_path().join("snap-crash/data/f")).unwrap(),
        b"content"
    );
    // A publish whose target directory was created but never mounted is completed.
    let target = h.target("half-published");
    std::fs::create_dir_all(&target).unwrap();
    h.publish("pvc-src", &target, false).await.unwrap();
    assert!(is_mount_point(&target));
    h.unpublish("pvc-src", &target).await.unwrap();
    h.stop().await;
}

/// Whether no `.hpp-tmp-*` entry is left in `dir`.
fn no_temporaries(dir: &std::path::Path) -> bool {
    std::fs::read_dir(dir)
        .unwrap()
        .all(|e| !e.unwrap().file_name().to_string_lossy().starts_with(".hpp-tmp-"))
}
