//! Expansion in node mode (`ExpansionMode::Node`, `--expansion=node`): the mode of a DaemonSet
//! of node-local drivers, where the csi-resizer next to one driver cannot know which node holds
//! a volume. The controller offers neither expansion nor modification; NodeExpandVolume on the
//! node where the volume is published raises the limit itself.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

mod common;

use std::sync::Arc;

use common::fake_quota::FakeQuota;
use common::*;
use hpp_csi::ExpansionMode;
use hpp_csi::csi;
use hpp_csi::csi::controller_service_capability::rpc::Type as Ctl;
use tonic::Code;

const G: u64 = 4096;

/// The default pool enforced by a fake backend, promising `overcommit_percent` % of the
/// filesystem, in expansion `mode`.
async fn harness(mode: ExpansionMode, overcommit_percent: u32) -> (Harness, Arc<FakeQuota>) {
    let q = Arc::new(FakeQuota::new(G));
    let b = q.clone();
    let h = Harness::with(move |root, builder| {
        let mut pool = legacy_pool(root);
        pool.overcommit_percent = overcommit_percent;
        builder.pool(pool).quota_backend("legacy", b).expansion(mode)
    })
    .await;
    (h, q)
}

fn recorded(h: &Harness, id: &str) -> Option<u64> {
    let mut buf = [0u8; 32];
    let n = rustix::fs::getxattr(h.pool_path().join(id), "trusted.hpp.capacity", &mut buf[..]).ok()?;
    std::str::from_utf8(&buf[..n]).ok()?.parse().ok()
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

async fn controller_caps(h: &mut Harness) -> Vec<i32> {
    h.controller
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities
        .iter()
        .filter_map(|c| {
            c.r#type.as_ref().map(|t| match t {
                csi::controller_service_capability::Type::Rpc(r) => r.r#type,
            })
        })
        .collect()
}

async fn node_expands(h: &mut Harness) -> bool {
    h.node
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities
        .iter()
        .any(|c| {
            matches!(&c.r#type, Some(csi::node_service_capability::Type::Rpc(r))
                if r.r#type == csi::node_service_capability::rpc::Type::ExpandVolume as i32)
        })
}

async fn online_expansion(h: &mut Harness) -> bool {
    h.identity
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities
        .iter()
        .any(|c| {
            matches!(&c.r#type, Some(csi::plugin_capability::Type::VolumeExpansion(e))
                if e.r#type == csi::plugin_capability::volume_expansion::Type::Online as i32)
        })
}

#[tokio::test]
async fn capabilities_follow_the_expansion_mode() {
    let (mut h, _q) = harness(ExpansionMode::Controller, 100).await;
    let caps = controller_caps(&mut h).await;
    assert!(caps.contains(&(Ctl::ExpandVolume as i32)), "controller mode: {caps:?}");
    assert!(caps.contains(&(Ctl::ModifyVolume as i32)), "controller mode: {caps:?}");
    assert!(node_expands(&mut h).await);
    assert!(online_expansion(&mut h).await);
    h.stop().await;

    let (mut h, _q) = harness(ExpansionMode::Node, 100).await;
    let caps = controller_caps(&mut h).await;
    assert!(!caps.contains(&(Ctl::ExpandVolume as i32)), "node mode: {caps:?}");
    assert!(!caps.contains(&(Ctl::ModifyVolume as i32)), "node mode: {caps:?}");
    assert!(caps.contains(&(Ctl::CreateDeleteVolume as i32)));
    assert!(node_expands(&mut h).await);
    assert!(online_expansion(&mut h).await);
    h.stop().await;
}

#[tokio::test]
async fn node_expansion_raises_the_limit_of_a_published_volume() {
    let (mut h, q) = harness(ExpansionMode::Node, 100).await;
    h.controller
        .create_volume(sized_req("pvc-a", G as i64, 0))
        .await
        .unwrap();
    let target = h.target("a");
    h.publish("pvc-a", &target, false).await.unwrap();
    let r = h
        .node
        .node_expand_volume(node_expand_req("pvc-a", &target, 5000))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.capacity_bytes, 2 * G as i64, "rounded up to the granularity");
    assert_eq!(q.limit("pvc-a"), Some(2 * G), "the limit is raised on the node");
    assert_eq!(recorded(&h, "pvc-a"), Some(2 * G));
    // Idempotent, and never a shrink.
    for required in [5000, 2 * G as i64, 1] {
        let r = h
            .node
            .node_expand_volume(node_expand_req("pvc-a", &target, required))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.capacity_bytes, 2 * G as i64);
    }
    assert_eq!(q.limit("pvc-a"), Some(2 * G));
    // Not where the volume is published: nothing is raised.
    assert_eq!(
        code(
            h.node
                .node_expand_volume(node_expand_req("pvc-a", &h.target("nowhere"), 4 * G as i64))
                .await
        ),
        Code::NotFound
    );
    assert_eq!(q.limit("pvc-a"), Some(2 * G));
    h.unpublish("pvc-a", &target).await.unwrap();
    h.stop().await;
}

#[tokio::test]
async fn node_expansion_is_bounded_by_the_ledger() {
    let (mut h, q) = harness(ExpansionMode::Node, 1).await;
    let promisable = fs_total(&h.pool_path()) / 100;
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
    let fits = (promisable - G) - (promisable - G) % G;
    let r = h
        .node
        .node_expand_volume(node_expand_req("pvc-a", &target, (fits + G) as i64))
        .await;
    assert_eq!(code(r), Code::ResourceExhausted);
    assert_eq!(q.limit("pvc-a").unwrap_or(G), G, "the backend was not asked");
    assert_eq!(recorded(&h, "pvc-a"), Some(G));
    let r = h
        .node
        .node_expand_volume(node_expand_req("pvc-a", &target, fits as i64))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.capacity_bytes as u64, fits);
    assert_eq!(q.limit("pvc-a"), Some(fits));
    h.unpublish("pvc-a", &target).await.unwrap();
    h.stop().await;
}

#[tokio::test]
async fn controller_mode_node_expansion_leaves_the_limit_to_the_controller() {
    let (mut h, q) = harness(ExpansionMode::Controller, 100).await;
    h.controller
        .create_volume(sized_req("pvc-a", G as i64, 0))
        .await
        .unwrap();
    let target = h.target("a");
    h.publish("pvc-a", &target, false).await.unwrap();
    let r = h
        .node
        .node_expand_volume(node_expand_req("pvc-a", &target, 2 * G as i64))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.capacity_bytes, G as i64, "the recorded size");
    assert_eq!(q.limit("pvc-a").unwrap_or(G), G, "the backend was not asked");
    assert_eq!(recorded(&h, "pvc-a"), Some(G));
    h.unpublish("pvc-a", &target).await.unwrap();
    h.stop().await;
}
