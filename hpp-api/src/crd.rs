//! The CustomResourceDefinition, generated from the types: both versions merged, `v1beta1` stored.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceConversion, CustomResourceDefinition, ServiceReference, WebhookClientConfig, WebhookConversion,
};
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

/// Where the API server reaches the conversion webhook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConversionService {
    /// Namespace of the webhook Service.
    pub namespace: String,
    /// Name of the webhook Service.
    pub name: String,
    /// Service port (the Service maps it to the webhook's container port).
    pub port: i32,
    /// HTTP path of the conversion endpoint.
    pub path: String,
}

/// The merged CRD with `conversion.strategy: Webhook`, so `v1alpha1` reads and writes are
/// converted losslessly by the webhook instead of only relabelled. `caBundle` is left empty for
/// cert-manager's CA injector (or the installer) to fill.
pub fn crd_with_conversion_webhook(service: &ConversionService) -> Result<CustomResourceDefinition, CrdError> {
    let mut crd = crd()?;
    crd.spec.conversion = Some(CustomResourceConversion {
        strategy: "Webhook".to_string(),
        webhook: Some(WebhookConversion {
            client_config: Some(WebhookClientConfig {
                ca_bundle: None,
                service: Some(ServiceReference {
                    name: service.name.clone(),
                    namespace: service.namespace.clone(),
                    path: Some(service.path.clone()),
                    port: Some(service.port),
                }),
                url: None,
            }),
            conversion_review_versions: vec!["v1".to_string()],
        }),
    });
    Ok(crd)
}
