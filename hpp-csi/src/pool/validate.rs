//! Validation of untrusted names and paths. Pure functions: a hostile request is rejected here
//! with `InvalidArgument` before anything touches the filesystem.

use std::path::{Component, Path};

use crate::error::{Error, Result};

/// Longest accepted volume or snapshot id. Kubernetes object names are at most 253 bytes and a
/// directory entry at most 255; the temporary prefix must still fit.
pub const MAX_ID_LEN: usize = 230;
/// Longest accepted target path (Linux `PATH_MAX` is 4096).
pub const MAX_PATH_LEN: usize = 4000;
/// Prefix of every name the driver itself creates next to volumes (temporaries, bookkeeping).
/// Volume ids may not start with a dot, so these can never collide with a volume.
pub const INTERNAL_PREFIX: &str = ".hpp-";

/// Checks a volume id, snapshot id or CreateVolume/CreateSnapshot name that becomes a single
/// directory name inside a pool: non-empty, at most [`MAX_ID_LEN`] bytes, no `/`, no NUL or
/// other control character, not `.`/`..` and no leading dot (reserved for driver internals).
pub fn check_id<'a>(what: &str, id: &'a str) -> Result<&'a str> {
    if id.is_empty() {
        return Err(Error::InvalidArgument(format!("{what} is required")));
    }
    if id.len() > MAX_ID_LEN {
        return Err(Error::InvalidArgument(format!(
            "{what} is {} bytes long; at most {MAX_ID_LEN} are allowed",
            id.len()
        )));
    }
    if id.contains('/') {
        return Err(Error::InvalidArgument(format!("{what} {id:?} must not contain '/'")));
    }
    if id.chars().any(char::is_control) {
        return Err(Error::InvalidArgument(format!(
            "{what} {id:?} must not contain NUL or control characters"
        )));
    }
    if id.starts_with('.') {
        return Err(Error::InvalidArgument(format!(
            "{what} {id:?} must not start with '.' (covers '.', '..' and driver-internal names)"
        )));
    }
    Ok(id)
}

/// Checks a pool name from configuration or a `storagePool` parameter. Same rules as ids: pool
/// names show up in pagination tokens and metric labels.
pub fn check_pool_name(name: &str) -> Result<&str> {
    check_id("storage pool name", name)
}

/// Checks a kubelet-provided target path: absolute, normalised (no `.` or `..` components, no
/// empty components), no NUL or control characters, bounded length, and not the root.
pub fn check_target_path<'a>(what: &str, path: &'a str) -> Result<&'a Path> {
    if path.is_empty() {
        return Err(Error::InvalidArgument(format!("{what} is required")));
    }
    if path.len() > MAX_PATH_LEN {
        return Err(Error::InvalidArgument(format!(
            "{what} is {} bytes long; at most {MAX_PATH_LEN} are allowed",
            path.len()
        )));
    }
    if path.chars().any(char::is_control) {
        return Err(Error::InvalidArgument(format!(
            "{what} {path:?} must not contain NUL or control characters"
        )));
    }
    if !path.starts_with('/') {
        return Err(Error::InvalidArgument(format!(
            "{what} {path:?} must be an absolute path"
        )));
    }
    if path.contains("//") || path.split('/').any(|c| c == "." || c == "..") {
        return Err(Error::InvalidArgument(format!(
            "{what} {path:?} must be normalised (no '.', '..' or empty components)"
        )));
    }
    let p = Path::new(path.trim_end_matches('/'));
    if p.components().all(|c| matches!(c, Component::RootDir)) {
        return Err(Error::InvalidArgument(format!("{what} must not be '/'")));
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_accept_pvc_names_and_reject_traversal() {
        assert!(check_id("volume id", "pvc-5b1c9c9e-1a2b-4c3d-8e9f-001122334455").is_ok());
        assert!(check_id("volume id", "csi-0123abcd").is_ok());
        assert!(check_id("volume id", "legacy volume with spaces").is_ok());
        for bad in ["", ".", "..", "../etc", "a/b", "/abs", "a\0b", ".hpp-tmp-x", "a\nb"] {
            let err = check_id("volume id", bad).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{bad:?}");
        }
        let long = "a".repeat(MAX_ID_LEN + 1);
        assert!(check_id("volume id", &long).is_err());
        assert!(check_id("volume id", &"a".repeat(MAX_ID_LEN)).is_ok());
    }

    #[test]
    fn target_paths_must_be_absolute_and_normalised() {
        assert_eq!(
            check_target_path("target", "/var/lib/kubelet/pods/x/mount/").unwrap(),
            Path::new("/var/lib/kubelet/pods/x/mount")
        );
        for bad in [
            "",
            "relative/path",
            "/",
            "/a/../b",
            "/a/./b",
            "/a//b",
            "/a/b\0",
            "/a/..",
        ] {
            assert!(check_target_path("target", bad).is_err(), "{bad:?}");
        }
        assert!(check_target_path("target", &format!("/{}", "a".repeat(MAX_PATH_LEN))).is_err());
    }

    proptest::proptest! {
        /// Whatever the input, an accepted id is one safe directory name inside the pool.
        #[test]
        fn accepted_ids_are_single_safe_components(id in "\\PC{0,40}|[./a-z\\x00\\n-]{0,12}") {
            if check_id("id", &id).is_ok() {
                let path = Path::new("/pool").join(&id);
                proptest::prop_assert_eq!(path.parent(), Some(Path::new("/pool")));
                proptest::prop_assert!(!id.starts_with('.') && !id.contains('/') && !id.contains('\0'));
                proptest::prop_assert!(!id.is_empty() && id.len() <= MAX_ID_LEN);
            }
        }

        /// Every accepted target path is absolute, normalised and never the root.
        #[test]
        fn accepted_target_paths_are_normal(path in "(/[a-z.]{0,4}){0,5}/?|[a-z./]{0,10}") {
            if let Ok(p) = check_target_path("target", &path) {
                proptest::prop_assert!(p.is_absolute());
                proptest::prop_assert!(p.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_))));
                proptest::prop_assert!(p != Path::new("/"));
            }
        }
    }
}
