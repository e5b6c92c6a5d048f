//! Lossless conversion between `v1alpha1` and `v1beta1`.
//!
//! Fields one version cannot express travel in the annotation
//! [`ANNOTATION_CONVERSION_DATA`]: on a v1alpha1 object it holds the v1beta1-only fields
//! (storage pools, feature gates, the volume audit, pool statuses, the node-loss and
//! volume-audit statuses, an absent `pathConfig`); on a v1beta1 object it holds the original
//! v1alpha1 `useNamingPrefix` string when that string is not plain `true`/`false`. Converting there and back gives the object you started
//! with, byte for byte once serialised.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::constants::ANNOTATION_CONVERSION_DATA;
use crate::{v1alpha1, v1beta1};

/// Why an object could not be converted.
#[derive(Debug, thiserror::Error)]
pub enum ConversionError {
    /// The object is not valid JSON for its declared version.
    #[error("object does not match {api_version}: {source}")]
    Decode {
        /// The apiVersion the object claimed.
        api_version: String,
        /// The underlying error.
        source: serde_json::Error,
    },
    /// The object could not be written back as JSON.
    #[error("cannot encode converted object: {0}")]
    Encode(serde_json::Error),
    /// The source or target version is not one this crate knows.
    #[error(
        "cannot convert to or from {0:?}: supported versions are hostpathprovisioner.kubevirt.io/v1alpha1 and hostpathprovisioner.kubevirt.io/v1beta1"
    )]
    UnknownVersion(String),
    /// The conversion annotation is corrupt.
    #[error("annotation {ANNOTATION_CONVERSION_DATA} is not valid: {0}")]
    Annotation(serde_json::Error),
}

/// Largest conversion annotation that still carries the pool statuses. The API server limits
/// all of an object's annotations together to 256 KiB and fails a conversion whose result is
/// over it, which would fail every v1alpha1 read; a cluster with thousands of per-node pool
/// PVCs gets there through `claimStatuses` (or a mass node loss through `nodeLoss`). Above
/// this the statuses are left out: only the
/// operator writes status, in v1beta1, and a v1alpha1 write of the main resource keeps the
/// stored status anyway (the status subresource).
pub const MAX_STATUS_ANNOTATION_BYTES: usize = 64 * 1024;

/// The v1beta1 fields a v1alpha1 object cannot hold.
#[derive(Serialize, Deserialize, Default, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Beta1Only {
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    path_config_absent: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    storage_pools: Option<Vec<v1beta1::StoragePool>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    feature_gates: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    storage_pool_statuses: Vec<v1beta1::StoragePoolStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    node_loss: Option<v1beta1::NodeLossStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    volume_audit: Option<v1beta1::VolumeAudit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    volume_audit_status: Option<v1beta1::VolumeAuditStatus>,
}

/// The v1alpha1 fields a v1beta1 object cannot hold.
#[derive(Serialize, Deserialize, Default, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Alpha1Only {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    use_naming_prefix: Option<String>,
}

fn take_annotation<T: for<'de> Deserialize<'de> + Default>(
    annotations: &mut Option<BTreeMap<String, String>>,
) -> Result<T, ConversionError> {
    let Some(map) = annotations.as_mut() else {
        return Ok(T::default());
    };
    let value = map.remove(ANNOTATION_CONVERSION_DATA);
    if map.is_empty() {
        *annotations = None;
    }
    match value {
        None => Ok(T::default()),
        Some(v) => serde_json::from_str(&v).map_err(ConversionError::Annotation),
    }
}

fn put_annotation<T: Serialize + Default + PartialEq>(
    annotations: &mut Option<BTreeMap<String, String>>,
    data: &T,
) -> Result<(), ConversionError> {
    if *data == T::default() {
        return Ok(());
    }
    let json = serde_json::to_string(data).map_err(ConversionError::Encode)?;
    annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(ANNOTATION_CONVERSION_DATA.to_string(), json);
    Ok(())
}

/// v1beta1 → v1alpha1. Never fails on the annotation: this is how stored objects are read, and
/// one failed conversion fails the API server's whole list or watch, so an annotation that does
/// not parse (anyone may write annotations) is dropped as if absent.
pub fn to_v1alpha1(obj: &v1beta1::HostPathProvisioner) -> Result<v1alpha1::HostPathProvisioner, ConversionError> {
    let mut metadata = obj.metadata.clone();
    let alpha_only: Alpha1Only = take_annotation(&mut metadata.annotations).unwrap_or_default();
    let spec = &obj.spec;
    let use_naming_prefix = spec
        .path_config
        .as_ref()
        .and_then(|pc| pc.use_naming_prefix)
        .map(|flag| {
            // Keep the user's original spelling when it still means the same thing.
            match &alpha_only.use_naming_prefix {
                Some(original) if original.eq_ignore_ascii_case("true") == flag => original.clone(),
                _ => flag.to_string(),
            }
        });
    let path_config = v1alpha1::PathConfig {
        path: spec.path_config.as_ref().map(|pc| pc.path.clone()).unwrap_or_default(),
        use_naming_prefix,
    };
    let mut beta_only = Beta1Only {
        path_config_absent: spec.path_config.is_none(),
        storage_pools: spec.storage_pools.clone(),
        feature_gates: spec.feature_gates.clone(),
        storage_pool_statuses: obj
            .status
            .as_ref()
            .map(|s| s.storage_pool_statuses.clone())
            .unwrap_or_default(),
        node_loss: obj.status.as_ref().and_then(|s| s.node_loss.clone()),
        volume_audit: spec.volume_audit.clone(),
        volume_audit_status: obj.status.as_ref().and_then(|s| s.volume_audit.clone()),
    };
    if serde_json::to_vec(&beta_only).map_or(0, |v| v.len()) > MAX_STATUS_ANNOTATION_BYTES {
        beta_only.storage_pool_statuses.clear();
        beta_only.node_loss = None;
        beta_only.volume_audit_status = None;
    }
    put_annotation(&mut metadata.annotations, &beta_only)?;
    Ok(v1alpha1::HostPathProvisioner {
        metadata,
        spec: v1alpha1::HostPathProvisionerSpec {
            image_pull_policy: spec.image_pull_policy.clone(),
            path_config,
            workload: spec.workload.clone(),
        },
        status: obj.status.as_ref().map(|s| v1alpha1::HostPathProvisionerStatus {
            conditions: s.conditions.clone(),
            observed_version: s.observed_version.clone(),
            operator_version: s.operator_version.clone(),
            target_version: s.target_version.clone(),
        }),
    })
}

/// v1alpha1 → v1beta1.
pub fn to_v1beta1(obj: &v1alpha1::HostPathProvisioner) -> Result<v1beta1::HostPathProvisioner, ConversionError> {
    let mut metadata = obj.metadata.clone();
    let beta_only: Beta1Only = take_annotation(&mut metadata.annotations)?;
    let pc = &obj.spec.path_config;
    let absent = beta_only.path_config_absent && pc.path.is_empty() && pc.use_naming_prefix.is_none();
    let path_config = (!absent).then(|| v1beta1::PathConfig {
        path: pc.path.clone(),
        use_naming_prefix: pc.use_naming_prefix.as_ref().map(|s| s.eq_ignore_ascii_case("true")),
    });
    let alpha_only = Alpha1Only {
        use_naming_prefix: pc.use_naming_prefix.clone().filter(|s| s != "true" && s != "false"),
    };
    put_annotation(&mut metadata.annotations, &alpha_only)?;
    Ok(v1beta1::HostPathProvisioner {
        metadata,
        spec: v1beta1::HostPathProvisionerSpec {
            image_pull_policy: obj.spec.image_pull_policy.clone(),
            path_config,
            storage_pools: beta_only.storage_pools,
            workload: obj.spec.workload.clone(),
            feature_gates: beta_only.feature_gates,
            volume_audit: beta_only.volume_audit,
        },
        status: match (
            &obj.status,
            beta_only.storage_pool_statuses.is_empty()
                && beta_only.node_loss.is_none()
                && beta_only.volume_audit_status.is_none(),
        ) {
            (None, true) => None,
            (status, _) => {
                let s = status.clone().unwrap_or_default();
                Some(v1beta1::HostPathProvisionerStatus {
                    conditions: s.conditions,
                    observed_version: s.observed_version,
                    operator_version: s.operator_version,
                    target_version: s.target_version,
                    storage_pool_statuses: beta_only.storage_pool_statuses,
                    node_loss: beta_only.node_loss,
                    volume_audit: beta_only.volume_audit_status,
                })
            }
        },
    })
}

/// Full `apiVersion` of v1alpha1 objects.
pub const API_VERSION_V1ALPHA1: &str = "hostpathprovisioner.kubevirt.io/v1alpha1";
/// Full `apiVersion` of v1beta1 objects.
pub const API_VERSION_V1BETA1: &str = "hostpathprovisioner.kubevirt.io/v1beta1";

/// Converts a JSON object (as a conversion webhook receives it) to `desired_api_version`.
/// Objects already at that version are returned unchanged.
pub fn convert_json(obj: serde_json::Value, desired_api_version: &str) -> Result<serde_json::Value, ConversionError> {
    let from = obj
        .get("apiVersion")
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_string();
    for v in [&from, &desired_api_version.to_string()] {
        if v != API_VERSION_V1ALPHA1 && v != API_VERSION_V1BETA1 {
            return Err(ConversionError::UnknownVersion(v.clone()));
        }
    }
    if from == desired_api_version {
        return Ok(obj);
    }
    let decode = |source| ConversionError::Decode {
        api_version: from.clone(),
        source,
    };
    let converted = if from == API_VERSION_V1ALPHA1 {
        let alpha: v1alpha1::HostPathProvisioner = serde_json::from_value(obj).map_err(decode)?;
        serde_json::to_value(to_v1beta1(&alpha)?)
    } else {
        let beta: v1beta1::HostPathProvisioner = serde_json::from_value(obj).map_err(decode)?;
        serde_json::to_value(to_v1alpha1(&beta)?)
    };
    converted.map_err(ConversionError::Encode)
}
