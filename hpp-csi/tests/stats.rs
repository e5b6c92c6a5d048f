//! NodeGetVolumeStats from the quota backend: O(1) numbers against the volume's limit instead
//! of a walk of the tree.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

mod common;

use common::*;
use hpp_csi::csi;

fn by_unit(r: &csi::NodeGetVolumeStatsResponse, unit: csi::volume_usage::Unit) -> Option<csi::VolumeUsage> {
    r.usage.iter().find(|u| u.unit == unit as i32).copied()
}

#[tokio::test]
async fn stats_come_from_the_backend_when_it_keeps_them() {
    let (mut h, q) = Harness::enforcing(4096, 100).await;
    h.controller
        .create_volume(sized_req("pvc-a", 1 << 20, 0))
        .await
        .unwrap();
    let target = h.target("a");
    h.publish("pvc-a", &target, false).await.unwrap();
    // Data the walk would count; the backend's numbers win.
    std::fs::write(target.join("blob"), vec![1u8; 256 * 1024]).unwrap();
    let pool = std::fs::File::open(h.pool_path()).unwrap();
    hpp_fs::quota::QuotaBackend::set_limit(q.as_ref(), std::os::fd::AsFd::as_fd(&pool), "pvc-a", 1 << 20).unwrap();
    let r = h
        .node
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: "pvc-a".into(),
            volume_path: target.to_string_lossy().into_owned(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let bytes = by_unit(&r, csi::volume_usage::Unit::Bytes).unwrap();
    assert_eq!(bytes.used, q.used as i64);
    assert_eq!(bytes.total, 1 << 20, "measured against the volume's limit");
    assert_eq!(bytes.available, (1 << 20) - q.used as i64);
    let inodes = by_unit(&r, csi::volume_usage::Unit::Inodes).unwrap();
    assert_eq!(inodes.used, 3);
    assert!(!r.volume_condition.unwrap().abnormal);
    h.unpublish("pvc-a", &target).await.unwrap();
    h.stop().await;
}
