//! What `kubectl logs` shows: the driver's stderr is a pipe there, and its lines must be plain
//! text (colour escapes only go to a terminal).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};

#[test]
fn log_lines_on_a_pipe_carry_no_colour_escapes() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_hpp-csi-driver"))
        .env_remove("NO_COLOR")
        .env_remove("HPP_LOG_FORMAT")
        .env("RUST_LOG", "info")
        .args(["--endpoint", &format!("unix://{}", socket.display())])
        .args(["--datadir-root", &dir.path().join("data").display().to_string()])
        .args(["--drivername", "test.hpp.io", "--metrics-address", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let first: Vec<String> = lines.by_ref().take(3).map(Result::unwrap).collect();
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(first.len(), 3, "the driver logged {first:?}");
    for line in &first {
        assert!(!line.contains('\u{1b}'), "colour escape in {line:?}");
        assert!(line.contains("INFO") || line.contains("WARN"), "{line:?}");
    }
}
