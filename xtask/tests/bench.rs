//! `cargo xtask bench` runs end to end (server children, every table, the cleanup): smoke runs
//! with tiny counts; no timing is asserted.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::path::Path;
use std::process::Command;

fn bench(dir: &Path, fs: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args([
            "bench",
            "--ops",
            "8",
            "--mount-ops",
            "2",
            "--rss-volumes",
            "20",
            "--idle-wait",
            "0",
            "--fs",
            fs,
            "--dir",
        ])
        .arg(dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn root() -> bool {
    rustix::process::geteuid().is_root()
}

#[test]
fn bench_runs_and_prints_every_table() {
    let dir = tempfile::tempdir().unwrap();
    let stdout = bench(dir.path(), "dir");
    for needle in [
        "hpp-bench: ",
        "Floors: bare system calls",
        "mkdir+fsync(parent)",
        "rename+fsync(parent)",
        "Empty-call floor",
        "bare tonic",
        "tonic + RpcLayer",
        "RpcLayer cost of the empty call (GetPluginInfo): c=1: p50 ",
        "Probe",
        "GetPluginInfo",
        "GetCapacity",
        "CreateVolume",
        "ExpandVolume",
        "DeleteVolume",
        "CreateSnapshot",
        "CreateVolume (snapshot)",
        "CreateVolume (clone)",
        "DeleteSnapshot",
        "CreateVolume: p50 ",
        "DeleteVolume: p50 ",
        "created 20 volumes",
        "Driver memory",
        "RssAnon KiB",
        "after listing",
    ] {
        assert!(stdout.contains(needle), "{needle} missing from\n{stdout}");
    }
    if root() {
        assert!(stdout.contains("NodePublishVolume"), "{stdout}");
        assert!(stdout.contains("umount+rmdir"), "{stdout}");
    } else {
        eprintln!("not root: the publish/unpublish rows are not checked");
    }
    // The run directory is removed afterwards.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn bench_on_a_fresh_ext4_image_unmounts_and_removes_it() {
    if !root() || Command::new("mkfs.ext4").arg("-V").output().is_err() {
        eprintln!("skipped: needs root and mkfs.ext4 for the loop-mounted image");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let stdout = bench(dir.path(), "ext4");
    assert!(stdout.contains("=== fresh ext4 (4 GiB loop image"), "{stdout}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&*dir.path().to_string_lossy()),
        "still mounted:\n{mounts}"
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
