//! GetSnapshot: the same Snapshot message ListSnapshots gives, NotFound for unknown ids, and
//! the source's size as size_bytes where the pool enforces sizes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

mod common;

use common::*;
use hpp_csi::csi;
use tonic::Code;

fn snap_req(src: &str, name: &str) -> csi::CreateSnapshotRequest {
    csi::CreateSnapshotRequest {
        source_volume_id: src.into(),
        name: name.into(),
        ..Default::default()
    }
}

fn get(id: &str) -> csi::GetSnapshotRequest {
    csi::GetSnapshotRequest {
        snapshot_id: id.into(),
        ..Default::default()
    }
}

async fn listed(h: &mut Harness, id: &str) -> csi::Snapshot {
    h.controller
        .list_snapshots(csi::ListSnapshotsRequest {
            snapshot_id: id.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .entries
        .remove(0)
        .snapshot
        .unwrap()
}

#[tokio::test]
async fn get_snapshot_matches_list_snapshots() {
    let mut h = Harness::start().await;
    h.create("pvc-src").await;
    let made = h
        .controller
        .create_snapshot(snap_req("pvc-src", "snap-1"))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    let got = h
        .controller
        .get_snapshot(get("snap-1"))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(got, listed(&mut h, "snap-1").await);
    assert_eq!(got, made);
    assert_eq!(got.size_bytes, 0, "unknown on a pool that enforces nothing, as before");
    assert_eq!(
        code(h.controller.get_snapshot(get("snap-missing")).await),
        Code::NotFound
    );
    assert_eq!(code(h.controller.get_snapshot(get("")).await), Code::InvalidArgument);
    h.stop().await;
}

#[tokio::test]
async fn snapshot_size_is_the_source_capacity_on_enforcing_pools() {
    let (mut h, _q) = Harness::enforcing(4096, 100).await;
    h.controller
        .create_volume(sized_req("pvc-src", 10_000, 0))
        .await
        .unwrap();
    h.controller
        .create_snapshot(snap_req("pvc-src", "snap-1"))
        .await
        .unwrap();
    let got = h
        .controller
        .get_snapshot(get("snap-1"))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(got.size_bytes, 3 * 4096);
    assert_eq!(listed(&mut h, "snap-1").await.size_bytes, 3 * 4096);
    h.stop().await;
}
