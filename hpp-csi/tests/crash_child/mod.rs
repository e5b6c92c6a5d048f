//! Kill tests: the child is this test binary again, running one test alone, which marks in a
//! shared directory that it is at work ([`mark_started`]) before the parent kills it.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The child's side: tells the parent it is at work.
pub fn mark_started(root: &Path) {
    std::fs::write(root.join(format!("started-{}", std::process::id())), b"").unwrap();
}

/// Where `child` marks that it is at work.
pub fn started_marker(root: &Path, child: &Child) -> PathBuf {
    root.join(format!("started-{}", child.id()))
}

/// Waits (30 s at most) until `child` is at work or has exited; whether it started.
pub fn wait_started(child: &mut Child, root: &Path) -> bool {
    let started = started_marker(root, child);
    for _ in 0..30_000 {
        if started.exists() || child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    started.exists()
}

/// `rounds` times, runs this binary's test `test` alone with `env` set to `root` and kills it
/// (SIGKILL) `round × step` after it started: a different moment each round. Where a kill
/// lands does not matter to the caller's checks.
pub fn kill_at_moments(test: &str, env: &str, root: &Path, rounds: u64, step: Duration) {
    for round in 0..rounds {
        kill_after(test, env, root, step * u32::try_from(round).unwrap());
    }
}

/// Runs this binary's test `test` alone with `env` set to `root` and kills it (SIGKILL) `delay`
/// after it started.
pub fn kill_after(test: &str, env: &str, root: &Path, delay: Duration) {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(&exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(env, root)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_started(&mut child, root);
    std::thread::sleep(delay);
    child.kill().unwrap();
    child.wait().unwrap();
    let _ = std::fs::remove_file(started_marker(root, &child));
}
