//! Parser for `/proc/self/mountinfo` and the questions the driver asks of the mount table.
//! Parsing is pure and tested on fixtures; only [`MountTable::read`] does I/O.

use std::path::{Path, PathBuf};

/// One line of mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
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
}

impl Mount {
    /// Whether the mount is read-only.
    pub fn read_only(&self) -> bool {
        self.options.iter().any(|o| o == "ro")
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
    let _mount_id = fields.next()?;
    let _parent_id = fields.next()?;
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
    Some(Mount {
        dev,
        root,
        mount_point,
        options,
        fs_type,
        source,
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
    use super::*;

    const FIXTURE: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 0:25 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
40 22 8:1 /var/hpp/pool /var/lib/kubelet/pods/p1/volumes/kubernetes.io~csi/pvc-1/mount rw,relatime shared:1 - ext4 /dev/sda1 rw
41 22 8:1 /var/hpp/pool/pvc-2 /mnt/target\\040with\\040space ro,relatime shared:1 - ext4 /dev/sda1 rw
50 22 253:0 / /var/hpp/xfs rw,relatime - xfs /dev/mapper/vg-data rw,attr2
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
        assert_eq!(unescape("a\\134b\\011"), "a\\b\t");
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
        assert_eq!(
            t.mounts_below(Path::new("/var/hpp/xfs/pvc-3")),
            vec![PathBuf::from("/var/hpp/xfs/pvc-3/inner")]
        );
    }
}
