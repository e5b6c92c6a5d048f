//! Online expansion through the CSI API: ControllerExpandVolume on an enforcing pool (rounding,
//! never shrinking, the ledger, the order of limit and record, crash convergence) and
//! NodeExpandVolume on a published volume.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

mod common;

use std::sync::atomic::Ordering;

use common::*;
use hpp_csi::csi;
use tonic::Code;

const G: u64 = 4096;

fn recorded(h: &Harness, id: &str) -> Option<u64> {
    let mut buf = [0u8; 32];
    let n = rustix::fs::getxattr(h.pool_path().join(id), "trusted.hpp.capacity", &mut buf[..]).ok()?;
    std::str::from_utf8(&buf[..n]).ok()?.parse().ok()
}

fn expand_req(id: &str, required: i64, limit: i64) -> csi::ControllerExpandVolumeRequest {
    csi::ControllerExpandVolumeRequest {
        volume_id: id.into(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: required,
            limit_bytes: limit,
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn expansion_is_advertised_online() {
    let mut h = Harness::start().await;
    let caps = h
        .identity
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let online = caps.capabilities.iter().any(|c| {
        matches!(&c.r#type, Some(csi::plugin_capability::Type::VolumeExpansion(e))
            if e.r#type == csi::plugin_capability::volume_expansion::Type::Online as i32)
    });
    assert!(online, "plugin capability VolumeExpansion ONLINE");
    let node = h
        .node
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(node.capabilities.iter().any(|c| matches!(&c.r#type,
        Some(csi::node_service_capability::Type::Rpc(r))
            if r.r#type == csi::node_service_capability::rpc::Type::ExpandVolume as i32)));
    h.stop().await;
}

#[tokio::test]
async fn controller_expansion_validates_its_request() {
    let (mut h, _q) = Harness::enforcing(G, 100).await;
    h.controller
        .create_volume(sized_req("pvc-a", G as i64, 0))
        .await
        .unwrap();
    assert_eq!(
        code(h.controller.controller_expand_volume(expand_req("", 1, 0)).await),
        Code::InvalidArgument
    );
    let mut no_range = expand_req("pvc-a", 1, 0);
    no_range.capacity_range = None;
    assert_eq!(
        code(h.controller.controller_expand_volume(no_range).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(h.controller.controller_expand_volume(expand_req("pvc-a", 10, 5)).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            h.controller
                .controller_expand_volume(expand_req("pvc-missing", 2 * G as i64, 0))
                .await
        ),
        Code::NotFound
    );
    // Rounding up passes the limit: OutOfRange, nothing changes.
    assert_eq!(
        code(
            h.controller
                .controller_expand_volume(expand_req("pvc-a", 5000, 6000))
                .await
        ),
        Code::OutOfRange
    );
    assert_eq!(recorded(&h, "pvc-a"), Some(G));
    h.stop().await;
}

#[tokio::test]
async fn controller_expansion_raises_the_limit_then_the_record_and_never_shrinks() {
    let (mut h, q) = Harness::enforcing(G, 100).await;
    h.controller
        .create_volume(sized_req("pvc-a", G as i64, 0))
        .await
        .unwrap();
    let r = h
        .controller
        .controller_expand_volume(expand_req("pvc-a", 5000, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.capacity_bytes, 2 * G as i64, "rounded up to the granularity");
    assert!(!r.node_expansion_required, "a directory backend needs no node step");
    assert_eq!(q.limit("pvc-a"), Some(2 * G));
    assert_eq!(recorded(&h, "pvc-a"), Some(2 * G));
    // Again, and smaller: success with the current size, never a shrink.
    for required in [5000, 2 * G as i64, 1] {
        let r = h
            .controller
            .controller_expand_volume(expand_req("pvc-a", required, 0))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.capacity_bytes, 2 * G as i64);
    }
    assert_eq!(q.limit("pvc-a"), Some(2 * G));
    // A limit below the size it has cannot be met: OutOfRange, nothing changes.
    let r = h
        .controller
        .controller_expand_volume(expand_req("pvc-a", 1, G as i64))
        .await;
    assert_eq!(code(r), Code::OutOfRange);
    assert_eq!(q.limit("pvc-a"), Some(2 * G));

    // The backend fails: the record is not touched, so the ledger never counts a size the
    // volume does not have.
    q.fail_next_set_limit.store(true, Ordering::SeqCst);
    let r = h
        .controller
        .controller_expand_volume(expand_req("pvc-a", 4 * G as i64, 0))
        .await;
    assert_ne!(code(r), Code::Ok);
    assert_eq!(recorded(&h, "pvc-a"), Some(2 * G));
    h.stop().await;
}

#[tokio::test]
async fn a_crash_between_limit_and_record_converges_on_retry() {
    let (mut h, q) = Harness::enforcing(G, 100).await;
    h.controller
        .create_volume(sized_req("pvc-a", G as i64, 0))
        .await
        .unwrap();
    // The first attempt raised the limit and died before recording the new size.
    let pool = std::fs::File::open(h.pool_path()).unwrap();
    hpp_fs::quota::QuotaBackend::set_limit(q.as_ref(), std::os::fd::AsFd::as_fd(&pool), "pvc-a", 3 * G).unwrap();
    assert_eq!(recorded(&h, "pvc-a"), Some(G));
    // The CO retries: the record still says too small, so the step is done again and recorded.
    let r = h
        .controller
        .controller_expand_volume(expand_req("pvc-a", 3 * G as i64, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.capacity_bytes, 3 * G as i64);
    assert_eq!(q.limit("pvc-a"), Some(3 * G));
    assert_eq!(recorded(&h, "pvc-a"), Some(3 * G));
    h.stop().await;
}

#[tokio::test]
async fn expansion_is_bounded_by_the_ledger() {
    let (mut h, q) = Harness::enforcing(G, 1).await;
    let promisable = fs_total(&h.pool_path()) / 100;
    h.controller
        .create_volume(sized_req("pvc-a", G as i64, 0))
        .await
        .unwrap();
    h.controller
        .create_volume(sized_req("pvc-b", G as i64, 0))
        .await
        .unwrap();
    // pvc-a may grow into everything pvc-b does not hold, not a byte more.
    let fits = (promisable - G) - (promisable - G) % G;
    let r = h
        .controller
        .controller_expand_volume(expand_req("pvc-a", (fits + G) as i64, 0))
        .await;
    assert_eq!(code(r), Code::ResourceExhausted);
    assert_eq!(q.limit("pvc-a").unwrap_or(G), G, "the backend was not asked");
    assert_eq!(recorded(&h, "pvc-a"), Some(G));
    let r = h
        .controller
        .controller_expand_volume(expand_req("pvc-a", fits as i64, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.capacity_bytes as u64, fits);
    h.stop().await;
}

#[tokio::test]
async fn unlimited_pools_expand_by_recording_the_size() {
    let mut h = Harness::start().await;
    h.controller.create_volume(sized_req("pvc-a", 1000, 0)).await.unwrap();
    let r = h
        .controller
        .controller_expand_volume(expand_req("pvc-a", 5000, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.capacity_bytes, 5000);
    assert_eq!(recorded(&h, "pvc-a"), Some(5000));
    h.stop().await;
}

fn node_expand_req(id: &str, path: &std::path::Path, required: i64) -> csi::NodeExpandVolumeRequest {
    csi::NodeExpandVolumeRequest {
        volume_id: id.into(),
        volume_path: path.to_string_lossy().into_owned(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: required,
            limit_bytes: 0,
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn expansion_while_published_and_node_expansion_of_the_publish_target() {
    let (mut h, q) = Harness::enforcing(G, 100).await;
    h.controller
        .create_volume(sized_req("pvc-a", G as i64, 0))
        .await
        .unwrap();
    h.controller
        .create_volume(sized_req("pvc-b", G as i64, 0))
        .await
        .unwrap();
    let target = h.target("a");
    h.publish("pvc-a", &target, false).await.unwrap();
    let r = h
        .controller
        .controller_expand_volume(expand_req("pvc-a", 2 * G as i64, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.capacity_bytes, 2 * G as i64, "online: no unpublish needed");
    assert_eq!(q.limit("pvc-a"), Some(2 * G));
    let n = h
        .node
        .node_expand_volume(node_expand_req("pvc-a", &target, 2 * G as i64))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(n.capacity_bytes, 2 * G as i64);
    // Errors: unknown volume, a path that is not where this volume is published, no path.
    assert_eq!(
        code(
            h.node
                .node_expand_volume(node_expand_req("pvc-missing", &target, 1))
                .await
        ),
        Code::NotFound
    );
    assert_eq!(
        code(h.node.node_expand_volume(node_expand_req("pvc-b", &target, 1)).await),
        Code::NotFound
    );
    assert_eq!(
        code(
            h.node
                .node_expand_volume(node_expand_req("pvc-a", &h.target("nowhere"), 1))
                .await
        ),
        Code::NotFound
    );
    let mut no_path = node_expand_req("pvc-a", &target, 1);
    no_path.volume_path.clear();
    assert_eq!(code(h.node.node_expand_volume(no_path).await), Code::InvalidArgument);
    h.unpublish("pvc-a", &target).await.unwrap();
    h.stop().await;
}
