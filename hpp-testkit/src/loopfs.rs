//! Loop-mounted filesystem images for tests that need a real btrfs, ext4 or XFS (quotas,
//! reflinks, loop devices): made in a temporary directory, unmounted (and their loop devices
//! freed) when dropped, even when the test fails. Linux and root only; otherwise a test skips.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A freshly made filesystem of one type, loop-mounted in a temporary directory.
#[derive(Debug)]
pub struct LoopFs {
    mnt: PathBuf,
    _dir: tempfile::TempDir,
}

impl LoopFs {
    /// Makes and mounts a `size_mib` MiB image with `mkfs.<fstype>` and mount `options` (empty
    /// for none); `None` (with a line on stderr saying why) when not root, the tool is
    /// missing, or a step fails. A test that gets `None` skips.
    pub fn new(fstype: &str, size_mib: u64, options: &str) -> Option<LoopFs> {
        let skip = |why: String| {
            eprintln!("skipped: {why}");
            None
        };
        if !rustix::process::geteuid().is_root() {
            return skip("needs root for loop mounts".into());
        }
        let mkfs = format!("mkfs.{fstype}");
        if Command::new(&mkfs).arg("-V").output().is_err() {
            return skip(format!("{mkfs} is not installed"));
        }
        let dir = match tempfile::tempdir() {
            Ok(d) => d,
            Err(e) => return skip(format!("no temporary directory: {e}")),
        };
        let img = dir.path().join("fs.img");
        let mnt = dir.path().join("mnt");
        let made = std::fs::create_dir(&mnt)
            .and_then(|()| std::fs::File::create(&img))
            .and_then(|f| f.set_len(size_mib << 20));
        if let Err(e) = made {
            return skip(format!("cannot make the image: {e}"));
        }
        let quiet = if fstype == "ext4" { "-F" } else { "-f" };
        match Command::new(&mkfs).arg("-q").arg(quiet).arg(&img).output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => return skip(format!("{mkfs}: {}", String::from_utf8_lossy(&out.stderr))),
            Err(e) => return skip(format!("{mkfs}: {e}")),
        }
        let opts = match options {
            "" => "loop".to_owned(),
            options => format!("loop,{options}"),
        };
        match Command::new("mount").arg("-o").arg(opts).arg(&img).arg(&mnt).output() {
            Ok(out) if out.status.success() => Some(LoopFs { mnt, _dir: dir }),
            Ok(out) => skip(format!(
                "mounting {fstype} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )),
            Err(e) => skip(format!("mount: {e}")),
        }
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.mnt
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        // `mount -o loop` sets autoclear: the loop device goes with the last unmount.
        let _ = Command::new("umount").arg(&self.mnt).status();
        if std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|m| m.contains(&*self.mnt.to_string_lossy())) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}
