//! `cargo xtask bench --quota-backends`: the cost of each quota backend's Create, Expand,
//! Usage (what NodeGetVolumeStats and the capacity ledger read), Publish (+ unpublish) and
//! Delete against plain directories, in the same run, each on its own freshly made
//! loop-mounted filesystem:
//!
//! | setup | create | expand | usage | publish | delete |
//! |---|---|---|---|---|---|
//! | `mkdir` on ext4 / on btrfs | mkdir | set the size xattr | walk the tree | bind mount + umount | rmdir |
//! | `none` on ext4 | `Unlimited::create` | `set_limit` (nothing) | walk the tree | bind mount + umount | `remove` |
//! | `btrfs` on btrfs | subvolume + qgroup limit | qgroup limit | qgroup (sysfs) | bind mount + umount | destroy subvolume + qgroup |
//! | `image` on ext4 | sparse file + mkfs.ext4 | grow the file | allocated blocks | loop attach + mount + umount | unlink |
//!
//! Needs root, loop devices, mkfs.ext4 and mkfs.btrfs. Library calls, no gRPC: the driver's own
//! overhead is what `cargo xtask bench` measures.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hpp_fs::quota::{Btrfs, Image, ImageFs, QuotaBackend, Unlimited};
use rustix::mount::UnmountFlags;

use crate::loopfs::LoopFs;

/// p50, p99 and operations per second of a series of latencies.
fn summary(mut lat: Vec<Duration>) -> (Duration, Duration, f64) {
    if lat.is_empty() {
        return (Duration::ZERO, Duration::ZERO, 0.0);
    }
    let total: Duration = lat.iter().sum();
    lat.sort();
    let at = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)];
    (at(0.5), at(0.99), lat.len() as f64 / total.as_secs_f64().max(1e-9))
}

fn time(f: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<Duration> {
    let start = Instant::now();
    f()?;
    Ok(start.elapsed())
}

/// How a setup makes, publishes and removes one volume.
enum Setup {
    Mkdir,
    Backend(Box<dyn QuotaBackend>),
}

fn measure(name: &str, pool: &Path, targets: &Path, setup: &Setup, ops: usize, limit: u64) -> anyhow::Result<()> {
    let pool_dir = std::fs::File::open(pool)?;
    let fd = pool_dir.as_fd();
    let (mut create, mut expand, mut usage, mut publish, mut delete) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..ops {
        let vol = format!("v{i}");
        let target = targets.join(format!("{name}-{i}"));
        std::fs::create_dir_all(&target)?;
        create.push(time(|| {
            match setup {
                Setup::Mkdir => std::fs::create_dir(pool.join(&vol))?,
                Setup::Backend(b) => drop(b.create(fd, &vol, limit)?),
            }
            Ok(())
        })?);
        expand.push(time(|| {
            match setup {
                Setup::Mkdir => {
                    let dir = std::fs::File::open(pool.join(&vol))?;
                    rustix::fs::fsetxattr(
                        &dir,
                        "user.hpp-bench.capacity",
                        (2 * limit).to_string().as_bytes(),
                        rustix::fs::XattrFlags::empty(),
                    )?;
                }
                Setup::Backend(b) => b.set_limit(fd, &vol, 2 * limit)?,
            }
            Ok(())
        })?);
        usage.push(time(|| {
            let counted = match setup {
                Setup::Backend(b) => b.usage(fd, &vol)?.is_some(),
                Setup::Mkdir => false,
            };
            if !counted {
                let dir = std::fs::File::open(pool.join(&vol))?;
                hpp_fs::usage(dir.as_fd())?;
            }
            Ok(())
        })?);
        publish.push(time(|| {
            let src = std::fs::File::open(pool.join(&vol))?;
            let mounted = match setup {
                Setup::Backend(b) => b.mount_at(src.as_fd(), &target, rustix::mount::MountFlags::empty())?,
                Setup::Mkdir => false,
            };
            if !mounted {
                rustix::mount::mount_bind(pool.join(&vol), &target)?;
            }
            rustix::mount::unmount(&target, UnmountFlags::empty())?;
            Ok(())
        })?);
        delete.push(time(|| {
            match setup {
                Setup::Mkdir => std::fs::remove_dir(pool.join(&vol))?,
                Setup::Backend(b) => b.remove(fd, &vol)?,
            }
            Ok(())
        })?);
        std::fs::remove_dir(&target)?;
    }
    for (op, lat) in [
        ("create", create),
        ("expand", expand),
        ("usage", usage),
        ("publish", publish),
        ("delete", delete),
    ] {
        let (p50, p99, rate) = summary(lat);
        println!(
            "| {name} | {op} | {:.1} µs | {:.1} µs | {rate:.0} |",
            p50.as_secs_f64() * 1e6,
            p99.as_secs_f64() * 1e6
        );
    }
    Ok(())
}

/// Runs every setup with `ops` volumes (images: a tenth, they run mkfs) under `dir`.
pub fn run(dir: &Path, ops: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        rustix::process::geteuid().is_root(),
        "--quota-backends needs root (loop mounts)"
    );
    std::fs::create_dir_all(dir)?;
    let targets = dir.join("targets");
    std::fs::create_dir_all(&targets)?;
    let ext4 = LoopFs::new(dir, "ext4", 2048)?;
    let btrfs = LoopFs::new(dir, "btrfs", 2048)?;
    let pool_dir = std::fs::File::open(btrfs.path())?;
    let btrfs_backend = Btrfs::open(pool_dir.as_fd())?;
    println!("| setup | operation | p50 | p99 | ops/s |");
    println!("|---|---|---|---|---|");
    let mk = |p: &Path, n: &str| -> anyhow::Result<PathBuf> {
        let d = p.join(n);
        std::fs::create_dir_all(&d)?;
        Ok(d)
    };
    measure("mkdir on ext4", &mk(ext4.path(), "a")?, &targets, &Setup::Mkdir, ops, 0)?;
    measure(
        "none on ext4",
        &mk(ext4.path(), "b")?,
        &targets,
        &Setup::Backend(Box::new(Unlimited)),
        ops,
        0,
    )?;
    measure(
        "mkdir on btrfs",
        &mk(btrfs.path(), "a")?,
        &targets,
        &Setup::Mkdir,
        ops,
        0,
    )?;
    measure(
        "btrfs on btrfs",
        &mk(btrfs.path(), "b")?,
        &targets,
        &Setup::Backend(Box::new(btrfs_backend)),
        ops,
        1 << 30,
    )?;
    measure(
        "image (ext4) on ext4",
        &mk(ext4.path(), "c")?,
        &targets,
        &Setup::Backend(Box::new(Image::new(ImageFs::Ext4))),
        (ops / 10).max(1),
        64 << 20,
    )?;
    Ok(())
}
