//! The legacy provisioner on a node-local btrfs base with the btrfs quota backend: the volume
//! is a subvolume limited to the claim's request, and deleting the PV destroys it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::os::fd::AsFd;
use std::process::Command;
use std::sync::Arc;

use common::*;
use hpp_fs::quota::QuotaBackend;
use hpp_legacy::Mode;
use hpp_legacy::fsops::Removed;
use hpp_legacy::provisioner::{ClaimOutcome, VolumeOutcome};
use hpp_testkit::FakeApiServer;

const NAME: &str = "hostpath";

/// Unmounts the scratch btrfs even when the test fails.
struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[tokio::test]
async fn a_btrfs_base_gets_subvolumes_limited_to_the_request() {
    if !rustix::process::geteuid().is_root() || Command::new("mkfs.btrfs").arg("-V").output().is_err() {
        eprintln!("skipped: needs root and mkfs.btrfs");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("fs.img");
    let base = tmp.path().join("base");
    std::fs::create_dir(&base).unwrap();
    std::fs::File::create(&img).unwrap().set_len(256 << 20).unwrap();
    assert!(
        Command::new("mkfs.btrfs")
            .arg("-q")
            .arg(&img)
            .output()
            .unwrap()
            .status
            .success()
    );
    assert!(
        Command::new("mount")
            .args(["-o", "loop"])
            .arg(&img)
            .arg(&base)
            .status()
            .unwrap()
            .success()
    );
    let _guard = Unmount(base.clone());
    let base_dir = std::fs::File::open(&base).unwrap();
    let backend: Arc<dyn QuotaBackend> = Arc::new(hpp_fs::quota::Btrfs::open(base_dir.as_fd()).unwrap());

    let fake = FakeApiServer::new();
    fake.seed(&storage_class("local", NAME, false, "Delete", &[]));
    fake.seed(&node("box", "box"));
    let mut cfg = config(Mode::SingleNode, Some("box"), Some(&base));
    cfg.quota = Some(backend.clone());
    let scratch = tempfile::tempdir().unwrap();
    let p = provisioner(&fake, cfg, scratch.path());
    let c = seed_claim(
        &fake,
        &claim("apps", "db", "local", NAME, "8Mi", &["ReadWriteOnce"], &[]),
    );
    let name = pv_name(&c);
    assert_eq!(
        p.reconcile_claim(&c).await.unwrap(),
        ClaimOutcome::Provisioned(name.clone())
    );
    let dir = host_path(&pv(&fake, &name));
    let leaf = dir.file_name().unwrap().to_str().unwrap().to_owned();
    assert!(hpp_fs::quota::btrfs::is_subvolume(
        std::fs::File::open(&dir).unwrap().as_fd()
    ));
    let usage = backend.usage(base_dir.as_fd(), &leaf).unwrap().unwrap();
    assert_eq!(usage.limit_bytes, 8 << 20);

    bind(&fake, "apps", "db", &name).await;
    release(&fake, "apps", "db", &name);
    assert_eq!(
        p.reconcile_volume(&pv(&fake, &name)).await.unwrap(),
        VolumeOutcome::Deleted(Removed::Deleted)
    );
    assert!(!dir.exists());
}
