//! The rules of CR fields that the CSI driver's `--datadir` shares, kube-free: the CR's
//! validation (`validation::rules`, garde wrappers around these) and hpp-csi's config call the
//! same functions, so both refuse the same values with the same words. Each message says what
//! is wrong and what is allowed, without naming the field: the caller names it
//! (`spec.storagePools[0].overcommitPercent: …`, `storage pool "a": overcommitPercent: …`).

use crate::constants::KNOWN_SNAPSHOT_PROVIDERS;

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
