//! Validation of `HostPathProvisioner` objects.
//!
//! Two layers: `garde` derives on the types check each field on its own (and the simple bounds
//! also land in the CRD schema), and [`ValidateCreate`] / [`ValidateUpdate`] add the rules that
//! need the whole spec or the previous object. Every error names the field by the JSON path the
//! user wrote (`spec.storagePools[1].path`).
//!
//! The cost is bounded whatever the input: more than [`MAX_STORAGE_POOLS`] pools is one error and
//! no per-pool work, duplicates are found with hash sets (one error per repeated pool, not per
//! pair), UPDATE compares error sets in O(n), and at most [`MAX_REPORTED_ERRORS`] errors are
//! kept ("and N more").

pub mod rules;
pub mod worst_case;

use std::collections::{HashMap, HashSet};
use std::fmt;

use garde::Validate;

use crate::constants::{
    FEATURE_GATE_SNAPSHOTTING, KNOWN_FEATURE_GATES, MAX_FEATURE_GATES, MAX_REPORTED_ERRORS, MAX_STORAGE_POOLS,
};
use crate::v1beta1::{HostPathProvisioner, HostPathProvisionerSpec};

/// One rejected field.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FieldError {
    /// JSON path of the field, e.g. `spec.storagePools[1].path`.
    pub path: String,
    /// What is wrong and what is allowed.
    pub message: String,
}

impl FieldError {
    fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// The problems found in an object, in field order: the first [`MAX_REPORTED_ERRORS`], and how
/// many more there were.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ValidationErrors {
    errors: Vec<FieldError>,
    omitted: usize,
}

impl ValidationErrors {
    /// Keeps the first [`MAX_REPORTED_ERRORS`] of `errors` and counts the rest.
    pub fn new(mut errors: Vec<FieldError>) -> Self {
        let omitted = errors.len().saturating_sub(MAX_REPORTED_ERRORS);
        errors.truncate(MAX_REPORTED_ERRORS);
        Self { errors, omitted }
    }

    /// The reported field errors (at most [`MAX_REPORTED_ERRORS`]).
    pub fn errors(&self) -> &[FieldError] {
        &self.errors
    }

    /// How many further errors were found but not reported.
    pub fn omitted(&self) -> usize {
        self.omitted
    }

    /// Whether some error is reported for exactly this JSON path.
    pub fn has_path(&self, path: &str) -> bool {
        self.errors.iter().any(|e| e.path == path)
    }

    fn result(errors: Vec<FieldError>) -> Result<(), Self> {
        if errors.is_empty() {
            Ok(())
        } else {
            Err(Self::new(errors))
        }
    }
}

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        if self.omitted > 0 {
            write!(f, "; and {} more", self.omitted)?;
        }
        Ok(())
    }
}

/// Validation of a new object.
pub trait ValidateCreate {
    /// Every rule that applies to an object on its own.
    fn validate_create(&self) -> Result<(), ValidationErrors>;
}

/// Validation of a change to an existing object.
pub trait ValidateUpdate {
    /// The create rules plus the rules that compare with `old`. Problems the old object already
    /// had are tolerated (ratcheting), so a CR accepted by an older release can still be edited
    /// and its finalizer removed.
    fn validate_update(&self, old: &Self) -> Result<(), ValidationErrors>;
}

impl ValidateCreate for HostPathProvisionerSpec {
    fn validate_create(&self) -> Result<(), ValidationErrors> {
        ValidationErrors::result(all_errors(self))
    }
}

impl ValidateUpdate for HostPathProvisionerSpec {
    fn validate_update(&self, old: &Self) -> Result<(), ValidationErrors> {
        // Full (bounded) lists on both sides, so ratcheting sees every old error, then one cap.
        let old_errors: HashSet<FieldError> = all_errors(old).into_iter().collect();
        let mut errors: Vec<FieldError> = all_errors(self)
            .into_iter()
            .filter(|e| !old_errors.contains(e))
            .collect();
        errors.extend(immutability_errors(self, old));
        ValidationErrors::result(errors)
    }
}

/// Every error of a spec on its own, sorted by path. Bounded: at most a few per pool, and a spec
/// with more than [`MAX_STORAGE_POOLS`] pools or [`MAX_FEATURE_GATES`] gates gets one error
/// without looking at the entries.
fn all_errors(spec: &HostPathProvisionerSpec) -> Vec<FieldError> {
    if let Some(errors) = count_errors(spec) {
        return errors;
    }
    let mut errors = field_errors(spec);
    errors.extend(cross_field_errors(spec));
    errors.sort_by(|a, b| a.path.cmp(&b.path));
    errors.dedup();
    errors
}

/// The list-length limits, checked before anything walks the lists.
fn count_errors(spec: &HostPathProvisionerSpec) -> Option<Vec<FieldError>> {
    let pools = spec.storage_pools.as_ref().map_or(0, Vec::len);
    let gates = spec.feature_gates.as_ref().map_or(0, Vec::len);
    let mut errors = Vec::new();
    if pools > MAX_STORAGE_POOLS {
        errors.push(FieldError::new(
            "spec.storagePools",
            format!("has {pools} pools; at most {MAX_STORAGE_POOLS} are allowed"),
        ));
    }
    if gates > MAX_FEATURE_GATES {
        errors.push(FieldError::new(
            "spec.featureGates",
            format!("has {gates} entries; at most {MAX_FEATURE_GATES} are allowed"),
        ));
    }
    (!errors.is_empty()).then_some(errors)
}

impl ValidateCreate for HostPathProvisioner {
    fn validate_create(&self) -> Result<(), ValidationErrors> {
        self.spec.validate_create()
    }
}

impl ValidateUpdate for HostPathProvisioner {
    fn validate_update(&self, old: &Self) -> Result<(), ValidationErrors> {
        self.spec.validate_update(&old.spec)
    }
}

/// Runs the `garde` derives and renames their Rust paths to JSON paths.
fn field_errors(spec: &HostPathProvisionerSpec) -> Vec<FieldError> {
    match spec.validate() {
        Ok(()) => Vec::new(),
        Err(report) => report
            .iter()
            .map(|(path, error)| FieldError::new(json_path(&path.to_string()), error.message().to_string()))
            .collect(),
    }
}

/// `storage_pools[1].path` → `spec.storagePools[1].path`. Every field is `camelCase` on the wire.
fn json_path(rust_path: &str) -> String {
    let mut out = String::from("spec");
    for segment in rust_path.split('.').filter(|s| !s.is_empty()) {
        out.push('.');
        let mut upper = false;
        for c in segment.chars() {
            if c == '_' {
                upper = true;
            } else if upper {
                out.extend(c.to_uppercase());
                upper = false;
            } else {
                out.push(c);
            }
        }
    }
    out
}

fn cross_field_errors(spec: &HostPathProvisionerSpec) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let pools = spec.storage_pools.as_deref().unwrap_or_default();
    match (&spec.path_config, pools.is_empty()) {
        (Some(_), false) => errors.push(FieldError::new(
            "spec.storagePools",
            "cannot be set together with spec.pathConfig; set exactly one of them (storagePools is preferred, pathConfig is deprecated)",
        )),
        (None, true) => errors.push(FieldError::new(
            "spec",
            "either spec.pathConfig or spec.storagePools must be set",
        )),
        _ => {}
    }
    if let Some(pc) = &spec.path_config
        && pc.path.is_empty()
    {
        errors.push(FieldError::new(
            "spec.pathConfig.path",
            "must be set: the absolute host directory volumes are created in, such as /var/hpvolumes",
        ));
    }
    // First index of each name and path: one error per repeated pool, pointing at the first use.
    let mut first_name: HashMap<&str, usize> = HashMap::with_capacity(pools.len());
    let mut first_path: HashMap<&str, usize> = HashMap::with_capacity(pools.len());
    for (j, pool) in pools.iter().enumerate() {
        if !pool.name.is_empty()
            && let Some(i) = first_name.insert(&pool.name, j)
        {
            first_name.insert(&pool.name, i);
            errors.push(FieldError::new(
                format!("spec.storagePools[{j}].name"),
                format!(
                    "{:?} is already used by spec.storagePools[{i}].name; pool names must be unique",
                    pool.name
                ),
            ));
        }
        if !pool.path.is_empty()
            && let Some(i) = first_path.insert(&pool.path, j)
        {
            first_path.insert(&pool.path, i);
            errors.push(FieldError::new(
                format!("spec.storagePools[{j}].path"),
                format!(
                    "{:?} is already used by spec.storagePools[{i}].path; pool paths must be unique",
                    pool.path
                ),
            ));
        }
    }
    // Nesting: each pool reports the first pool it is inside (pairs, but of at most
    // MAX_STORAGE_POOLS distinct entries).
    for (j, pool) in pools.iter().enumerate() {
        if let Some((i, other)) = pools
            .iter()
            .enumerate()
            .find(|(i, other)| *i != j && is_strictly_inside(&pool.path, &other.path))
        {
            errors.push(FieldError::new(
                format!("spec.storagePools[{j}].path"),
                format!(
                    "{:?} is inside spec.storagePools[{i}].path {:?}; pool paths must not be nested, or one pool's volumes would appear in the other",
                    pool.path, other.path
                ),
            ));
        }
    }
    for (k, gate) in spec.feature_gates.as_deref().unwrap_or_default().iter().enumerate() {
        if !KNOWN_FEATURE_GATES.contains(&gate.as_str()) {
            errors.push(FieldError::new(
                format!("spec.featureGates[{k}]"),
                format!(
                    "unknown feature gate {gate:?}; allowed: {}",
                    KNOWN_FEATURE_GATES.join(", ")
                ),
            ));
        }
    }
    errors
}

/// Whether `inner` is a proper sub-directory of `outer` (both already absolute and normalised).
fn is_strictly_inside(inner: &str, outer: &str) -> bool {
    outer.starts_with('/')
        && inner.len() > outer.len()
        && inner.starts_with(outer)
        && inner.as_bytes().get(outer.len()) == Some(&b'/')
}

fn immutability_errors(new: &HostPathProvisionerSpec, old: &HostPathProvisionerSpec) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let old_pools: HashMap<&str, &str> = old
        .storage_pools
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|p| (p.name.as_str(), p.path.as_str()))
        .collect();
    for (i, pool) in new.storage_pools.as_deref().unwrap_or_default().iter().enumerate() {
        if let Some(before_path) = old_pools.get(pool.name.as_str())
            && *before_path != pool.path
        {
            errors.push(FieldError::new(
                format!("spec.storagePools[{i}].path"),
                format!(
                    "cannot change from {:?} to {:?} while pool {:?} exists: its volumes live in the old directory; add a pool with a new name instead",
                    before_path, pool.path, pool.name
                ),
            ));
        }
    }
    if let (Some(before), Some(after)) = (&old.path_config, &new.path_config)
        && before.path != after.path
    {
        errors.push(FieldError::new(
            "spec.pathConfig.path",
            format!(
                "cannot change from {:?} to {:?}: existing volumes live in the old directory; move to spec.storagePools with a pool at the new path instead",
                before.path, after.path
            ),
        ));
    }
    errors
}

/// Warning of [`warnings`]: the `Snapshotting` gate without a pool that takes snapshots.
pub const WARNING_SNAPSHOTS_OFF: &str = "spec.featureGates: Snapshotting is set but no storage pool has a \
     snapshotProvider, so snapshots stay off and the csi-snapshotter is not deployed; set \
     snapshotProvider (reflink or btrfs) on a pool in spec.storagePools to enable them";

/// What an accepted spec does not do as it reads, for admission warnings. Never a reason to
/// reject: KubeVirt accepts such CRs.
pub fn warnings(spec: &HostPathProvisionerSpec) -> Vec<String> {
    let mut out = Vec::new();
    // A pathConfig CR serves one legacy pool, which never takes snapshots.
    let snapshot_pool = spec.path_config.is_none()
        && spec
            .storage_pools
            .iter()
            .flatten()
            .any(crate::v1beta1::StoragePool::takes_snapshots);
    if snapshotting_enabled(spec) && !snapshot_pool {
        out.push(WARNING_SNAPSHOTS_OFF.to_owned());
    }
    for (i, pool) in spec.storage_pools.iter().flatten().enumerate() {
        if let Some(trash) = &pool.trash
            && trash.min_free_percent.is_some()
            && !trash.is_on()
        {
            out.push(format!(
                "spec.storagePools[{i}].trash.minFreePercent: has no effect without a trash.retention \
                 other than 0, so deleted volumes of pool {:?} are removed at once; set retention \
                 (e.g. 72h) to keep them",
                pool.name
            ));
        }
    }
    out
}

/// Whether the `Snapshotting` feature gate is set.
pub fn snapshotting_enabled(spec: &HostPathProvisionerSpec) -> bool {
    spec.feature_gates
        .as_deref()
        .unwrap_or_default()
        .iter()
        .any(|g| g == FEATURE_GATE_SNAPSHOTTING)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_paths_are_camel_case() {
        assert_eq!(json_path("storage_pools[1].path"), "spec.storagePools[1].path");
        assert_eq!(json_path("image_pull_policy"), "spec.imagePullPolicy");
        assert_eq!(
            json_path("path_config.use_naming_prefix"),
            "spec.pathConfig.useNamingPrefix"
        );
    }

    #[test]
    fn nesting() {
        assert!(is_strictly_inside("/a/b", "/a"));
        assert!(!is_strictly_inside("/ab", "/a"));
        assert!(!is_strictly_inside("/a", "/a"));
        assert!(!is_strictly_inside("/a", "/a/b"));
    }
}
