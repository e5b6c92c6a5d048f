//! Node service over a real unix socket with real bind mounts (tests run as root).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

mod common;

use std::collections::HashMap;

use common::*;
use hpp_csi::csi;
use tonic::Code;

#[tokio::test]
async fn publish_bind_mounts_and_unpublish_removes_only_the_empty_target() {
    let mut h = Harness::start().await;
    h.create("pvc-n1").await;
    let target = h.target("n1");
    h.publish("pvc-n1", &target, false).await.unwrap();
    assert!(is_mount_point(&target));
    std::fs::write(target.join("written-through-mount"), b"hello").unwrap();
    assert_eq!(
        std::fs::read(h.pool_path().join("pvc-n1/written-through-mount")).unwrap(),
        b"hello"
    );
    // Idempotent: same volume, same mode.
    h.publish("pvc-n1", &target, false).await.unwrap();
    // Same target asked read-only: incompatible with the writable publish (CSI: ALREADY_EXISTS;
    // before 5.12 the bind is corrected instead, see the crash test below).
    if hpp_csi::ops::mount::binds_are_atomic() {
        assert_eq!(code(h.publish("pvc-n1", &target, true).await), Code::AlreadyExists);
        h.unpublish("pvc-n1", &target).await.unwrap();
        h.publish("pvc-n1", &target, true).await.unwrap();
    } else {
        h.publish("pvc-n1", &target, true).await.unwrap();
    }
    assert!(
        hpp_csi::mountinfo::MountTable::read()
            .unwrap()
            .mount_at(&target)
            .unwrap()
            .read_only()
    );
    // And back: a writable request on a read-only publish is a conflict.
    assert_eq!(code(h.publish("pvc-n1", &target, false).await), Code::AlreadyExists);
    h.unpublish("pvc-n1", &target).await.unwrap();
    assert!(!is_mount_point(&target));
    assert!(!target.exists());
    // The data is still in the pool: unpublish never deletes volume content.
    assert!(h.pool_path().join("pvc-n1/written-through-mount").exists());
    // Idempotent when the target is already gone.
    h.unpublish("pvc-n1", &target).await.unwrap();
    h.stop().await;
}

#[tokio::test]
async fn read_only_and_mount_flags_are_honoured() {
    let mut h = Harness::start().await;
    h.create("pvc-ro").await;
    std::fs::write(h.pool_path().join("pvc-ro/f"), b"data").unwrap();
    let target = h.target("ro");
    h.publish("pvc-ro", &target, true).await.unwrap();
    let err = std::fs::write(target.join("g"), b"nope").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(30), "EROFS expected, got {err}");
    assert_eq!(std::fs::read(target.join("f")).unwrap(), b"data");
    h.unpublish("pvc-ro", &target).await.unwrap();

    let flagged = h.target("flags");
    let mut req = publish_req("pvc-ro", &flagged, false);
    req.volume_capability = Some(mount_cap_flags(&["nosuid", "nodev,noexec"]));
    h.node.node_publish_volume(req).await.unwrap();
    let table = hpp_csi::mountinfo::MountTable::read().unwrap();
    let m = table.mount_at(&flagged).unwrap();
    for f in ["nosuid", "nodev", "noexec"] {
        assert!(m.options.iter().any(|o| o == f), "{f} missing from {:?}", m.options);
    }
    assert!(!m.read_only());
    h.unpublish("pvc-ro", &flagged).await.unwrap();

    let mut bad = publish_req("pvc-ro", &h.target("bad-flags"), false);
    bad.volume_capability = Some(mount_cap_flags(&["uid=1000"]));
    assert_eq!(code(h.node.node_publish_volume(bad).await), Code::InvalidArgument);
    assert!(!h.target("bad-flags").exists());
    h.stop().await;
}

#[tokio::test]
async fn publish_rejects_bad_requests() {
    let mut h = Harness::start().await;
    h.create("pvc-p").await;
    let t = h.target("p");
    assert_eq!(code(h.publish("pvc-missing", &t, false).await), Code::NotFound);
    let mut no_cap = publish_req("pvc-p", &t, false);
    no_cap.volume_capability = None;
    assert_eq!(code(h.node.node_publish_volume(no_cap).await), Code::InvalidArgument);
    let mut block = publish_req("pvc-p", &t, false);
    block.volume_capability = Some(block_cap());
    assert_eq!(code(h.node.node_publish_volume(block).await), Code::InvalidArgument);
    let mut no_target = publish_req("pvc-p", &t, false);
    no_target.target_path = String::new();
    assert_eq!(code(h.node.node_publish_volume(no_target).await), Code::InvalidArgument);
    // Parent of the target missing: kubelet's job, reported as a precondition.
    let orphan = h.root.join("no-such-parent/target");
    assert_eq!(code(h.publish("pvc-p", &orphan, false).await), Code::FailedPrecondition);
    // A target inside a pool would shadow volumes.
    let inside = h.pool_path().join("pvc-other");
    assert_eq!(code(h.publish("pvc-p", &inside, false).await), Code::InvalidArgument);
    assert!(!inside.exists());
    h.stop().await;
}

#[tokio::test]
async fn unpublish_never_deletes_a_non_empty_target() {
    let mut h = Harness::start().await;
    let target = h.target("full");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("someone-elses-data"), b"keep").unwrap();
    assert_eq!(code(h.unpublish("pvc-x", &target).await), Code::FailedPrecondition);
    assert!(target.join("someone-elses-data").exists());
    assert_eq!(code(h.unpublish("", &target).await), Code::InvalidArgument);
    assert_eq!(
        code(h.unpublish("pvc-x", std::path::Path::new("")).await),
        Code::InvalidArgument
    );
    // The "csi" prefix heuristic of KubeVirt is gone: a persistent volume called csi-* survives.
    h.create("csi-persistent").await;
    let t2 = h.target("csi");
    h.publish("csi-persistent", &t2, false).await.unwrap();
    h.unpublish("csi-persistent", &t2).await.unwrap();
    assert!(h.pool_path().join("csi-persistent").is_dir());
    h.stop().await;
}

#[tokio::test]
async fn ephemeral_inline_volumes_live_as_long_as_the_mount() {
    let mut h = Harness::start().await;
    let target = h.target("eph");
    let mut req = publish_req("csi-0123abcd", &target, false);
    req.volume_context = HashMap::from([("csi.storage.k8s.io/ephemeral".into(), "true".into())]);
    h.node.node_publish_volume(req).await.unwrap();
    assert!(h.pool_path().join("csi-0123abcd").is_dir());
    assert!(is_mount_point(&target));
    // Not listed as a volume: the marker directory is internal.
    let all = h
        .controller
        .list_volumes(csi::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(all.entries.len(), 1);
    h.unpublish("csi-0123abcd", &target).await.unwrap();
    assert!(!h.pool_path().join("csi-0123abcd").exists());
    h.stop().await;
}

/// Unpublishing an ephemeral volume removes it only under the volume's own key: while a publish
/// of it at another target (or a snapshot or clone of it) is in flight, the unpublish of an
/// unmounted target answers Aborted and the volume stays.
#[tokio::test]
async fn an_ephemeral_volume_is_not_removed_while_another_operation_holds_it() {
    let mut h = Harness::start().await;
    let (t1, t2) = (h.target("eph1"), h.target("eph2"));
    let mut req = publish_req("csi-0123abcd", &t1, false);
    req.volume_context = HashMap::from([("csi.storage.k8s.io/ephemeral".into(), "true".into())]);
    h.node.node_publish_volume(req).await.unwrap();
    // As if a publish were between creating the volume and binding it: no bind of it anywhere.
    rustix::mount::unmount(&t1, rustix::mount::UnmountFlags::DETACH).unwrap();
    let in_flight = h
        .state
        .inflight
        .acquire(&[], &[hpp_csi::pool::inflight::volume_key("csi-0123abcd")])
        .unwrap();
    let err = h.unpublish("csi-0123abcd", &t2).await.unwrap_err();
    assert_eq!(err.code(), Code::Aborted, "{}", err.message());
    assert!(
        h.pool_path().join("csi-0123abcd").is_dir(),
        "removed under an operation in flight"
    );
    drop(in_flight);
    h.unpublish("csi-0123abcd", &t2).await.unwrap();
    assert!(!h.pool_path().join("csi-0123abcd").exists());
    h.stop().await;
}

#[tokio::test]
async fn stats_report_usage_and_condition() {
    let mut h = Harness::start().await;
    h.create("pvc-s").await;
    let target = h.target("s");
    h.publish("pvc-s", &target, false).await.unwrap();
    std::fs::write(target.join("blob"), vec![1u8; 1 << 20]).unwrap();
    let stats = h
        .node
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: "pvc-s".into(),
            volume_path: target.to_string_lossy().into_owned(),
            staging_target_path: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let bytes = stats
        .usage
        .iter()
        .find(|u| u.unit == csi::volume_usage::Unit::Bytes as i32)
        .unwrap();
    let inodes = stats
        .usage
        .iter()
        .find(|u| u.unit == csi::volume_usage::Unit::Inodes as i32)
        .unwrap();
    assert!(bytes.used >= 1 << 20, "used {}", bytes.used);
    assert!(bytes.total > 0 && bytes.available > 0);
    assert_eq!(inodes.used, 2);
    assert!(!stats.volume_condition.unwrap().abnormal);
    h.unpublish("pvc-s", &target).await.unwrap();

    // Path exists but nothing is mounted there: abnormal with KubeVirt's message.
    std::fs::create_dir_all(&target).unwrap();
    let unmounted = h
        .node
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: "pvc-s".into(),
            volume_path: target.to_string_lossy().into_owned(),
            staging_target_path: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let c = unmounted.volume_condition.unwrap();
    assert!(c.abnormal);
    assert_eq!(c.message, "The volume isn't mounted");
    // No pool holds the id and every pool is usable: the volume does not exist (CSI: NotFound,
    // which csi-sanity checks with an existing path).
    let gone = h
        .node
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: "pvc-never".into(),
            volume_path: target.to_string_lossy().into_owned(),
            staging_target_path: String::new(),
        })
        .await;
    let err = gone.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(err.message().contains("pvc-never"), "{}", err.message());
    let missing = h
        .node
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: "pvc-s".into(),
            volume_path: h.target("nowhere").to_string_lossy().into_owned(),
            staging_target_path: String::new(),
        })
        .await;
    assert_eq!(code(missing), Code::NotFound);
    let invalid = h
        .node
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: "pvc-s".into(),
            volume_path: "relative".into(),
            staging_target_path: String::new(),
        })
        .await;
    assert_eq!(
        code(invalid),
        Code::NotFound,
        "a relative path names no published volume"
    );
    h.stop().await;
}

#[tokio::test]
async fn node_info_and_capabilities() {
    let mut h = Harness::start().await;
    let info = h
        .node
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.node_id, NODE);
    assert_eq!(
        info.accessible_topology
            .unwrap()
            .segments
            .get("topology.hostpath.csi/node")
            .map(String::as_str),
        Some(NODE)
    );
    let caps = h
        .node
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let mut types: Vec<i32> = caps
        .capabilities
        .into_iter()
        .map(|c| match c.r#type.unwrap() {
            csi::node_service_capability::Type::Rpc(r) => r.r#type,
        })
        .collect();
    types.sort();
    use csi::node_service_capability::rpc::Type;
    assert_eq!(
        types,
        vec![
            Type::GetVolumeStats as i32,
            Type::ExpandVolume as i32,
            Type::VolumeCondition as i32
        ]
    );
    let mut grpc = tonic::client::Grpc::new(hpp_csi::client::connect(&h.endpoint).await.unwrap());
    grpc.ready().await.unwrap();
    let r: Result<tonic::Response<()>, tonic::Status> = grpc
        .unary(
            tonic::Request::new(()),
            tonic::codegen::http::uri::PathAndQuery::from_static("/csi.v1.Node/NodeStageVolume"),
            tonic_prost::ProstCodec::default(),
        )
        .await;
    assert_eq!(r.unwrap_err().code(), Code::Unimplemented);
    h.stop().await;
}

fn mount_flags_at(target: &std::path::Path) -> hpp_csi::mountinfo::PerMountFlags {
    hpp_csi::mountinfo::MountTable::read()
        .unwrap()
        .mount_at(target)
        .unwrap()
        .flags()
}

#[tokio::test]
async fn read_only_publish_keeps_the_pools_nosuid_nodev_noexec() {
    let mut h = Harness::with(|root, b| {
        let pool = root.join("pools/restricted");
        std::fs::create_dir_all(&pool).unwrap();
        let flags =
            rustix::mount::MountFlags::NOSUID | rustix::mount::MountFlags::NODEV | rustix::mount::MountFlags::NOEXEC;
        rustix::mount::mount("tmpfs", &pool, "tmpfs", flags, c"size=16m").unwrap();
        b.pool(hpp_csi::PoolConfig::new("legacy", pool))
    })
    .await;
    h.create("pvc-r").await;
    let target = h.target("r");
    h.publish("pvc-r", &target, true).await.unwrap();
    let f = mount_flags_at(&target);
    assert!(f.read_only && f.nosuid && f.nodev && f.noexec, "{f:?}");
    h.unpublish("pvc-r", &target).await.unwrap();
    h.stop().await;
}

#[tokio::test]
async fn a_read_only_publish_over_a_writable_bind_is_incompatible_or_corrected_before_5_12() {
    let mut h = Harness::start().await;
    h.create("pvc-crash-ro").await;
    let target = h.target("crash-ro");
    std::fs::create_dir_all(&target).unwrap();
    // The volume bound writable at the target: published writable, or (before 5.12 only) a
    // read-only publish that crashed between its bind and its remount.
    rustix::mount::mount_bind(h.pool_path().join("pvc-crash-ro"), &target).unwrap();
    assert!(!mount_flags_at(&target).read_only);
    if hpp_csi::ops::mount::binds_are_atomic() {
        // Binds are built with their flags, so this one was published writable: CSI's
        // ALREADY_EXISTS for an incompatible readonly flag, and the mount is left as it is.
        let err = h.publish("pvc-crash-ro", &target, true).await.unwrap_err();
        assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
        assert!(!mount_flags_at(&target).read_only);
        // The writable publish it matches is still idempotent.
        h.publish("pvc-crash-ro", &target, false).await.unwrap();
    } else {
        h.publish("pvc-crash-ro", &target, true).await.unwrap();
        assert!(mount_flags_at(&target).read_only, "the retry made it read-only");
        let err = std::fs::write(target.join("g"), b"nope").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(30));
    }
    h.unpublish("pvc-crash-ro", &target).await.unwrap();
    h.stop().await;
}

#[tokio::test]
async fn unpublish_leaves_mounts_that_are_not_the_volume() {
    let mut h = Harness::start().await;
    h.create("pvc-u").await;
    let target = h.target("foreign");
    std::fs::create_dir_all(&target).unwrap();
    rustix::mount::mount(
        "tmpfs",
        &target,
        "tmpfs",
        rustix::mount::MountFlags::empty(),
        c"size=1m",
    )
    .unwrap();
    assert_eq!(code(h.unpublish("pvc-u", &target).await), Code::FailedPrecondition);
    assert!(is_mount_point(&target), "someone else's mount stays");
    rustix::mount::unmount(&target, rustix::mount::UnmountFlags::empty()).unwrap();
    // Our bind with a foreign mount stacked on top: the foreign one is not touched either.
    h.publish("pvc-u", &target, false).await.unwrap();
    rustix::mount::mount(
        "tmpfs",
        &target,
        "tmpfs",
        rustix::mount::MountFlags::empty(),
        c"size=1m",
    )
    .unwrap();
    assert_eq!(code(h.unpublish("pvc-u", &target).await), Code::FailedPrecondition);
    rustix::mount::unmount(&target, rustix::mount::UnmountFlags::empty()).unwrap();
    h.unpublish("pvc-u", &target).await.unwrap();
    assert!(!target.exists());
    h.stop().await;
}

#[tokio::test]
async fn unpublish_of_one_volume_leaves_a_bind_of_another_volume() {
    let mut h = Harness::start().await;
    h.create("pvc-a").await;
    h.create("pvc-b").await;
    let target = h.target("other");
    // Volume b is published here; an unpublish that names volume a must not take it.
    h.publish("pvc-b", &target, false).await.unwrap();
    assert_eq!(code(h.unpublish("pvc-a", &target).await), Code::FailedPrecondition);
    assert!(is_mount_point(&target), "volume b's bind stays");
    h.unpublish("pvc-b", &target).await.unwrap();
    assert!(!target.exists());
    h.stop().await;
}

#[tokio::test]
async fn ephemeral_volumes_follow_the_pools_switch_and_cap() {
    let mut h = Harness::with(|root, b| {
        b.pool(legacy_pool(root).ephemeral(true, Some(1 << 20)))
            .pool(hpp_csi::PoolConfig::new("closed", root.join("pools/closed")).ephemeral(false, None))
    })
    .await;
    let eph = |pool: &str, size: Option<&str>, target: &std::path::Path| {
        let mut req = publish_req("csi-eph", target, false);
        req.volume_context = HashMap::from([
            ("csi.storage.k8s.io/ephemeral".into(), "true".into()),
            ("storagePool".into(), pool.into()),
        ]);
        if let Some(s) = size {
            req.volume_context.insert("size".into(), s.into());
        }
        req
    };
    let target = h.target("eph");
    let closed = h.node.node_publish_volume(eph("closed", None, &target)).await;
    assert_eq!(code(closed), Code::FailedPrecondition);
    let big = h
        .node
        .node_publish_volume(eph("legacy", Some("2097152"), &target))
        .await;
    assert_eq!(code(big), Code::OutOfRange);
    // Sizes are quantities, like the CR's ephemeral.maxSize.
    let big = h.node.node_publish_volume(eph("legacy", Some("2Mi"), &target)).await;
    assert_eq!(code(big), Code::OutOfRange);
    let garbage = h.node.node_publish_volume(eph("legacy", Some("huge"), &target)).await;
    assert_eq!(code(garbage), Code::InvalidArgument);
    assert!(
        !h.pool_path().join("csi-eph").exists(),
        "nothing created for refused requests"
    );
    h.node
        .node_publish_volume(eph("legacy", Some("4Ki"), &target))
        .await
        .unwrap();
    assert!(h.pool_path().join(".hpp-ephemeral/csi-eph").is_dir(), "marked");
    h.unpublish("csi-eph", &target).await.unwrap();
    assert!(!h.pool_path().join("csi-eph").exists(), "removed with its mount");
    // A persistent volume with the same id is never marked ephemeral (nor deleted).
    h.create("csi-eph").await;
    h.node.node_publish_volume(eph("legacy", None, &target)).await.unwrap();
    h.unpublish("csi-eph", &target).await.unwrap();
    assert!(h.pool_path().join("csi-eph").is_dir(), "persistent volume kept");
    h.stop().await;
}
