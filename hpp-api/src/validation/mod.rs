//! Validation of `HostPathProvisioner` objects.
//!
//! Two layers: `garde` derives on the types check each field on its own (and the simple bounds
//! also land in the CRD schema), and [`ValidateCreate`] / [`ValidateUpdate`] add the rules that
//! need the whole spec or the previous object. Every error names the field by the JSON path the
//! user wrote (`spec.storagePools[1].path`).

pub mod rules;

use std::fmt;

use garde::Validate;

use crate::constants::{FEATURE_GATE_SNAPSHOTTING, KNOWN_FEATURE_GATES};
use crate::v1beta1::{HostPathProvisioner, HostPathProvisionerSpec};

/// One rejected field.
#[derive(Clone, Debug, PartialEq, Eq)]
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

/// Every problem found in an object, in field order.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ValidationErrors(pub Vec<FieldError>);

impl ValidationErrors {
    /// The individual field errors.
    pub fn errors(&self) -> &[FieldError] {
        &self.0
    }

    /// Whether some error is reported for exactly this JSON path.
    pub fn has_path(&self, path: &str) -> bool {
        self.0.iter().any(|e| e.path == path)
    }

    fn into_result(self) -> Result<(), Self> {
        if self.0.is_empty() { Ok(()) } else { Err(self) }
    }
}

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
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
        let mut errors = field_errors(self);
        errors.extend(cross_field_errors(self));
        errors.sort_by(|a, b| a.path.cmp(&b.path));
        errors.dedup();
        ValidationErrors(errors).into_result()
    }
}

impl ValidateUpdate for HostPathProvisionerSpec {
    fn validate_update(&self, old: &Self) -> Result<(), ValidationErrors> {
        let old_errors = old.validate_create().err().map(|e| e.0).unwrap_or_default();
        let mut errors: Vec<FieldError> = self
            .validate_create()
            .err()
            .map(|e| e.0)
            .unwrap_or_default()
            .into_iter()
            .filter(|e| !old_errors.contains(e))
            .collect();
        errors.extend(immutability_errors(self, old));
        ValidationErrors(errors).into_result()
    }
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
    for (j, pool) in pools.iter().enumerate() {
        for (i, earlier) in pools[..j].iter().enumerate() {
            if !pool.name.is_empty() && pool.name == earlier.name {
                errors.push(FieldError::new(
                    format!("spec.storagePools[{j}].name"),
                    format!(
                        "{:?} is already used by spec.storagePools[{i}].name; pool names must be unique",
                        pool.name
                    ),
                ));
            }
            if !pool.path.is_empty() && pool.path == earlier.path {
                errors.push(FieldError::new(
                    format!("spec.storagePools[{j}].path"),
                    format!(
                        "{:?} is already used by spec.storagePools[{i}].path; pool paths must be unique",
                        pool.path
                    ),
                ));
            }
        }
        for (i, other) in pools.iter().enumerate() {
            if i != j && is_strictly_inside(&pool.path, &other.path) {
                errors.push(FieldError::new(
                    format!("spec.storagePools[{j}].path"),
                    format!(
                        "{:?} is inside spec.storagePools[{i}].path {:?}; pool paths must not be nested, or one pool's volumes would appear in the other",
                        pool.path, other.path
                    ),
                ));
            }
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
    let old_pools = old.storage_pools.as_deref().unwrap_or_default();
    for (i, pool) in new.storage_pools.as_deref().unwrap_or_default().iter().enumerate() {
        if let Some(before) = old_pools.iter().find(|p| p.name == pool.name)
            && before.path != pool.path
        {
            errors.push(FieldError::new(
                format!("spec.storagePools[{i}].path"),
                format!(
                    "cannot change from {:?} to {:?} while pool {:?} exists: its volumes live in the old directory; add a pool with a new name instead",
                    before.path, pool.path, pool.name
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
