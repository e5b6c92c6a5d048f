//! The legacy provisioner on a node-local btrfs base with the btrfs quota backend: the volume
//! is a subvolume limited to the claim's request, and deleting the PV destroys it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use hpp_testkit::loopfs;

use std::os::fd::AsFd;
use std::sync::Arc;

use common::*;
use hpp_fs::quota::QuotaBackend;
use hpp_legacy::Mode;
use hpp_legacy::fsops::Removed;
use hpp_legacy::provisioner::{ClaimOutcome, VolumeOutcome};
use hpp_testkit::FakeApiServer;

const NAME: &str = "hostpath";

#[tokio::test]
async fn a_btrfs_base_gets_subvolumes_limited_to_the_request() {
    let Some(fs) = loopfs::LoopFs::new("btrfs", 256, "") else {
        return;
    };
    let base = fs.path().to_path_buf();
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
