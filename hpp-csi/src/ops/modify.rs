//! VolumeAttributesClass parameters (CSI `mutable_parameters`): which keys a pool accepts. The
//! keys and their values are parsed in [`hpp_fs::quota::Tuning`]; here a known key the pool's
//! backend cannot apply is refused up front, naming the key and the backend, so a class that
//! means nothing on this pool fails loudly instead of being silently ignored.

use std::collections::HashMap;
use std::os::fd::AsFd;

use hpp_fs::quota::Tuning;

use crate::error::{Error, Result};
use crate::ops::expand::quota_error;
use crate::pool::Pool;

/// Parses `params` for volumes of `pool`: InvalidArgument for an unknown key, a bad value, or
/// a key the pool's backend does not apply.
pub fn parse(pool: &Pool, params: &HashMap<String, String>) -> Result<Tuning> {
    let tuning = Tuning::parse(params).map_err(|e| Error::InvalidArgument(e.to_string()))?;
    let supported: Vec<&str> = pool.quota.parameters().iter().map(|(key, _)| *key).collect();
    if let Some(key) = tuning.keys().into_iter().find(|k| !supported.contains(k)) {
        return Err(Error::InvalidArgument(format!(
            "mutable parameter {key} is not supported by quota backend {} of storage pool {} (it supports: {})",
            pool.quota.name(),
            pool.name,
            if supported.is_empty() {
                "none".to_owned()
            } else {
                supported.join(", ")
            }
        )));
    }
    Ok(tuning)
}

/// Applies `tuning` to volume `id` of `pool` while it may be published (the caller holds the
/// volume's lock). Nothing to apply is success without touching the backend.
pub fn apply(pool: &Pool, id: &str, tuning: &Tuning) -> Result<()> {
    if tuning.is_empty() {
        return Ok(());
    }
    let dir = pool.open()?;
    for (key, value) in tuning.pairs() {
        pool.quota
            .set_parameter(dir.as_fd(), id, key, &value)
            .map_err(quota_error)?;
    }
    tracing::info!(volume_id = %id, pool = %pool.name, keys = ?tuning.keys(), "volume modified");
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::config::PoolConfig;

    #[test]
    fn keys_the_backend_cannot_apply_are_refused_by_name() {
        let root = tempfile::tempdir().unwrap();
        let pool = Pool::prepare(&PoolConfig::new("p", root.path().join("p"))).unwrap();
        let params = |k: &str, v: &str| HashMap::from([(k.to_owned(), v.to_owned())]);
        assert!(parse(&pool, &HashMap::new()).is_ok_and(|t| t.is_empty()));
        let e = parse(&pool, &params("inodeLimit", "10")).unwrap_err().to_string();
        assert!(e.contains("inodeLimit") && e.contains("none"), "{e}");
        let e = parse(&pool, &params("color", "blue")).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(m) if m.contains("color")));
    }
}
