//! Freshly made, loop-mounted scratch filesystems for the benchmarks, so every run measures an
//! empty filesystem of a known type instead of whatever the host disk has become; and the
//! choice of filesystems behind `cargo xtask bench --fs`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context as _;

/// A filesystem image made with `mkfs.<fstype>`, mounted with `mount -o loop`. The image file
/// is unlinked as soon as it is mounted (the loop device holds it open), so nothing is left on
/// disk once the mount goes, even after a crash of this process; dropping the value unmounts
/// it, which frees the loop device (`mount -o loop` sets autoclear), and removes the scratch
/// directory.
#[derive(Debug)]
pub struct LoopFs {
    fstype: String,
    scratch: PathBuf,
    mnt: PathBuf,
}

impl LoopFs {
    /// Makes a sparse `mib` MiB image under a new `<fstype>-<pid>` directory of `parent`,
    /// formats it and mounts it. Needs root, loop devices and `mkfs.<fstype>`.
    pub fn new(parent: &Path, fstype: &str, mib: u64) -> anyhow::Result<LoopFs> {
        let scratch = parent.join(format!("{fstype}-{}", std::process::id()));
        let mnt = scratch.join("mnt");
        std::fs::create_dir_all(&mnt).with_context(|| format!("creating {}", mnt.display()))?;
        // From here on, dropping `fs` cleans up whatever exists.
        let fs = LoopFs {
            fstype: fstype.to_owned(),
            scratch,
            mnt,
        };
        let img = fs.scratch.join(format!("{fstype}.img"));
        std::fs::File::create(&img)
            .and_then(|f| f.set_len(mib << 20))
            .with_context(|| format!("creating the sparse image {}", img.display()))?;
        let force = if fstype == "ext4" { "-F" } else { "-f" };
        let out = Command::new(format!("mkfs.{fstype}"))
            .args(["-q", force])
            .arg(&img)
            .output()
            .with_context(|| format!("running mkfs.{fstype}"))?;
        anyhow::ensure!(
            out.status.success(),
            "mkfs.{fstype} {}: {}",
            img.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        let out = Command::new("mount")
            .args(["-o", "loop"])
            .arg(&img)
            .arg(&fs.mnt)
            .output()
            .context("running mount")?;
        anyhow::ensure!(
            out.status.success(),
            "mount -o loop {} {}: {}",
            img.display(),
            fs.mnt.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        std::fs::remove_file(&img).with_context(|| format!("removing {}", img.display()))?;
        Ok(fs)
    }

    /// Where the filesystem is mounted.
    pub fn path(&self) -> &Path {
        &self.mnt
    }

    /// The filesystem type given to mkfs.
    pub fn fstype(&self) -> &str {
        &self.fstype
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        if is_mounted(&self.mnt) {
            let _ = rustix::mount::unmount(&self.mnt, rustix::mount::UnmountFlags::empty());
        }
        if is_mounted(&self.mnt) {
            // Still busy (a process we could not stop): detach it; the kernel finishes later.
            let _ = rustix::mount::unmount(&self.mnt, rustix::mount::UnmountFlags::DETACH);
        }
        if !is_mounted(&self.mnt) {
            let _ = std::fs::remove_dir_all(&self.scratch);
        }
    }
}

/// Whether something is mounted exactly at `path`.
pub fn is_mounted(path: &Path) -> bool {
    let canon = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    hpp_csi::mountinfo::MountTable::read()
        .map(|t| t.mounts().iter().any(|m| m.mount_point == canon))
        .unwrap_or(false)
}

/// `--fs`: which filesystems the benchmark makes for itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FsChoice {
    /// A fresh ext4 image.
    Ext4,
    /// A fresh btrfs image.
    Btrfs,
    /// ext4, then btrfs.
    Both,
    /// No image: the `--dir` filesystem as it is.
    Dir,
}

/// Where one round of the benchmark runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsTarget {
    /// A fresh loop-mounted filesystem of this type.
    Loop(&'static str),
    /// The `--dir` filesystem.
    Dir,
}

/// The filesystems to run on. Without `--fs`: both images when running as root with both mkfs
/// tools installed, else the `--dir` filesystem (saying why on stderr). An explicit image
/// choice that cannot be made is an error, not a silent fallback.
pub fn targets(
    choice: Option<FsChoice>,
    root: bool,
    have_mkfs: impl Fn(&str) -> bool,
) -> anyhow::Result<Vec<FsTarget>> {
    let wanted: &[&'static str] = match choice {
        Some(FsChoice::Dir) => return Ok(vec![FsTarget::Dir]),
        Some(FsChoice::Ext4) => &["ext4"],
        Some(FsChoice::Btrfs) => &["btrfs"],
        Some(FsChoice::Both) | None => &["ext4", "btrfs"],
    };
    let missing: Vec<String> = wanted
        .iter()
        .filter(|t| !have_mkfs(t))
        .map(|t| format!("mkfs.{t}"))
        .collect();
    let why = match (root, missing.is_empty()) {
        (true, true) => return Ok(wanted.iter().map(|t| FsTarget::Loop(t)).collect()),
        (false, _) => "loop-mounted images need root".to_owned(),
        (true, false) => format!("{} not installed", missing.join(" and ")),
    };
    match choice {
        None => {
            eprintln!("hpp-bench: {why}; measuring the --dir filesystem as it is");
            Ok(vec![FsTarget::Dir])
        }
        Some(c) => anyhow::bail!("--fs {c:?}: {why} (use --fs dir to measure the --dir filesystem)"),
    }
}

/// Whether `mkfs.<fstype>` can be run.
pub fn have_mkfs(fstype: &str) -> bool {
    Command::new(format!("mkfs.{fstype}")).arg("-V").output().is_ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn default_is_both_images_as_root_with_the_tools_else_the_dir() {
        let all = |_: &str| true;
        let no_btrfs = |t: &str| t != "btrfs";
        use FsTarget::{Dir, Loop};
        assert_eq!(targets(None, true, all).unwrap(), [Loop("ext4"), Loop("btrfs")]);
        assert_eq!(targets(None, false, all).unwrap(), [Dir]);
        assert_eq!(targets(None, true, no_btrfs).unwrap(), [Dir]);
        assert_eq!(targets(Some(FsChoice::Dir), true, all).unwrap(), [Dir]);
        assert_eq!(targets(Some(FsChoice::Ext4), true, no_btrfs).unwrap(), [Loop("ext4")]);
        assert_eq!(targets(Some(FsChoice::Btrfs), true, all).unwrap(), [Loop("btrfs")]);
    }

    #[test]
    fn an_explicit_image_that_cannot_be_made_is_an_error_naming_why() {
        let err = targets(Some(FsChoice::Btrfs), true, |t| t != "btrfs").unwrap_err();
        assert!(err.to_string().contains("mkfs.btrfs not installed"), "{err}");
        let err = targets(Some(FsChoice::Both), false, |_| true).unwrap_err();
        assert!(err.to_string().contains("need root"), "{err}");
    }

    #[test]
    fn fs_flag_parses_its_four_values() {
        use clap::ValueEnum as _;
        for (s, v) in [
            ("ext4", FsChoice::Ext4),
            ("btrfs", FsChoice::Btrfs),
            ("both", FsChoice::Both),
            ("dir", FsChoice::Dir),
        ] {
            assert_eq!(FsChoice::from_str(s, false).unwrap(), v);
        }
        assert!(FsChoice::from_str("xfs", false).is_err());
    }
}
