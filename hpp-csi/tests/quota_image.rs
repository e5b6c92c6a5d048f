//! A `quota: image` pool through the real gRPC services: CreateVolume makes an image of the
//! requested size, NodePublish loop-mounts it (df in the pod shows the volume), writes past
//! the size fail, DeleteVolume refuses while the image is mounted, NodeUnpublish frees it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use hpp_api::quota::QuotaMode;
use std::io::Write;
use tonic::Code;

const MIB: u64 = 1 << 20;

#[tokio::test]
async fn image_volumes_are_loop_mounted_limited_and_freed() {
    if !rustix::process::geteuid().is_root() || !std::path::Path::new("/dev/loop-control").exists() {
        eprintln!("skipped: needs root and loop devices");
        return;
    }
    if std::process::Command::new("mkfs.ext4").arg("-V").output().is_err() {
        eprintln!("skipped: mkfs.ext4 is not installed");
        return;
    }
    let mut h = Harness::with(|root, b| b.pool(legacy_pool(root).quota(QuotaMode::Image, 100))).await;
    let mut req = create_req("pvc-img");
    req.capacity_range = Some(hpp_csi::csi::CapacityRange {
        required_bytes: 16 * MIB as i64,
        limit_bytes: 0,
    });
    h.controller.create_volume(req).await.unwrap();
    assert!(h.pool_path().join("pvc-img/disk.img").is_file());

    let target = h.target("img");
    struct Cleanup(std::path::PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = rustix::mount::unmount(&self.0, rustix::mount::UnmountFlags::DETACH);
        }
    }
    let _cleanup = Cleanup(target.clone());
    h.publish("pvc-img", &target, false).await.unwrap();
    h.publish("pvc-img", &target, false).await.unwrap();
    let st = rustix::fs::statvfs(&target).unwrap();
    assert!(st.f_blocks * st.f_frsize <= 16 * MIB, "df shows the volume");
    let mut f = std::fs::File::create(target.join("big")).unwrap();
    let chunk = vec![3u8; MIB as usize];
    let err = (0..32)
        .try_for_each(|_| f.write_all(&chunk))
        .and_then(|()| f.sync_all())
        .unwrap_err();
    assert_eq!(rustix::io::Errno::from_io_error(&err), Some(rustix::io::Errno::NOSPC));
    drop(f);

    let delete = hpp_csi::csi::DeleteVolumeRequest {
        volume_id: "pvc-img".into(),
        secrets: Default::default(),
    };
    assert_eq!(
        code(h.controller.delete_volume(delete.clone()).await),
        Code::FailedPrecondition
    );

    h.unpublish("pvc-img", &target).await.unwrap();
    assert!(!target.exists());
    // The loop device goes with the unmount (autoclear, done by the kernel right after).
    let mut deleted = Err(tonic::Status::internal("not tried"));
    for _ in 0..100 {
        deleted = h.controller.delete_volume(delete.clone()).await.map(|_| ());
        if deleted.is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    deleted.unwrap();
    assert!(!h.pool_path().join("pvc-img").exists());
    h.stop().await;
}
