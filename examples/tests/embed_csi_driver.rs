//! Runs the CSI embedding example in a temporary directory and checks what it left behind.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

#[path = "../embed_csi_driver.rs"]
#[allow(dead_code)]
mod example;

#[tokio::test]
async fn the_example_provisions_snapshots_restores_and_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    example::run(dir.path()).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.path().join("pool/demo-restored/hello.txt")).unwrap(),
        "hello from hpp\n"
    );
    assert!(dir.path().join("snapshots/demo-snap/data/hello.txt").is_file());
    assert!(dir.path().join("snapshots/demo-snap/demo").is_dir());
    assert!(!dir.path().join("csi.sock").exists(), "the server removed its socket");
}
