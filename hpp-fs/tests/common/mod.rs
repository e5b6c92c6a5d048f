//! Loop-mounted filesystem images for the quota tests, unmounted (and their loop devices
//! freed) when dropped, even when the test fails.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// A freshly made filesystem of `fstype`, loop-mounted in a temporary directory.
pub struct LoopFs {
    mnt: PathBuf,
    mounted: bool,
    _dir: tempfile::TempDir,
}

impl LoopFs {
    /// Makes and mounts a `size_mib` MiB image with `mkfs.<fstype>`; `None` (with a message
    /// saying why) when not root or the tool is missing.
    pub fn new(fstype: &str, size_mib: u64, options: &str) -> Option<LoopFs> {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: needs root for loop mounts");
            return None;
        }
        let mkfs = format!("mkfs.{fstype}");
        if Command::new(&mkfs).arg("-V").output().is_err() {
            eprintln!("skipped: {mkfs} is not installed");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("fs.img");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        std::fs::File::create(&img).unwrap().set_len(size_mib << 20).unwrap();
        let quiet = if fstype == "ext4" { "-F" } else { "-f" };
        let out = Command::new(&mkfs).arg("-q").arg(quiet).arg(&img).output().unwrap();
        assert!(out.status.success(), "{mkfs}: {}", String::from_utf8_lossy(&out.stderr));
        let opts = if options.is_empty() {
            "loop".to_owned()
        } else {
            format!("loop,{options}")
        };
        let out = Command::new("mount")
            .arg("-o")
            .arg(opts)
            .arg(&img)
            .arg(&mnt)
            .output()
            .unwrap();
        if !out.status.success() {
            eprintln!(
                "skipped: mounting {fstype} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            return None;
        }
        Some(LoopFs {
            mnt,
            mounted: true,
            _dir: dir,
        })
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.mnt
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        if self.mounted {
            // `mount -o loop` sets autoclear: the loop device goes with the last unmount.
            let _ = Command::new("umount").arg(&self.mnt).status();
            if std::fs::read_to_string("/proc/self/mountinfo")
                .map(|m| m.contains(&*self.mnt.to_string_lossy()))
                .unwrap_or(false)
            {
                let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
            }
        }
    }
}
