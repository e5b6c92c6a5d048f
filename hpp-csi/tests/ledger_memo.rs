//! The capacity ledger's memo: scanned once, kept current by the driver's own creations,
//! expansions and deletions, and scanned again when the pool directory changes behind the
//! driver's back. Scans are counted by the ledger itself (no timing).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

mod common;

use common::*;
use hpp_csi::csi;

const G: u64 = 4096;

async fn available(h: &mut Harness) -> u64 {
    h.controller
        .get_capacity(csi::GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner()
        .available_capacity as u64
}

fn record(h: &Harness, id: &str, bytes: u64) {
    rustix::fs::setxattr(
        h.pool_path().join(id),
        "trusted.hpp.capacity",
        bytes.to_string().as_bytes(),
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
}

#[tokio::test]
async fn own_changes_do_not_rescan_the_pool() {
    const N: u64 = 20;
    let (mut h, _q) = Harness::enforcing(G, 1).await;
    let promisable = fs_total(&h.pool_path()) / 100;
    assert_eq!(available(&mut h).await, promisable);
    let before = h.state.ledger.scans();
    for i in 0..N {
        h.controller
            .create_volume(sized_req(&format!("pvc-{i}"), G as i64, 0))
            .await
            .unwrap();
    }
    h.controller
        .controller_expand_volume(csi::ControllerExpandVolumeRequest {
            volume_id: "pvc-0".into(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 2 * G as i64,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    h.delete("pvc-1").await.unwrap();
    // N - 1 volumes of G, one of them grown by G.
    assert_eq!(available(&mut h).await, promisable - N * G);
    let scans = h.state.ledger.scans() - before;
    assert!(scans < N / 2, "{scans} full scans for {N} creations");
    h.stop().await;
}

#[tokio::test]
async fn changes_behind_the_drivers_back_are_seen_at_the_next_call() {
    let (mut h, _q) = Harness::enforcing(G, 1).await;
    let promisable = fs_total(&h.pool_path()) / 100;
    h.controller
        .create_volume(sized_req("pvc-a", G as i64, 0))
        .await
        .unwrap();
    assert_eq!(available(&mut h).await, promisable - G);
    let scans = h.state.ledger.scans();
    assert_eq!(available(&mut h).await, promisable - G, "unchanged pool");
    assert_eq!(h.state.ledger.scans(), scans, "an unchanged pool is not scanned again");

    // A volume directory with a recorded size appears, made by someone else.
    std::fs::create_dir(h.pool_path().join("pvc-foreign")).unwrap();
    record(&h, "pvc-foreign", 5 * G);
    assert_eq!(available(&mut h).await, promisable - 6 * G);

    // Someone removes a volume by hand.
    std::fs::remove_dir(h.pool_path().join("pvc-foreign")).unwrap();
    assert_eq!(available(&mut h).await, promisable - G);
    std::fs::remove_dir(h.pool_path().join("pvc-a")).unwrap();
    assert_eq!(available(&mut h).await, promisable);
    h.stop().await;
}

#[tokio::test]
async fn a_failed_operation_drops_the_memo() {
    let (mut h, q) = Harness::enforcing(G, 1).await;
    let promisable = fs_total(&h.pool_path()) / 100;
    h.controller
        .create_volume(sized_req("pvc-a", G as i64, 0))
        .await
        .unwrap();
    assert_eq!(available(&mut h).await, promisable - G);
    let scans = h.state.ledger.scans();
    // The backend fails halfway through an expansion: what the disk holds now is not known
    // to the memo, so the next call reads the disk again.
    q.fail_next_set_limit.store(true, std::sync::atomic::Ordering::SeqCst);
    let r = h
        .controller
        .controller_expand_volume(csi::ControllerExpandVolumeRequest {
            volume_id: "pvc-a".into(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 4 * G as i64,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await;
    assert!(r.is_err());
    assert_eq!(available(&mut h).await, promisable - G);
    assert_eq!(h.state.ledger.scans(), scans + 1);
    h.stop().await;
}

#[tokio::test]
async fn a_deletion_does_not_hide_an_earlier_change_behind_the_drivers_back() {
    let (mut h, _q) = Harness::enforcing(G, 1).await;
    let promisable = fs_total(&h.pool_path()) / 100;
    h.controller
        .create_volume(sized_req("pvc-a", G as i64, 0))
        .await
        .unwrap();
    assert_eq!(available(&mut h).await, promisable - G);
    // Someone adds a volume by hand, then the driver deletes one of its own before any
    // capacity call: the foreign one still counts.
    std::fs::create_dir(h.pool_path().join("pvc-foreign")).unwrap();
    record(&h, "pvc-foreign", 5 * G);
    h.delete("pvc-a").await.unwrap();
    assert_eq!(available(&mut h).await, promisable - 5 * G);
    h.stop().await;
}
