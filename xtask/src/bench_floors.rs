//! The floors of `cargo xtask bench`: the bare system calls each RPC wraps, measured in the same
//! run on the same filesystem, so a driver row reads as "this much above what the kernel costs".
//!
//! The durable floors are what a crash-safe create or delete cannot avoid: CreateVolume makes a
//! temporary directory, renames it into place and fsyncs the pool directory (`mkdir +
//! fsync(parent)`); DeleteVolume renames the volume to a deleting name and fsyncs before
//! removing it (`rename + fsync(parent)`).

use std::ops::Range;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use rustix::fs::{Mode, OFlags};

use crate::bench_stats::{Sample, Stats, run_threads, run_threads_sample};

/// `mkdir`.
pub const MKDIR: &str = "mkdir";
/// `mkdir` then `fsync` of the parent directory.
pub const MKDIR_FSYNC: &str = "mkdir+fsync(parent)";
/// `mkdir`, then a record appended to a volume journal (`hpp_fs::journal`): concurrent appends
/// share one `fdatasync` of preallocated blocks. What the driver's CreateVolume of an empty
/// volume pays for durability.
pub const MKDIR_JOURNAL: &str = "mkdir+journal";
/// `rename` within the parent, then `fsync` of the parent.
pub const RENAME_FSYNC: &str = "rename+fsync(parent)";
/// `rmdir`.
pub const RMDIR: &str = "rmdir";
/// `fsetxattr` of a size record, then `fsync` of the directory.
pub const XATTR_FSYNC: &str = "fsetxattr+fsync";
/// `statvfs` of the pool.
pub const STATVFS: &str = "statvfs";
/// `mkdir` of a target, then a bind mount onto it.
pub const BIND: &str = "mkdir+bind";
/// `umount` of a target, then its `rmdir`.
pub const UMOUNT: &str = "umount+rmdir";

/// Every floor measured, at every concurrency.
#[derive(Debug, Clone, Default)]
pub struct Floors {
    rows: Vec<(&'static str, usize, Stats)>,
}

impl Floors {
    /// The floor `name` at concurrency `conc`, if it was measured.
    pub fn get(&self, name: &str, conc: usize) -> Option<Stats> {
        self.rows
            .iter()
            .find(|(n, c, _)| *n == name && *c == conc)
            .map(|(_, _, s)| *s)
    }

    /// All measurements in the order they were taken.
    pub fn rows(&self) -> &[(&'static str, usize, Stats)] {
        &self.rows
    }

    fn push(&mut self, name: &'static str, conc: usize, stats: Stats) {
        self.rows.push((name, conc, stats));
    }
}

fn open_dir(path: &Path) -> anyhow::Result<OwnedFd> {
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .with_context(|| format!("opening {}", path.display()))
}

/// Where the floors run: `base` for directories, `pool` (the driver's pool, for statvfs) and
/// `targets` for mount points.
#[derive(Debug, Clone)]
pub struct FloorDirs {
    /// Scratch directory for mkdir/rename/rmdir.
    pub base: PathBuf,
    /// The driver's pool directory.
    pub pool: PathBuf,
    /// Parent of the mount targets.
    pub targets: PathBuf,
}

/// Measures every floor at concurrency `conc`: `n` operations each, `mount_n` for the mount
/// floors (root only).
pub fn measure(
    dirs: &FloorDirs,
    n: usize,
    mount_n: usize,
    conc: usize,
    root: bool,
    floors: &mut Floors,
) -> anyhow::Result<()> {
    let base = dirs.base.join(format!("c{conc}"));
    std::fs::create_dir_all(&base)?;
    let parent = Arc::new(open_dir(&base)?);
    let mode = Mode::from_raw_mode(0o750);

    let fd = parent.clone();
    let mkdir = run_threads(n, conc, move |i| Ok(rustix::fs::mkdirat(&*fd, format!("d{i}"), mode)?))?;
    floors.push(MKDIR, conc, mkdir);

    // A root-only xattr namespace when we can (as the driver's size record), else user.
    let xattr = if root { "trusted.hpp.bench" } else { "user.hpp.bench" };
    let b = base.clone();
    let record = run_threads(n, conc, move |i| {
        let dir = open_dir(&b.join(format!("d{i}")))?;
        rustix::fs::fsetxattr(&dir, xattr, b"2147483648", rustix::fs::XattrFlags::empty())?;
        rustix::fs::fsync(&dir)?;
        Ok(())
    })?;
    floors.push(XATTR_FSYNC, conc, record);

    let fd = parent.clone();
    let rename = run_threads(n, conc, move |i| {
        rustix::fs::renameat(&*fd, format!("d{i}"), &*fd, format!(".deleting-d{i}"))?;
        rustix::fs::fsync(&*fd)?;
        Ok(())
    })?;
    floors.push(RENAME_FSYNC, conc, rename);

    let fd = parent.clone();
    let rmdir = run_threads(n, conc, move |i| {
        Ok(rustix::fs::unlinkat(
            &*fd,
            format!(".deleting-d{i}"),
            rustix::fs::AtFlags::REMOVEDIR,
        )?)
    })?;
    floors.push(RMDIR, conc, rmdir);

    let fd = parent.clone();
    let durable = run_threads(n, conc, move |i| {
        rustix::fs::mkdirat(&*fd, format!("m{i}"), mode)?;
        rustix::fs::fsync(&*fd)?;
        Ok(())
    })?;
    floors.push(MKDIR_FSYNC, conc, durable);
    for i in 0..n {
        rustix::fs::unlinkat(&*parent, format!("m{i}"), rustix::fs::AtFlags::REMOVEDIR)?;
    }

    let (journal, _) = hpp_fs::journal::Journal::open(
        std::os::fd::AsFd::as_fd(&*parent),
        ".journal",
        hpp_fs::journal::DEFAULT_CAPACITY,
    )?;
    journal.checkpoint(std::os::fd::AsFd::as_fd(&*parent))?;
    let (fd, journal) = (parent.clone(), Arc::new(journal));
    let journaled = run_threads(n, conc, move |i| {
        let name = format!("j{i}");
        rustix::fs::mkdirat(&*fd, &name, mode)?;
        journal.append(std::os::fd::AsFd::as_fd(&*fd), name.as_bytes())?;
        Ok(())
    })?;
    floors.push(MKDIR_JOURNAL, conc, journaled);
    for i in 0..n {
        rustix::fs::unlinkat(&*parent, format!("j{i}"), rustix::fs::AtFlags::REMOVEDIR)?;
    }
    rustix::fs::unlinkat(&*parent, ".journal", rustix::fs::AtFlags::empty())?;

    let pool = dirs.pool.clone();
    let statvfs = run_threads(n, conc, move |_| Ok(rustix::fs::statvfs(&pool).map(|_| ())?))?;
    floors.push(STATVFS, conc, statvfs);

    if root {
        let sources: Vec<PathBuf> = (0..conc).map(|w| base.join(format!("src{w}"))).collect();
        for s in &sources {
            std::fs::create_dir_all(s)?;
        }
        let sources = Arc::new(sources);
        let tgt = dirs.targets.join(format!("floor-c{conc}"));
        std::fs::create_dir_all(&tgt)?;
        let (s, t) = (sources.clone(), tgt.clone());
        let bind = run_threads(mount_n, conc, move |i| {
            let target = t.join(format!("b{i}"));
            std::fs::create_dir(&target)?;
            rustix::mount::mount_bind(&s[i % conc], &target)?;
            Ok(())
        })?;
        floors.push(BIND, conc, bind);
        let t = tgt.clone();
        let umount = run_threads(mount_n, conc, move |i| {
            let target = t.join(format!("b{i}"));
            rustix::mount::unmount(&target, rustix::mount::UnmountFlags::NOFOLLOW)?;
            std::fs::remove_dir(&target)?;
            Ok(())
        })?;
        floors.push(UMOUNT, conc, umount);
    }
    Ok(())
}

/// The durable floors measured in turns with the RPCs they bound (CreateVolume with
/// `mkdir + fsync(parent)`, DeleteVolume with `rename + fsync(parent)`), so the goal ratio
/// compares the RPC with the disk as it was at the same moment, not minutes earlier.
#[derive(Debug)]
pub struct Paired {
    parent: Arc<OwnedFd>,
}

impl Paired {
    /// Floors in a new directory `dir`.
    pub fn new(dir: &Path) -> anyhow::Result<Paired> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Paired {
            parent: Arc::new(open_dir(dir)?),
        })
    }

    /// `mkdir p<i> + fsync(parent)` for every i of `range`.
    pub fn mkdir_fsync(&self, range: Range<usize>, conc: usize) -> anyhow::Result<Sample> {
        let (fd, start) = (self.parent.clone(), range.start);
        let mode = Mode::from_raw_mode(0o750);
        run_threads_sample(range.len(), conc, move |i| {
            rustix::fs::mkdirat(&*fd, format!("p{}", start + i), mode)?;
            rustix::fs::fsync(&*fd)?;
            Ok(())
        })
    }

    /// `rename p<i> .deleting-p<i> + fsync(parent)` for every i of `range` (made by
    /// [`Paired::mkdir_fsync`] before).
    pub fn rename_fsync(&self, range: Range<usize>, conc: usize) -> anyhow::Result<Sample> {
        let (fd, start) = (self.parent.clone(), range.start);
        run_threads_sample(range.len(), conc, move |i| {
            let i = start + i;
            rustix::fs::renameat(&*fd, format!("p{i}"), &*fd, format!(".deleting-p{i}"))?;
            rustix::fs::fsync(&*fd)?;
            Ok(())
        })
    }

    /// Removes what the renames left, `n` directories (not measured).
    pub fn clear(&self, n: usize) -> anyhow::Result<()> {
        for i in 0..n {
            rustix::fs::unlinkat(&*self.parent, format!(".deleting-p{i}"), rustix::fs::AtFlags::REMOVEDIR)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn paired_floors_make_rename_and_clear_every_directory_of_their_ranges() {
        let dir = tempfile::tempdir().unwrap();
        let paired = Paired::new(&dir.path().join("paired")).unwrap();
        for range in [0..3, 3..5] {
            assert!(paired.mkdir_fsync(range, 2).unwrap().stats().ops_per_sec > 0.0);
        }
        assert!(dir.path().join("paired/p4").is_dir());
        paired.rename_fsync(0..5, 3).unwrap();
        assert!(dir.path().join("paired/.deleting-p0").is_dir());
        paired.clear(5).unwrap();
        assert_eq!(std::fs::read_dir(dir.path().join("paired")).unwrap().count(), 0);
    }
}
