//! StorageClass parameters understood by the provisioner, parsed and checked in one place so a
//! typo is reported on the claim instead of silently ignored.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// Base directory of shared mode (the classic `torchbox.com/hostpath` parameter).
pub const PARAM_PV_DIR: &str = "pvDir";
/// Directory-name template (see [`crate::template`]).
pub const PARAM_PATH_TEMPLATE: &str = "pathTemplate";
/// Octal mode of new directories, e.g. `"0770"`.
pub const PARAM_DIR_MODE: &str = "dirMode";
/// Owner uid of new directories.
pub const PARAM_UID: &str = "uid";
/// Owner gid of new directories.
pub const PARAM_GID: &str = "gid";
/// `"true"`: rename to `archived-…` instead of removing on delete.
pub const PARAM_ARCHIVE_ON_DELETE: &str = "archiveOnDelete";
/// Path that must be the mount point holding the base directory.
pub const PARAM_EXPECTED_MOUNT: &str = "expectedMount";
/// Comma-separated filesystem types the base directory must be on (e.g. `ceph,nfs4`).
pub const PARAM_EXPECTED_FS_TYPE: &str = "expectedFsType";
/// File name that must exist in the base directory (opt-in marker of a healthy mount).
pub const PARAM_MOUNT_MARKER: &str = "mountMarker";
/// `"true"`: set the CephFS quota xattr `ceph.quota.max_bytes` to the request (as the classic
/// shared provisioner did; enforced by CephFS clients).
pub const PARAM_CEPHFS_QUOTA: &str = "cephFSQuota";

const KNOWN: &[&str] = &[
    PARAM_PV_DIR,
    PARAM_PATH_TEMPLATE,
    PARAM_DIR_MODE,
    PARAM_UID,
    PARAM_GID,
    PARAM_ARCHIVE_ON_DELETE,
    PARAM_EXPECTED_MOUNT,
    PARAM_EXPECTED_FS_TYPE,
    PARAM_MOUNT_MARKER,
    PARAM_CEPHFS_QUOTA,
];

/// The parsed parameters of one StorageClass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClassParams {
    /// `pvDir`.
    pub pv_dir: Option<PathBuf>,
    /// `pathTemplate`.
    pub path_template: Option<String>,
    /// `dirMode`.
    pub dir_mode: Option<u32>,
    /// `uid`.
    pub uid: Option<u32>,
    /// `gid`.
    pub gid: Option<u32>,
    /// `archiveOnDelete`.
    pub archive_on_delete: bool,
    /// `expectedMount`.
    pub expected_mount: Option<PathBuf>,
    /// `expectedFsType`, split on commas.
    pub expected_fs_types: Vec<String>,
    /// `mountMarker`.
    pub mount_marker: Option<String>,
    /// `cephFSQuota`.
    pub cephfs_quota: bool,
}

/// A parameter that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("StorageClass parameter {key}: {reason}")]
pub struct ParamError {
    /// The offending key.
    pub key: String,
    /// What is wrong.
    pub reason: String,
}

fn bad(key: &str, reason: impl Into<String>) -> ParamError {
    ParamError {
        key: key.to_owned(),
        reason: reason.into(),
    }
}

fn absolute_dir(key: &str, value: &str) -> Result<PathBuf, ParamError> {
    let path = PathBuf::from(value);
    let clean = path
        .components()
        .all(|c| matches!(c, std::path::Component::RootDir | std::path::Component::Normal(_)));
    if !path.is_absolute() || !clean || path.parent().is_none() || value.contains('\0') {
        return Err(bad(key, "must be an absolute path other than / without . or .."));
    }
    Ok(path)
}

fn parse_bool(key: &str, value: &str) -> Result<bool, ParamError> {
    match value.to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(bad(key, "must be true or false")),
    }
}

impl ClassParams {
    /// Parses StorageClass `parameters`; unknown keys are errors. Keys are matched without
    /// regard to case, as the classic shared provisioner did (`pvdir` = `pvDir`).
    pub fn parse(params: Option<&BTreeMap<String, String>>) -> Result<Self, ParamError> {
        let mut out = ClassParams::default();
        let Some(params) = params else { return Ok(out) };
        for (key, value) in params {
            let canonical = KNOWN
                .iter()
                .find(|k| k.eq_ignore_ascii_case(key))
                .copied()
                .unwrap_or("");
            match canonical {
                PARAM_PV_DIR => out.pv_dir = Some(absolute_dir(key, value)?),
                PARAM_EXPECTED_MOUNT => out.expected_mount = Some(absolute_dir(key, value)?),
                PARAM_PATH_TEMPLATE => out.path_template = Some(value.clone()),
                PARAM_DIR_MODE => {
                    let digits = value.trim_start_matches("0o");
                    let mode = u32::from_str_radix(digits, 8)
                        .map_err(|_| bad(key, format!("{value:?} is not an octal mode")))?;
                    if mode > 0o3777 {
                        return Err(bad(key, "setuid and bits above 07777 are not allowed"));
                    }
                    out.dir_mode = Some(mode);
                }
                PARAM_UID | PARAM_GID => {
                    let id: u32 = value
                        .parse()
                        .map_err(|_| bad(key, format!("{value:?} is not a numeric id")))?;
                    if canonical == PARAM_UID {
                        out.uid = Some(id);
                    } else {
                        out.gid = Some(id);
                    }
                }
                PARAM_ARCHIVE_ON_DELETE => out.archive_on_delete = parse_bool(key, value)?,
                PARAM_CEPHFS_QUOTA => out.cephfs_quota = parse_bool(key, value)?,
                PARAM_EXPECTED_FS_TYPE => {
                    out.expected_fs_types = value
                        .split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned)
                        .collect();
                }
                PARAM_MOUNT_MARKER => {
                    if value.is_empty() || value.contains('/') || value == "." || value == ".." {
                        return Err(bad(key, "must be a plain file name"));
                    }
                    out.mount_marker = Some(value.clone());
                }
                _ => {
                    return Err(bad(key, format!("unknown parameter (known: {})", KNOWN.join(", "))));
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn parses_everything() {
        let m = map(&[
            ("pvDir", "/mnt/cephfs/volumes"),
            ("pathTemplate", "{namespace}/{pv}"),
            ("dirMode", "2770"),
            ("uid", "107"),
            ("gid", "107"),
            ("archiveOnDelete", "True"),
            ("expectedMount", "/mnt/cephfs"),
            ("expectedFsType", "ceph, fuse.ceph-fuse"),
            ("mountMarker", ".hpp-mounted"),
        ]);
        let p = ClassParams::parse(Some(&m)).unwrap();
        assert_eq!(p.pv_dir, Some(PathBuf::from("/mnt/cephfs/volumes")));
        assert_eq!(p.dir_mode, Some(0o2770));
        assert_eq!((p.uid, p.gid), (Some(107), Some(107)));
        assert!(p.archive_on_delete);
        assert_eq!(p.expected_fs_types, vec!["ceph", "fuse.ceph-fuse"]);
        assert_eq!(p.mount_marker.as_deref(), Some(".hpp-mounted"));
        assert_eq!(ClassParams::parse(None).unwrap(), ClassParams::default());
        // Classic torchbox.com/hostpath classes spell keys in any case.
        let old = map(&[("pvdir", "/mnt/ceph"), ("CEPHFSQUOTA", "true")]);
        let p = ClassParams::parse(Some(&old)).unwrap();
        assert_eq!(p.pv_dir, Some(PathBuf::from("/mnt/ceph")));
        assert!(p.cephfs_quota);
        // Owner ids too: `UID` is the uid, not the gid.
        let ids = map(&[("UID", "107"), ("Gid", "108")]);
        let p = ClassParams::parse(Some(&ids)).unwrap();
        assert_eq!((p.uid, p.gid), (Some(107), Some(108)));
    }

    #[test]
    fn rejects_bad_values() {
        for (k, v) in [
            ("pvDir", "relative"),
            ("pvDir", "/"),
            ("pvDir", "/mnt/../etc"),
            ("dirMode", "999"),
            ("dirMode", "4755"),
            ("uid", "-1"),
            ("gid", "root"),
            ("archiveOnDelete", "yes"),
            ("mountMarker", "../x"),
            ("typo", "1"),
        ] {
            let err = ClassParams::parse(Some(&map(&[(k, v)]))).unwrap_err();
            assert_eq!(err.key, k);
        }
    }
}
