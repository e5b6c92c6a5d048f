//! Sized volumes through the CSI API on an enforcing pool: rounding of capacity_range, the
//! capacity ledger behind GetCapacity, ResourceExhausted beyond it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

mod common;

use common::*;
use hpp_csi::csi;
use tonic::Code;

const G: u64 = 4096;

fn recorded(h: &Harness, id: &str) -> Option<u64> {
    let mut buf = [0u8; 32];
    let n = rustix::fs::getxattr(h.pool_path().join(id), "trusted.hpp.capacity", &mut buf[..]).ok()?;
    std::str::from_utf8(&buf[..n]).ok()?.parse().ok()
}

#[tokio::test]
async fn requested_sizes_are_rounded_up_to_the_backend_granularity() {
    let (mut h, _q) = Harness::enforcing(G, 100).await;
    let v = h
        .controller
        .create_volume(sized_req("pvc-a", 1000, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        v.volume.unwrap().capacity_bytes,
        G as i64,
        "the real, rounded size is returned"
    );
    assert_eq!(
        recorded(&h, "pvc-a"),
        Some(G),
        "the rounded size is what the volume records"
    );
    // A retry with the same range is the same volume.
    let again = h
        .controller
        .create_volume(sized_req("pvc-a", 1000, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.volume.unwrap().capacity_bytes, G as i64);
    // Rounding up would pass the limit, and no multiple of the granularity fits: OutOfRange.
    let r = h.controller.create_volume(sized_req("pvc-b", 5000, 6000)).await;
    assert_eq!(code(r), Code::OutOfRange);
    assert!(!h.pool_path().join("pvc-b").exists());
    // A smaller multiple that still covers the requirement is taken instead.
    let v = h
        .controller
        .create_volume(sized_req("pvc-c", 5000, 10_000))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(v.volume.unwrap().capacity_bytes, 2 * G as i64);
    // Nothing required: the documented 1 GiB default, capped by the limit.
    let v = h
        .controller
        .create_volume(sized_req("pvc-d", 0, 3 * G as i64))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(v.volume.unwrap().capacity_bytes, 3 * G as i64);
    if fs_total(&h.pool_path()) >= 1 << 30 {
        let v = h
            .controller
            .create_volume(create_req("pvc-e"))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(v.volume.unwrap().capacity_bytes, 1 << 30);
    } else {
        eprintln!("skipping the 1 GiB default: the test filesystem is smaller than 1 GiB");
    }
    h.stop().await;
}

#[tokio::test]
async fn unlimited_pools_answer_as_before() {
    let mut h = Harness::start().await;
    let v = h
        .controller
        .create_volume(sized_req("pvc-a", 1000, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(v.volume.unwrap().capacity_bytes, 1000, "no rounding without a backend");
    let cap = h
        .controller
        .get_capacity(csi::GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cap.maximum_volume_size, Some(fs_total(&h.pool_path()) as i64));
    h.stop().await;
}

async fn available(h: &mut Harness) -> (i64, Option<i64>) {
    let cap = h
        .controller
        .get_capacity(csi::GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner();
    (cap.available_capacity, cap.maximum_volume_size)
}

#[tokio::test]
async fn get_capacity_reports_what_can_still_be_promised() {
    // 1 % of the filesystem may be promised: far below its free space, so the ledger decides.
    let (mut h, _q) = Harness::enforcing(G, 1).await;
    let promisable = fs_total(&h.pool_path()) / 100;
    let (avail, max) = available(&mut h).await;
    assert_eq!(avail as u64, promisable);
    assert_eq!(max, Some((promisable - promisable % G) as i64));

    h.controller
        .create_volume(sized_req("pvc-a", 10 * G as i64, 0))
        .await
        .unwrap();
    let (avail, _) = available(&mut h).await;
    assert_eq!(avail as u64, promisable - 10 * G, "the new volume's size is promised");

    // Beyond what is left: ResourceExhausted, and nothing is made.
    let too_big = (promisable - 10 * G + 1) as i64;
    let r = h.controller.create_volume(sized_req("pvc-b", too_big, 0)).await;
    assert_eq!(code(r), Code::ResourceExhausted);
    assert!(!h.pool_path().join("pvc-b").exists());
    // A retry of an existing volume is not judged by the budget.
    h.controller
        .create_volume(sized_req("pvc-a", 10 * G as i64, 0))
        .await
        .unwrap();

    // The ledger is the volumes on disk: deleting gives the bytes back.
    h.delete("pvc-a").await.unwrap();
    let (avail, _) = available(&mut h).await;
    assert_eq!(avail as u64, promisable);
    h.stop().await;
}

#[tokio::test]
async fn get_and_list_report_the_volume_size_on_enforcing_pools() {
    let (mut h, _q) = Harness::enforcing(G, 100).await;
    h.controller
        .create_volume(sized_req("pvc-a", 3 * G as i64, 0))
        .await
        .unwrap();
    let got = h
        .controller
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: "pvc-a".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.volume.unwrap().capacity_bytes, 3 * G as i64);
    let listed = h
        .controller
        .list_volumes(csi::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.entries[0].volume.as_ref().unwrap().capacity_bytes, 3 * G as i64);
    h.stop().await;
}

#[tokio::test]
async fn concurrent_creates_never_promise_the_same_bytes_twice() {
    let (h, _q) = Harness::enforcing(G, 1).await;
    let promisable = fs_total(&h.pool_path()) / 100;
    // Each fits alone; no two fit together.
    let each = ((promisable / 2 + G) - (promisable / 2 + G) % G) as i64;
    let attempts = (0..8).map(|i| {
        let mut c = h.controller.clone();
        async move { c.create_volume(sized_req(&format!("pvc-{i}"), each, 0)).await }
    });
    let results = futures::future::join_all(attempts).await;
    let made = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(made, 1, "exactly one of the racing creates gets the bytes");
    for r in results.into_iter().filter_map(Result::err) {
        assert_eq!(r.code(), Code::ResourceExhausted, "{r:?}");
    }
    h.stop().await;
}

/// The pool gauges agree with GetCapacity: a fully promised pool shows 0 available (what the
/// scheduler sees in CSIStorageCapacity) while its filesystem still has free bytes, and the
/// promised and promisable bytes behind that answer.
#[tokio::test]
async fn the_available_gauge_is_what_get_capacity_answers_on_a_fully_promised_pool() {
    let (mut h, _q) = Harness::enforcing(1, 1).await;
    let promisable = fs_total(&h.pool_path()) / 100;
    h.controller
        .create_volume(sized_req("pvc-all", promisable as i64, 0))
        .await
        .unwrap();
    let (avail, _) = available(&mut h).await;
    assert_eq!(avail, 0, "fully promised");
    let state = h.state.clone();
    tokio::task::spawn_blocking(move || state.pools_report()).await.unwrap();
    let text = h.metrics_text();
    for line in [
        "hpp_pool_available_bytes{pool=\"legacy\"} 0".to_owned(),
        format!("hpp_pool_promised_bytes{{pool=\"legacy\"}} {promisable}"),
        format!("hpp_pool_promisable_bytes{{pool=\"legacy\"}} {promisable}"),
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing from\n{text}");
    }
    let free: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("hpp_pool_free_bytes{pool=\"legacy\"} "))
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(free > 0, "bytes are still free on the filesystem");
    h.stop().await;
}
