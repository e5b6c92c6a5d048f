//! Refuses to provision onto a base directory that is not on the mount it should be on, so a
//! failed network mount never fills the host's root disk.

use std::path::{Component, Path, PathBuf};

use crate::decision::{Refusal, RefusalReason};
use crate::params::ClassParams;

/// Where the kernel lists the mounts of this process.
pub const MOUNTINFO_PATH: &str = "/proc/self/mountinfo";

/// One line of `/proc/self/mountinfo`, from hpp's one parser.
pub use hpp_fs::mountinfo::Mount as MountEntry;
use hpp_fs::mountinfo::MountTable;

/// Parses the text of `/proc/self/mountinfo`; malformed lines are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    MountTable::parse(text).mounts().to_vec()
}

/// The mount holding `path`: the longest mount point that is a prefix of it (the last one
/// listed wins when mounts are stacked on the same point).
pub fn containing_mount<'a>(entries: &'a [MountEntry], path: &Path) -> Option<&'a MountEntry> {
    entries
        .iter()
        .enumerate()
        .filter(|(_, e)| path.starts_with(&e.mount_point))
        .max_by_key(|(i, e)| (e.mount_point.components().count(), *i))
        .map(|(_, e)| e)
}

/// What the guard must see; `require_non_root` is on in shared mode even without parameters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GuardSpec {
    /// `expectedMount`.
    pub expected_mount: Option<PathBuf>,
    /// `expectedFsType`.
    pub expected_fs_types: Vec<String>,
    /// `mountMarker`.
    pub marker: Option<String>,
    /// Refuse a base directory that sits on the `/` mount.
    pub require_non_root: bool,
}

impl GuardSpec {
    /// The guard for a StorageClass; `shared` turns on the default "not on /" check.
    pub fn from_params(params: &ClassParams, shared: bool) -> Self {
        GuardSpec {
            expected_mount: params.expected_mount.clone(),
            expected_fs_types: params.expected_fs_types.clone(),
            marker: params.mount_marker.clone(),
            require_non_root: shared,
        }
    }

    /// Whether anything needs checking at all.
    pub fn is_active(&self) -> bool {
        self.expected_mount.is_some()
            || !self.expected_fs_types.is_empty()
            || self.marker.is_some()
            || self.require_non_root
    }
}

fn refuse(msg: String) -> Result<(), Refusal> {
    Err(Refusal::new(RefusalReason::MountGuard, msg))
}

/// Checks `base_dir` (already resolved, no symlinks) against `spec` given the mount table and
/// whether the marker file exists.
pub fn check(spec: &GuardSpec, base_dir: &Path, mounts: &[MountEntry], marker_present: bool) -> Result<(), Refusal> {
    if base_dir
        .components()
        .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
    {
        return refuse(format!("{} is not a resolved path", base_dir.display()));
    }
    let Some(mount) = containing_mount(mounts, base_dir) else {
        return refuse(format!("no mount holds {}", base_dir.display()));
    };
    if let Some(expected) = &spec.expected_mount
        && &mount.mount_point != expected
    {
        return refuse(format!(
            "{} is on mount {} but must be on {}: is the filesystem mounted?",
            base_dir.display(),
            mount.mount_point.display(),
            expected.display()
        ));
    }
    if !spec.expected_fs_types.is_empty() && !spec.expected_fs_types.contains(&mount.fs_type) {
        return refuse(format!(
            "{} is on a {} filesystem, expected one of: {}",
            base_dir.display(),
            mount.fs_type,
            spec.expected_fs_types.join(", ")
        ));
    }
    if let Some(marker) = &spec.marker
        && !marker_present
    {
        return refuse(format!(
            "marker file {marker} is missing in {}: is the filesystem mounted?",
            base_dir.display()
        ));
    }
    let explicit = spec.expected_mount.is_some() || !spec.expected_fs_types.is_empty() || spec.marker.is_some();
    if spec.require_non_root && !explicit && mount.mount_point == Path::new("/") {
        return refuse(format!(
            "{} is on the root filesystem, not on a shared mount (set expectedMount, expectedFsType or mountMarker)",
            base_dir.display()
        ));
    }
    Ok(())
}

/// Runs the guard against the live system.
pub fn check_live(spec: &GuardSpec, base_dir: &Path, mountinfo_path: &Path) -> Result<(), Refusal> {
    if !spec.is_active() {
        return Ok(());
    }
    let resolved = std::fs::canonicalize(base_dir).map_err(|e| {
        Refusal::new(
            RefusalReason::MountGuard,
            format!("cannot resolve {}: {e}", base_dir.display()),
        )
    })?;
    let text = std::fs::read_to_string(mountinfo_path).map_err(|e| {
        Refusal::new(
            RefusalReason::MountGuard,
            format!("cannot read {}: {e}", mountinfo_path.display()),
        )
    })?;
    let marker_present = spec
        .marker
        .as_ref()
        .is_some_and(|m| std::fs::symlink_metadata(resolved.join(m)).is_ok_and(|md| md.is_file()));
    check(spec, &resolved, &parse_mountinfo(&text), marker_present)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 0:35 / /mnt/ceph rw,relatime shared:20 - ceph 10.0.0.1:6789:/ rw,name=admin
41 22 0:36 / /mnt/with\\040space rw - nfs4 srv:/export rw
42 40 0:37 / /mnt/ceph rw - tmpfs tmpfs rw
";

    #[test]
    fn parse_and_lookup() {
        let m = parse_mountinfo(SAMPLE);
        assert_eq!(m.len(), 4);
        assert_eq!(m[2].mount_point, PathBuf::from("/mnt/with space"));
        assert_eq!(containing_mount(&m, Path::new("/var/x")).unwrap().fs_type, "ext4");
        // Stacked mounts: the last one is visible.
        assert_eq!(containing_mount(&m, Path::new("/mnt/ceph/v")).unwrap().fs_type, "tmpfs");
        assert_eq!(containing_mount(&m, Path::new("/mnt/cephX")).unwrap().fs_type, "ext4");
    }

    #[test]
    fn guard_decisions() {
        let m = parse_mountinfo(&SAMPLE.lines().take(3).collect::<Vec<_>>().join("\n"));
        let shared = GuardSpec {
            require_non_root: true,
            ..Default::default()
        };
        assert!(check(&shared, Path::new("/mnt/ceph/vols"), &m, false).is_ok());
        assert!(check(&shared, Path::new("/srv/vols"), &m, false).is_err());
        let fs = GuardSpec {
            expected_fs_types: vec!["ceph".into()],
            ..shared.clone()
        };
        assert!(check(&fs, Path::new("/mnt/ceph/vols"), &m, false).is_ok());
        assert!(check(&fs, Path::new("/mnt/with space/v"), &m, false).is_err());
        let mp = GuardSpec {
            expected_mount: Some("/mnt/ceph".into()),
            ..Default::default()
        };
        assert!(check(&mp, Path::new("/mnt/ceph"), &m, false).is_ok());
        let err = check(&mp, Path::new("/srv"), &m, false).unwrap_err();
        assert_eq!(err.reason, RefusalReason::MountGuard);
        let marker = GuardSpec {
            marker: Some(".mounted".into()),
            ..Default::default()
        };
        assert!(check(&marker, Path::new("/srv"), &m, true).is_ok());
        assert!(check(&marker, Path::new("/srv"), &m, false).is_err());
        assert!(check(&marker, Path::new("/srv/../etc"), &m, true).is_err());
        assert!(!GuardSpec::default().is_active());
    }
}
