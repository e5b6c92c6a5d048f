//! The pool mounter (`hpp-mounter`): mounts a pvcTemplate pool's PVC onto the host at
//! `<pool path>/csi` (formatting an empty block PVC with `mkfs.xfs` first), keeps it mounted,
//! and with `--unmount` removes the mount. Flag names match KubeVirt's `mounter`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, bail};
use hpp_fs::mountinfo::MountTable;
use tracing::{info, warn};

/// Arguments of `hpp-mounter`.
#[derive(clap::Parser, Debug, Clone)]
#[command(
    name = "hpp-mounter",
    version,
    about = "Mounts an hpp storage pool PVC onto the host"
)]
pub struct MounterArgs {
    /// The PVC inside this pod: a directory (filesystem PVC) or a block device.
    #[arg(long = "storagePoolPath")]
    pub storage_pool_path: Option<PathBuf>,
    /// Host directory to mount it on (`<pool path>/csi`).
    #[arg(long = "mountPath")]
    pub mount_path: PathBuf,
    /// Where the host's `/` is mounted in this pod.
    #[arg(long = "hostPath", default_value = "/host")]
    pub host_path: PathBuf,
    /// Remove the mount instead of creating it.
    #[arg(long)]
    pub unmount: bool,
    /// Check once and exit instead of re-checking forever.
    #[arg(long)]
    pub once: bool,
    /// Re-check interval in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub interval_ms: u64,
}

/// The mount target as seen from this pod: `<hostPath>/<mountPath>`.
pub fn target(args: &MounterArgs) -> PathBuf {
    let rel = args.mount_path.strip_prefix("/").unwrap_or(&args.mount_path);
    args.host_path.join(rel)
}

/// Whether `path` is a mount point in this mount namespace.
pub fn is_mount_point(path: &Path) -> anyhow::Result<bool> {
    let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let table = MountTable::read().context("reading /proc/self/mountinfo")?;
    Ok(table.is_mount_point(&canonical))
}

fn run(cmd: &mut Command) -> anyhow::Result<std::process::Output> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    Ok(out)
}

fn check(cmd: &mut Command) -> anyhow::Result<()> {
    let out = run(cmd)?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// Formats an empty block pool.
pub const MKFS: &str = "mkfs.xfs";
/// Tells whether a block pool already carries a filesystem.
pub const BLKID: &str = "blkid";
/// Mounts the pool.
pub const MOUNT: &str = "mount";
/// Unmounts the pool.
pub const UMOUNT: &str = "umount";
/// Every external tool the mounter runs (found on `PATH`); the operator image ships them.
pub const TOOLS: [&str; 4] = [MKFS, BLKID, MOUNT, UMOUNT];

fn is_block_device(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device())
}

/// Whether a block device already carries a filesystem (blkid exits 2 when it finds nothing).
fn has_filesystem(device: &Path) -> anyhow::Result<bool> {
    let out = run(Command::new(BLKID)
        .args(["-p", "-s", "TYPE", "-o", "value"])
        .arg(device))?;
    match out.status.code() {
        Some(0) => Ok(!out.stdout.is_empty()),
        Some(2) => Ok(false),
        _ => bail!(
            "blkid {} failed: {}",
            device.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    }
}

/// Makes sure the pool is mounted; returns whether a mount was made now.
pub fn ensure_mounted(args: &MounterArgs) -> anyhow::Result<bool> {
    let source = args
        .storage_pool_path
        .as_deref()
        .context("--storagePoolPath is required unless --unmount")?;
    let target = target(args);
    std::fs::create_dir_all(&target).with_context(|| format!("creating {}", target.display()))?;
    if is_mount_point(&target)? {
        return Ok(false);
    }
    if is_block_device(source) {
        if !has_filesystem(source)? {
            info!(device = %source.display(), "empty block device, creating an xfs filesystem");
            check(Command::new(MKFS).arg(source))?;
        }
        check(Command::new(MOUNT).arg(source).arg(&target))?;
    } else {
        check(Command::new(MOUNT).arg("--bind").arg(source).arg(&target))?;
    }
    info!(source = %source.display(), target = %target.display(), "mounted storage pool");
    Ok(true)
}

/// Removes every mount stacked on the target; returns how many were removed.
pub fn unmount(args: &MounterArgs) -> anyhow::Result<usize> {
    let target = target(args);
    let mut removed = 0;
    while target.exists() && is_mount_point(&target)? {
        check(Command::new(UMOUNT).arg(&target))?;
        removed += 1;
        if removed > 64 {
            bail!("{} is still mounted after {removed} unmounts", target.display());
        }
    }
    Ok(removed)
}

/// Runs the mounter until SIGTERM (or once with `--once` / `--unmount`).
pub async fn main(args: MounterArgs) -> anyhow::Result<()> {
    if args.unmount {
        let n = unmount(&args)?;
        info!(target = %target(&args).display(), removed = n, "unmounted storage pool");
        return Ok(());
    }
    ensure_mounted(&args)?;
    if args.once {
        return Ok(());
    }
    let shutdown = crate::admin::shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            () = tokio::time::sleep(Duration::from_millis(args.interval_ms)) => {
                if let Err(e) = ensure_mounted(&args) {
                    warn!(error = %e, "re-mounting the storage pool failed");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use clap::Parser;

    #[test]
    fn parses_kubevirt_flags_and_targets_the_host_path() {
        let args = MounterArgs::parse_from([
            "mounter",
            "--storagePoolPath",
            "/source",
            "--mountPath",
            "/var/hpvolumes/csi",
            "--hostPath",
            "/host",
        ]);
        assert_eq!(target(&args), PathBuf::from("/host/var/hpvolumes/csi"));
        assert!(!args.unmount);
        // Mount points with escaped spaces are found (the parser is hpp-fs's, shared by every crate).
        let info = "36 35 98:0 /mnt1 /mnt/a\\040b rw,noatime master:1 - ext3 /dev/root rw\n";
        assert!(MountTable::parse(info).is_mount_point(Path::new("/mnt/a b")));
    }

    #[test]
    fn bind_mounts_a_directory_and_unmounts_it() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("source");
        let host = dir.path().join("host");
        std::fs::create_dir_all(&source).unwrap();
        std::fs::write(source.join("marker"), b"pool").unwrap();
        let args = MounterArgs::parse_from([
            "mounter".as_ref(),
            "--storagePoolPath".as_ref(),
            source.as_os_str(),
            "--mountPath".as_ref(),
            "/var/hpvolumes/csi".as_ref(),
            "--hostPath".as_ref(),
            host.as_os_str(),
            "--once".as_ref(),
        ]);
        let mounted = match ensure_mounted(&args) {
            Ok(m) => m,
            Err(e) if e.to_string().contains("permission") || e.to_string().contains("only root") => return,
            Err(e) => panic!("{e:#}"),
        };
        assert!(mounted);
        let target = target(&args);
        assert_eq!(std::fs::read(target.join("marker")).unwrap(), b"pool");
        assert!(
            !ensure_mounted(&args).unwrap(),
            "a second pass finds it mounted and does nothing"
        );
        let unmount_args = MounterArgs { unmount: true, ..args };
        assert_eq!(unmount(&unmount_args).unwrap(), 1);
        assert!(!target.join("marker").exists());
        assert_eq!(unmount(&unmount_args).unwrap(), 0, "unmount is idempotent");
    }

    /// Detaches the loop device when the test ends, even on failure.
    struct Loop(String);

    impl Drop for Loop {
        fn drop(&mut self) {
            let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
        }
    }

    #[test]
    fn formats_an_empty_block_device_once_and_mounts_it() {
        // Needs xfsprogs and blkid (CI installs them, README says why); skip visibly without.
        for (tool, package) in [
            ("mkfs.xfs", "xfsprogs"),
            ("blkid", "util-linux"),
            ("losetup", "util-linux"),
        ] {
            if Command::new(tool).arg("-V").output().is_err() {
                eprintln!("skipping: {tool} not installed (apt-get install {package})");
                return;
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        std::fs::File::create(&image)
            .unwrap()
            .set_len(320 * 1024 * 1024)
            .unwrap();
        let out = Command::new("losetup").args(["--find", "--show"]).arg(&image).output();
        let Some(out) = out.ok().filter(|o| o.status.success()) else {
            eprintln!("skipping: no loop devices here");
            return;
        };
        let device = Loop(String::from_utf8(out.stdout).unwrap().trim().to_owned());
        let host = dir.path().join("host");
        let args = MounterArgs::parse_from([
            "mounter",
            "--storagePoolPath",
            device.0.as_str(),
            "--mountPath",
            "/pool/csi",
            "--hostPath",
            host.to_str().unwrap(),
            "--once",
        ]);
        assert!(ensure_mounted(&args).unwrap());
        assert!(
            has_filesystem(Path::new(&device.0)).unwrap(),
            "mkfs.xfs ran on the empty device"
        );
        let target = target(&args);
        std::fs::write(target.join("data"), b"kept").unwrap();
        let unmount_args = MounterArgs {
            unmount: true,
            ..args.clone()
        };
        assert_eq!(unmount(&unmount_args).unwrap(), 1);
        // Mounting again must reuse the filesystem, not format it.
        assert!(ensure_mounted(&args).unwrap());
        assert_eq!(std::fs::read(target.join("data")).unwrap(), b"kept");
        assert_eq!(unmount(&unmount_args).unwrap(), 1);
    }
}
