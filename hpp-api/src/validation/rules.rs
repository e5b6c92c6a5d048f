//! Per-field rules called from the `garde` derives on the CRD types. Each returns a message that
//! says what is wrong and what is allowed.

use crate::constants::KNOWN_SNAPSHOT_PROVIDERS;

const PULL_POLICIES: &[&str] = &["Always", "IfNotPresent", "Never"];

/// `imagePullPolicy`: one of the Kubernetes pull policies.
pub fn image_pull_policy(value: &Option<String>, _ctx: &()) -> garde::Result {
    match value {
        Some(v) if !PULL_POLICIES.contains(&v.as_str()) => Err(garde::Error::new(format!(
            "unknown pull policy {v:?}; allowed: {}",
            PULL_POLICIES.join(", ")
        ))),
        _ => Ok(()),
    }
}

/// Pool names end up in object and volume names, so they must be DNS-1123 labels.
pub fn pool_name(value: &str, _ctx: &()) -> garde::Result {
    if value.is_empty() || is_dns1123_label(value) {
        // Emptiness is reported by the length rule.
        Ok(())
    } else {
        Err(garde::Error::new(format!(
            "{value:?} is not a valid pool name: use lower case letters, digits and '-', starting and ending with a letter or digit"
        )))
    }
}

/// Host paths must be absolute and normalised so that string comparison finds duplicates and
/// nesting, and so that no component can walk out of the intended directory.
pub fn host_path(value: &str, _ctx: &()) -> garde::Result {
    if value.is_empty() {
        // Emptiness is reported once, by the length rule or the cross-field validator.
        return Ok(());
    }
    check_host_path(value).map_err(garde::Error::new)
}

/// `snapshotProvider`: a provider hpp implements.
pub fn snapshot_provider(value: &Option<String>, _ctx: &()) -> garde::Result {
    value
        .as_deref()
        .map_or(Ok(()), |v| check_snapshot_provider(v).map_err(garde::Error::new))
}

/// `ephemeral.maxSize`: a positive storage quantity such as `10Gi`.
pub fn max_size(value: &Option<String>, _ctx: &()) -> garde::Result {
    value
        .as_deref()
        .map_or(Ok(()), |v| check_max_size(v).map(|_| ()).map_err(garde::Error::new))
}

/// `overcommitPercent`: 1 to 1000 (% of the filesystem size that may be promised to volumes).
pub fn overcommit_percent(value: &Option<u32>, _ctx: &()) -> garde::Result {
    value.map_or(Ok(()), |v| check_overcommit_percent(v).map_err(garde::Error::new))
}

/// `trash.retention`: a duration [`crate::duration::parse`] reads (`0` turns the trash off).
pub fn trash_retention(value: &Option<String>, _ctx: &()) -> garde::Result {
    value.as_deref().map_or(Ok(()), |v| {
        check_trash_retention(v).map(|_| ()).map_err(garde::Error::new)
    })
}

/// `volumeAudit.interval`: a duration of at least one minute.
pub fn audit_interval(value: &Option<String>, _ctx: &()) -> garde::Result {
    let audit = crate::v1beta1::VolumeAudit {
        interval: value.clone(),
    };
    audit.interval().map(|_| ()).map_err(garde::Error::new)
}

/// `trash.minFreePercent`: 0 to 99 (% of the filesystem kept free by purging the trash early).
pub fn trash_min_free_percent(value: &Option<u32>, _ctx: &()) -> garde::Result {
    value.map_or(Ok(()), |v| check_trash_min_free_percent(v).map_err(garde::Error::new))
}

// The pool rules themselves, shared by the CR's validation (the garde wrappers above) and the
// CSI driver's `--datadir` (hpp-csi's config), so both refuse the same values with the same
// words. Each message says what is wrong and what is allowed, without naming the field: the
// caller names it (`spec.storagePools[0].overcommitPercent: …`, `storage pool "a": overcommitPercent: …`).

/// A snapshot provider hpp implements ([`KNOWN_SNAPSHOT_PROVIDERS`]).
pub fn check_snapshot_provider(value: &str) -> Result<(), String> {
    if KNOWN_SNAPSHOT_PROVIDERS.contains(&value) {
        Ok(())
    } else {
        Err(format!(
            "unknown snapshot provider {value:?}; allowed: {}",
            KNOWN_SNAPSHOT_PROVIDERS.join(", ")
        ))
    }
}

/// A largest ephemeral volume written as a quantity (`10Gi`): its bytes, positive.
pub fn check_max_size(value: &str) -> Result<u64, String> {
    match crate::quantity::parse_bytes(value) {
        Some(bytes) if bytes > 0 => Ok(bytes),
        _ => Err(not_a_positive_size(&format!("{value:?}"))),
    }
}

/// A largest ephemeral volume given as a byte count (the driver's `ephemeralMaxBytes`).
pub fn check_max_bytes(bytes: u64) -> Result<(), String> {
    if bytes > 0 {
        Ok(())
    } else {
        Err(not_a_positive_size("0"))
    }
}

fn not_a_positive_size(shown: &str) -> String {
    format!("{shown} is not a positive storage quantity; use a size such as 512Mi or 10Gi")
}

/// Overcommit: 1 to 1000 % of the filesystem size.
pub fn check_overcommit_percent(value: u32) -> Result<(), String> {
    if (1..=1000).contains(&value) {
        Ok(())
    } else {
        Err(format!(
            "{value} is out of range; use a percentage of the filesystem size from 1 to 1000 (100 promises exactly the filesystem size)"
        ))
    }
}

/// A trash retention: a duration of at most ten years (`0`: no trash).
pub fn check_trash_retention(value: &str) -> Result<std::time::Duration, String> {
    crate::duration::parse(value).map_err(|e| e.to_string())
}

/// The trash's free-space floor: 0 to 99 % of the filesystem.
pub fn check_trash_min_free_percent(value: u32) -> Result<(), String> {
    if value <= 99 {
        Ok(())
    } else {
        Err(format!(
            "{value} is out of range; use a percentage of the filesystem size from 0 to 99 (0 never purges early)"
        ))
    }
}

/// `overlayClassName`: a valid StorageClass name.
pub fn overlay_class_name(value: &Option<String>, _ctx: &()) -> garde::Result {
    match value {
        Some(v) if !is_dns1123_subdomain(v) => Err(garde::Error::new(format!(
            "{v:?} is not a valid StorageClass name: use at most 253 lower case letters, digits, '-' and '.', starting and ending with a letter or digit"
        ))),
        _ => Ok(()),
    }
}

/// Checks that `value` is an absolute, normalised path other than `/`; the error says why not.
pub fn check_host_path(value: &str) -> Result<(), String> {
    let problem = if value.is_empty() {
        Some("must be set")
    } else if !value.starts_with('/') {
        Some("must be absolute (start with '/')")
    } else if value == "/" {
        Some("must not be the root directory")
    } else if value.contains('\0') || value.contains('\n') {
        Some("must not contain NUL or newline characters")
    } else if value.ends_with('/') {
        Some("must not end with '/'")
    } else if value.contains("//") {
        Some("must not contain duplicate '/'")
    } else if value.split('/').any(|c| c == "." || c == "..") {
        Some("must not contain '.' or '..' components")
    } else {
        None
    };
    match problem {
        None => Ok(()),
        Some(p) => Err(format!(
            "{p}; an absolute, normalised host path such as /var/hpvolumes is required, got {value:?}"
        )),
    }
}

/// DNS-1123 label: at most 63 of `[a-z0-9-]`, alphanumeric at both ends.
pub fn is_dns1123_label(value: &str) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// DNS-1123 subdomain: dot-separated labels, at most 253 characters.
pub fn is_dns1123_subdomain(value: &str) -> bool {
    !value.is_empty() && value.len() <= 253 && value.split('.').all(is_dns1123_label)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_paths() {
        assert!(check_host_path("/var/hpvolumes").is_ok());
        assert!(check_host_path("/a/b.c/d..e").is_ok());
        for bad in ["", "var", "/", "/a/", "/a//b", "/a/../b", "/a/./b", "/..", "/a\0b"] {
            assert!(check_host_path(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn dns_names() {
        assert!(is_dns1123_label("local"));
        assert!(is_dns1123_label("a-1"));
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"a".repeat(64)] {
            assert!(!is_dns1123_label(bad), "{bad:?} accepted");
        }
        assert!(is_dns1123_subdomain("hpp-overlay.example"));
        assert!(!is_dns1123_subdomain("a..b"));
    }
}
