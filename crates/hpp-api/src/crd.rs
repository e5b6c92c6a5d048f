//! The CustomResourceDefinition, generated from the types: both versions merged, `v1beta1` stored.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use kube::core::crd::{MergeError, merge_crds};

use crate::{v1alpha1, v1beta1};

/// Path of the generated CRD inside the repository, relative to its root.
pub const CRD_FILE: &str = "deploy/crds/hostpathprovisioner.kubevirt.io_hostpathprovisioners.yaml";

/// Why the CRD could not be produced.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// The per-version CRDs disagree on group, kind or scope (a programming error).
    #[error("cannot merge CRD versions: {0}")]
    Merge(#[from] MergeError),
    /// The CRD could not be written as YAML.
    #[error("cannot render CRD as YAML: {0}")]
    Yaml(String),
}

/// The merged CRD: `v1alpha1` served, `v1beta1` served and stored.
pub fn crd() -> Result<CustomResourceDefinition, CrdError> {
    Ok(merge_crds(
        vec![
            v1alpha1::HostPathProvisioner::crd(),
            v1beta1::HostPathProvisioner::crd(),
        ],
        "v1beta1",
    )?)
}

/// The merged CRD as the YAML document committed under `deploy/`.
pub fn crd_yaml() -> Result<String, CrdError> {
    serde_saphyr::to_string(&crd()?).map_err(|e| CrdError::Yaml(e.to_string()))
}
