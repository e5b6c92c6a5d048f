//! ControllerModifyVolume (VolumeAttributesClass): documented keys only, refused by name where
//! the pool's backend cannot apply them, applied while the volume is published.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

mod common;

use std::collections::HashMap;

use common::*;
use hpp_csi::csi;
use tonic::Code;

fn modify_req(id: &str, kv: &[(&str, &str)]) -> csi::ControllerModifyVolumeRequest {
    csi::ControllerModifyVolumeRequest {
        volume_id: id.into(),
        mutable_parameters: kv.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        ..Default::default()
    }
}

#[tokio::test]
async fn modify_applies_supported_keys_while_published() {
    let (mut h, q) = Harness::enforcing(4096, 100).await;
    h.create("pvc-a").await;
    let target = h.target("a");
    h.publish("pvc-a", &target, false).await.unwrap();
    h.controller
        .controller_modify_volume(modify_req("pvc-a", &[("inodeLimit", "1000")]))
        .await
        .unwrap();
    let tuned = q.tuned.lock().unwrap().get("pvc-a").copied().unwrap();
    assert_eq!(tuned.inode_limit, Some(1000));
    // Nothing to change is success.
    h.controller
        .controller_modify_volume(modify_req("pvc-a", &[]))
        .await
        .unwrap();
    h.unpublish("pvc-a", &target).await.unwrap();
    h.stop().await;
}

#[tokio::test]
async fn modify_refuses_unknown_and_unsupported_keys_by_name() {
    let (mut h, q) = Harness::enforcing(4096, 100).await;
    h.create("pvc-a").await;
    let e = h
        .controller
        .controller_modify_volume(modify_req("pvc-a", &[("iops", "5")]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("iops"), "{}", e.message());
    let e = h
        .controller
        .controller_modify_volume(modify_req("pvc-a", &[("compression", "zstd")]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("compression") && e.message().contains("fake"),
        "{}",
        e.message()
    );
    let r = h
        .controller
        .controller_modify_volume(modify_req("pvc-a", &[("inodeLimit", "many")]))
        .await;
    assert_eq!(code(r), Code::InvalidArgument);
    assert!(q.tuned.lock().unwrap().is_empty(), "nothing was applied");
    let r = h
        .controller
        .controller_modify_volume(modify_req("pvc-missing", &[("inodeLimit", "1")]))
        .await;
    assert_eq!(code(r), Code::NotFound);
    assert_eq!(
        code(h.controller.controller_modify_volume(modify_req("", &[])).await),
        Code::InvalidArgument
    );
    h.stop().await;
}

#[tokio::test]
async fn create_applies_the_class_and_unlimited_pools_refuse_it() {
    let (mut h, q) = Harness::enforcing(4096, 100).await;
    let mut req = sized_req("pvc-a", 4096, 0);
    req.mutable_parameters = HashMap::from([("inodeLimit".to_owned(), "7".to_owned())]);
    h.controller.create_volume(req).await.unwrap();
    assert_eq!(
        q.tuned.lock().unwrap().get("pvc-a").and_then(|t| t.inode_limit),
        Some(7)
    );
    h.stop().await;

    let mut h = Harness::start().await;
    h.create("pvc-b").await;
    let e = h
        .controller
        .controller_modify_volume(modify_req("pvc-b", &[("inodeLimit", "1")]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("none"), "{}", e.message());
    let mut req = sized_req("pvc-c", 4096, 0);
    req.mutable_parameters = HashMap::from([("inodeLimit".to_owned(), "7".to_owned())]);
    assert_eq!(code(h.controller.create_volume(req).await), Code::InvalidArgument);
    assert!(!h.pool_path().join("pvc-c").exists());
    h.stop().await;
}
