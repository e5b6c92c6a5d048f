//! Per-field rules called from the `garde` derives on the CRD types. Each returns a message that
//! says what is wrong and what is allowed.

pub use crate::rules::*;

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

/// `overlayClassName`: a valid StorageClass name.
pub fn overlay_class_name(value: &Option<String>, _ctx: &()) -> garde::Result {
    match value {
        Some(v) if !is_dns1123_subdomain(v) => Err(garde::Error::new(format!(
            "{v:?} is not a valid StorageClass name: use at most 253 lower case letters, digits, '-' and '.', starting and ending with a letter or digit"
        ))),
        _ => Ok(()),
    }
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
