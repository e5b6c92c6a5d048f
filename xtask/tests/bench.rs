//! `cargo xtask bench` still runs end to end (driver child process, every table) after its move
//! out of hpp-bin: a smoke run with tiny counts; no timing is asserted.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::process::Command;

#[test]
fn bench_runs_and_prints_every_table() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args([
            "bench",
            "--ops",
            "8",
            "--mount-ops",
            "2",
            "--rss-volumes",
            "20",
            "--dir",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for needle in [
        "hpp-bench: dir",
        "CreateVolume",
        "DeleteVolume",
        "GetCapacity",
        "gRPC-over-unix-socket floor",
        "created 20 volumes",
        "driver RSS:",
    ] {
        assert!(stdout.contains(needle), "{needle} missing from\n{stdout}");
    }
    if rustix::process::geteuid().is_root() {
        assert!(stdout.contains("NodePublishVolume"), "{stdout}");
    } else {
        eprintln!("not root: the publish/unpublish rows are not checked");
    }
    // The run directory is removed afterwards.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
