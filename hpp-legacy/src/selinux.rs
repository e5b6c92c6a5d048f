//! Labels new volume directories `container_file_t` on SELinux-enforcing hosts, so containers
//! can use them without a manual `chcon` or the old systemd unit.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

/// Extended attribute holding a file's SELinux context.
pub const XATTR_NAME: &str = "security.selinux";
/// Type that container runtimes allow every container to read and write.
pub const CONTAINER_FILE_TYPE: &str = "container_file_t";
/// Where the kernel says whether SELinux is enforcing.
pub const DEFAULT_ENFORCE_PATH: &str = "/sys/fs/selinux/enforce";

/// Context for a new volume directory given the parent's context (if readable): type
/// `container_file_t`, SELinux user `system_u`, role `object_r`, and the lowest sensitivity of
/// the parent's level without categories, so every container (whatever its MCS pair) may use it.
pub fn container_file_context(parent: Option<&str>) -> String {
    let sensitivity = parent
        .map(|c| c.trim_end_matches('\0'))
        .and_then(|c| c.splitn(4, ':').nth(3))
        .map(|level| level.split([':', '-']).next().unwrap_or("s0"))
        .filter(|s| s.len() > 1 && s.starts_with('s') && s[1..].chars().all(|c| c.is_ascii_digit()))
        .unwrap_or("s0");
    format!("system_u:object_r:{CONTAINER_FILE_TYPE}:{sensitivity}")
}

/// Whether `enforce` (the content of `/sys/fs/selinux/enforce`) means enforcing.
pub fn is_enforcing_text(enforce: &str) -> bool {
    enforce.trim() == "1"
}

/// Sets contexts on new directories when the host enforces SELinux; a no-op otherwise.
#[derive(Clone, Debug)]
pub struct Labeler {
    enforce_path: PathBuf,
}

impl Default for Labeler {
    fn default() -> Self {
        Labeler::new(DEFAULT_ENFORCE_PATH)
    }
}

impl Labeler {
    /// A labeler reading the enforce flag from `enforce_path` (tests point it elsewhere).
    pub fn new(enforce_path: impl Into<PathBuf>) -> Self {
        Labeler {
            enforce_path: enforce_path.into(),
        }
    }

    /// Whether labels are applied; read on every call so a mode switch needs no restart.
    pub fn enforcing(&self) -> bool {
        std::fs::read_to_string(&self.enforce_path).is_ok_and(|s| is_enforcing_text(&s))
    }

    /// Labels `dir` (an open directory) after the context of `parent`. Returns the context set,
    /// or `None` when SELinux is not enforcing.
    pub fn label(&self, parent: impl AsFd, dir: impl AsFd, path: &Path) -> crate::Result<Option<String>> {
        if !self.enforcing() {
            return Ok(None);
        }
        let mut buf = vec![0u8; 256];
        let parent_ctx = rustix::fs::fgetxattr(parent, XATTR_NAME, &mut buf[..])
            .ok()
            .and_then(|n| std::str::from_utf8(&buf[..n]).ok().map(str::to_owned));
        let ctx = container_file_context(parent_ctx.as_deref());
        let mut value = ctx.clone().into_bytes();
        value.push(0);
        rustix::fs::fsetxattr(dir, XATTR_NAME, &value, rustix::fs::XattrFlags::empty())
            .map_err(|e| crate::Error::fs("setxattr security.selinux", path, e))?;
        Ok(Some(ctx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_from_parent() {
        assert_eq!(container_file_context(None), "system_u:object_r:container_file_t:s0");
        assert_eq!(
            container_file_context(Some("unconfined_u:object_r:var_lib_t:s0\0")),
            "system_u:object_r:container_file_t:s0"
        );
        assert_eq!(
            container_file_context(Some("system_u:object_r:container_file_t:s0:c12,c34")),
            "system_u:object_r:container_file_t:s0"
        );
        assert_eq!(
            container_file_context(Some("system_u:object_r:default_t:s2-s15:c0.c1023")),
            "system_u:object_r:container_file_t:s2"
        );
        assert_eq!(
            container_file_context(Some("garbage")),
            "system_u:object_r:container_file_t:s0"
        );
        assert_eq!(
            container_file_context(Some("a:b:c:xyz")),
            "system_u:object_r:container_file_t:s0"
        );
    }

    #[test]
    fn enforce_flag() {
        assert!(is_enforcing_text("1\n"));
        assert!(!is_enforcing_text("0\n"));
        assert!(!is_enforcing_text(""));
    }

    #[test]
    fn labeler_is_a_noop_without_selinux() {
        let dir = tempfile::tempdir().unwrap();
        let missing = Labeler::new(dir.path().join("no-such-file"));
        assert!(!missing.enforcing());
        let flag = dir.path().join("enforce");
        std::fs::write(&flag, "0").unwrap();
        let off = Labeler::new(&flag);
        let f = std::fs::File::open(dir.path()).unwrap();
        assert_eq!(off.label(&f, &f, dir.path()).unwrap(), None);
        std::fs::write(&flag, "1").unwrap();
        assert!(Labeler::new(&flag).enforcing());
    }
}
