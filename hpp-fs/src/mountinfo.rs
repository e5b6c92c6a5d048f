//! The one parser for `/proc/self/mountinfo` (used by the CSI driver, the legacy provisioner's
//! mount guard and the pool mounter) and the questions they ask of the mount table. Parsing is
//! pure and tested on fixtures and random input; only [`MountTable::read`] does I/O.

use std::path::{Path, PathBuf};

/// One line of mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Mount id (unique while the mount exists).
    pub id: u64,
    /// Mount id of the parent mount.
    pub parent_id: u64,
    /// Device major:minor of the mounted filesystem.
    pub dev: (u32, u32),
    /// Path inside the filesystem that is mounted here (not `/` for bind mounts of a subdir).
    pub root: PathBuf,
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// Per-mount options (`rw`, `ro`, `nosuid`, ...).
    pub options: Vec<String>,
    /// Filesystem type.
    pub fs_type: String,
    /// Mount source (device path, `tmpfs`, server:/export, ...).
    pub source: String,
    /// Filesystem-wide (superblock) options (`prjquota`, `compress=zstd`, ...).
    pub super_options: Vec<String>,
}

impl Mount {
    /// Whether the filesystem is mounted with project quotas enforced (`prjquota` on ext4 and
    /// XFS; XFS also spells it `pquota`).
    pub fn project_quota(&self) -> bool {
        self.super_options.iter().any(|o| o == "prjquota" || o == "pquota")
    }
}

impl Mount {
    /// Whether the mount is read-only.
    pub fn read_only(&self) -> bool {
        self.options.iter().any(|o| o == "ro")
    }

    /// The per-mount flags of this entry.
    pub fn flags(&self) -> PerMountFlags {
        PerMountFlags::from_options(self.options.iter().map(String::as_str))
    }
}

/// Per-mount flags: the part of a mount's options that belongs to the mount (and so to each bind
/// mount separately), not to the filesystem.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct PerMountFlags {
    /// `ro`.
    pub read_only: bool,
    /// `nosuid`.
    pub nosuid: bool,
    /// `nodev`.
    pub nodev: bool,
    /// `noexec`.
    pub noexec: bool,
    /// `noatime`.
    pub noatime: bool,
    /// `nodiratime`.
    pub nodiratime: bool,
    /// `relatime`.
    pub relatime: bool,
}

impl PerMountFlags {
    /// Reads the flags out of a mount option list (`rw,nosuid,relatime`); other options are not
    /// per-mount flags and are ignored.
    pub fn from_options<'a>(options: impl IntoIterator<Item = &'a str>) -> Self {
        let mut f = PerMountFlags::default();
        for o in options {
            match o {
                "ro" => f.read_only = true,
                "rw" => f.read_only = false,
                "nosuid" => f.nosuid = true,
                "nodev" => f.nodev = true,
                "noexec" => f.noexec = true,
                "noatime" => f.noatime = true,
                "nodiratime" => f.nodiratime = true,
                "relatime" => f.relatime = true,
                _ => {}
            }
        }
        f
    }

    /// The flags in mountinfo spelling, `rw`/`ro` first.
    pub fn to_options(&self) -> Vec<&'static str> {
        let mut v = vec![if self.read_only { "ro" } else { "rw" }];
        for (on, name) in [
            (self.nosuid, "nosuid"),
            (self.nodev, "nodev"),
            (self.noexec, "noexec"),
            (self.noatime, "noatime"),
            (self.nodiratime, "nodiratime"),
            (self.relatime, "relatime"),
        ] {
            if on {
                v.push(name);
            }
        }
        v
    }

    /// Whether every flag set in `required` is also set here (`ro` included).
    pub fn includes(&self, required: &PerMountFlags) -> bool {
        (!required.read_only || self.read_only)
            && (!required.nosuid || self.nosuid)
            && (!required.nodev || self.nodev)
            && (!required.noexec || self.noexec)
    }
}

/// Undoes the octal escapes (`\040` for space, `\011` tab, `\012` newline, `\134` backslash).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(oct) = bytes.get(i + 1..i + 4)
            && oct.iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = oct.iter().fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
            if let Ok(v) = u8::try_from(v) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses one mountinfo line; `None` for malformed lines (the kernel never writes them).
pub fn parse_line(line: &str) -> Option<Mount> {
    let mut fields = line.split(' ');
    let id = fields.next()?.parse().ok()?;
    let parent_id = fields.next()?.parse().ok()?;
    let (major, minor) = fields.next()?.split_once(':')?;
    let dev = (major.parse().ok()?, minor.parse().ok()?);
    let root = PathBuf::from(unescape(fields.next()?));
    let mount_point = PathBuf::from(unescape(fields.next()?));
    let options = fields.next()?.split(',').map(str::to_owned).collect();
    // Optional fields up to the "-" separator.
    for f in fields.by_ref() {
        if f == "-" {
            break;
        }
    }
    let fs_type = fields.next()?.to_owned();
    let source = unescape(fields.next()?);
    let super_options = fields
        .next()
        .map(|o| o.split(',').map(str::to_owned).collect())
        .unwrap_or_default();
    Some(Mount {
        id,
        parent_id,
        dev,
        root,
        mount_point,
        options,
        fs_type,
        source,
        super_options,
    })
}

/// A snapshot of the mount table, in mount order (later entries are stacked on top).
#[derive(Debug, Clone, Default)]
pub struct MountTable {
    mounts: Vec<Mount>,
}

impl MountTable {
    /// Parses mountinfo text.
    pub fn parse(text: &str) -> Self {
        MountTable {
            mounts: text.lines().filter_map(parse_line).collect(),
        }
    }

    /// Reads the mount table of this process.
    pub fn read() -> std::io::Result<Self> {
        Ok(Self::parse(&std::fs::read_to_string("/proc/self/mountinfo")?))
    }

    /// All entries.
    pub fn mounts(&self) -> &[Mount] {
        &self.mounts
    }

    /// The topmost mount at exactly `path` (which must be canonical), if any.
    pub fn mount_at(&self, path: &Path) -> Option<&Mount> {
        self.mounts.iter().rev().find(|m| m.mount_point == path)
    }

    /// Whether something is mounted at exactly `path`.
    pub fn is_mount_point(&self, path: &Path) -> bool {
        self.mount_at(path).is_some()
    }

    /// The mount that holds `path`: the topmost mount with the longest matching mount point.
    pub fn containing(&self, path: &Path) -> Option<&Mount> {
        let mut best: Option<&Mount> = None;
        for m in &self.mounts {
            if path.starts_with(&m.mount_point)
                && best.is_none_or(|b| m.mount_point.as_os_str().len() >= b.mount_point.as_os_str().len())
            {
                best = Some(m);
            }
        }
        best
    }

    /// Device and filesystem-relative path of `path`, the identity of a directory across bind
    /// mounts.
    pub fn fs_location(&self, path: &Path) -> Option<((u32, u32), PathBuf)> {
        let m = self.containing(path)?;
        let rel = path.strip_prefix(&m.mount_point).ok()?;
        Some((m.dev, m.root.join(rel)))
    }

    /// Mount points where `path` (or something below it) is bind-mounted, excluding `path`
    /// itself and mounts below `path` (those are reported by [`Self::mounts_below`]).
    pub fn bind_mounts_of(&self, path: &Path) -> Vec<PathBuf> {
        let Some((dev, loc)) = self.fs_location(path) else {
            return Vec::new();
        };
        self.mounts
            .iter()
            .filter(|m| m.dev == dev && m.root.starts_with(&loc) && !m.mount_point.starts_with(path))
            .map(|m| m.mount_point.clone())
            .collect()
    }

    /// Mounts at exactly `path` that are binds of `dir` (same device, mountinfo root equal to
    /// `dir`'s location in its filesystem), topmost first.
    pub fn binds_of_at(&self, dir: &Path, path: &Path) -> Vec<&Mount> {
        let Some((dev, loc)) = self.fs_location(dir) else {
            return Vec::new();
        };
        self.mounts
            .iter()
            .rev()
            .filter(|m| m.mount_point == path && m.dev == dev && m.root == loc)
            .collect()
    }

    /// Mount points strictly below `path`.
    pub fn mounts_below(&self, path: &Path) -> Vec<PathBuf> {
        self.mounts
            .iter()
            .filter(|m| m.mount_point.starts_with(path) && m.mount_point != path)
            .map(|m| m.mount_point.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use proptest::prelude::*;

    use super::*;

    /// Escapes like the kernel's `show_path`/`seq_escape` do.
    fn escape(s: &str) -> String {
        let mut out = String::new();
        for c in s.chars() {
            match c {
                ' ' | '\t' | '\n' | '\\' => out.push_str(&format!("\\{:03o}", c as u32)),
                c => out.push(c),
            }
        }
        out
    }

    proptest! {
        /// Any line the kernel could write parses back to what it was made of.
        #[test]
        fn kernel_lines_round_trip(
            id in 0u64..100_000,
            parent in 0u64..100_000,
            major in 0u32..4096,
            minor in 0u32..1_000_000,
            root in "/[a-z \\\\\t]{0,12}",
            point in "/[a-zA-Z0-9 _.\\\\\n-]{0,20}",
            opts in proptest::sample::subsequence(vec!["nosuid", "nodev", "noexec", "noatime", "relatime"], 0..5),
            ro in any::<bool>(),
            optional in proptest::collection::vec("(shared|master):[0-9]{1,3}", 0..3),
            fs_type in "[a-z0-9]{1,8}",
            source in "[a-zA-Z0-9/:. ]{1,16}",
        ) {
            let mut options = vec![if ro { "ro" } else { "rw" }];
            options.extend(opts.iter().copied());
            let mut fields = vec![
                id.to_string(), parent.to_string(), format!("{major}:{minor}"),
                escape(&root), escape(&point), options.join(","),
            ];
            fields.extend(optional.iter().cloned());
            fields.push("-".into());
            fields.push(fs_type.clone());
            fields.push(escape(&source));
            fields.push("rw".into());
            let m = parse_line(&fields.join(" ")).unwrap();
            prop_assert_eq!((m.id, m.parent_id, m.dev), (id, parent, (major, minor)));
            prop_assert_eq!(&m.root, Path::new(&root));
            prop_assert_eq!(&m.mount_point, Path::new(&point));
            prop_assert_eq!(&m.fs_type, &fs_type);
            prop_assert_eq!(&m.source, &source);
            let flags = m.flags();
            prop_assert_eq!(flags.read_only, ro);
            prop_assert_eq!(PerMountFlags::from_options(flags.to_options()), flags);
            prop_assert_eq!(flags.nosuid, opts.contains(&"nosuid"));
        }

        /// Arbitrary bytes never panic the parser.
        #[test]
        fn garbage_never_panics(line in ".{0,200}") {
            let _ = parse_line(&line);
            let _ = MountTable::parse(&line);
        }
    }

    const FIXTURE: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 0:25 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
40 22 8:1 /var/hpp/pool /var/lib/kubelet/pods/p1/volumes/kubernetes.io~csi/pvc-1/mount rw,relatime shared:1 - ext4 /dev/sda1 rw
41 22 8:1 /var/hpp/pool/pvc-2 /mnt/target\\040with\\040space ro,relatime shared:1 - ext4 /dev/sda1 rw
50 22 253:0 / /var/hpp/xfs rw,relatime - xfs /dev/mapper/vg-data rw,attr2,prjquota
51 50 253:0 /pvc-3 /var/hpp/xfs/pvc-3/inner rw - xfs /dev/mapper/vg-data rw
";

    #[test]
    fn parses_fields_and_escapes() {
        let t = MountTable::parse(FIXTURE);
        assert_eq!(t.mounts().len(), 6);
        let m = &t.mounts()[3];
        assert_eq!(m.mount_point, Path::new("/mnt/target with space"));
        assert_eq!(m.root, Path::new("/var/hpp/pool/pvc-2"));
        assert!(m.read_only());
        assert_eq!(m.fs_type, "ext4");
        assert_eq!(m.source, "/dev/sda1");
        assert_eq!(t.mounts()[4].dev, (253, 0));
        assert!(parse_line("garbage").is_none());
        assert_eq!((m.id, m.parent_id), (41, 22));
        assert!(m.flags().read_only && !m.flags().nosuid);
        let proc_flags = t.mounts()[1].flags();
        assert!(proc_flags.nosuid && proc_flags.nodev && proc_flags.noexec && !proc_flags.read_only);
        assert_eq!(unescape("a\\134b\\011"), "a\\b\t");
        assert!(t.mounts()[4].project_quota());
        assert!(!t.mounts()[0].project_quota());
    }

    #[test]
    fn answers_mount_questions() {
        let t = MountTable::parse(FIXTURE);
        assert!(t.is_mount_point(Path::new("/var/hpp/xfs")));
        assert!(!t.is_mount_point(Path::new("/var/hpp/pool")));
        assert_eq!(t.containing(Path::new("/var/hpp/pool/x")).unwrap().dev, (8, 1));
        assert_eq!(
            t.fs_location(Path::new("/var/hpp/xfs/pvc-3")).unwrap(),
            ((253, 0), PathBuf::from("/pvc-3"))
        );
        let binds = t.bind_mounts_of(Path::new("/var/hpp/pool/pvc-2"));
        assert_eq!(binds, vec![PathBuf::from("/mnt/target with space")]);
        // The pool itself is bind-mounted once (entry 40) and contains pvc-2's mount (41).
        assert_eq!(t.bind_mounts_of(Path::new("/var/hpp/pool")).len(), 2);
        assert!(t.bind_mounts_of(Path::new("/var/hpp/pool/pvc-9")).is_empty());
        let at = t.binds_of_at(Path::new("/var/hpp/pool/pvc-2"), Path::new("/mnt/target with space"));
        assert_eq!(at.len(), 1);
        assert!(
            t.binds_of_at(Path::new("/var/hpp/pool"), Path::new("/mnt/target with space"))
                .is_empty()
        );
        assert_eq!(
            t.mounts_below(Path::new("/var/hpp/xfs/pvc-3")),
            vec![PathBuf::from("/var/hpp/xfs/pvc-3/inner")]
        );
    }
}
