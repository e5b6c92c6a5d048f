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

/// `maxLength` of a spec string the types do not bound more tightly (label values, quantities
/// and paths inside the embedded Kubernetes types are all far shorter).
pub const DEFAULT_MAX_STRING_LENGTH: i64 = 1024;
/// `maxItems` of a spec list the types do not bound more tightly.
pub const DEFAULT_MAX_ITEMS: i64 = 256;
/// `maxProperties` of a spec map (node selectors, resource lists).
pub const DEFAULT_MAX_PROPERTIES: i64 = 256;

/// The merged CRD: `v1beta1` served and stored; `v1alpha1` listed but not served, as in
/// KubeVirt's CRD. Without a conversion webhook the API server only relabels `apiVersion` and
/// prunes to the other schema, so serving `v1alpha1` would drop pools and gates on a read and
/// store a string where `v1beta1` has a boolean on a write; [`crd_with_conversion_webhook`]
/// serves it. It stays listed so a cluster whose `storedVersions` still has it can apply this
/// CRD. Every string, list and map under `spec` has a `maxLength`/`maxItems`/`maxProperties`,
/// so the API server's CEL cost estimator and etcd see a bounded object and reject an oversized
/// one before the webhook.
pub fn crd() -> Result<CustomResourceDefinition, CrdError> {
    let mut crd = merge_crds(
        vec![
            v1alpha1::HostPathProvisioner::crd(),
            v1beta1::HostPathProvisioner::crd(),
        ],
        "v1beta1",
    )?;
    for version in &mut crd.spec.versions {
        version.served = version.name != "v1alpha1";
        if let Some(spec) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
            .and_then(|s| s.properties.as_mut())
            .and_then(|p| p.get_mut("spec"))
        {
            let mut value = serde_json::to_value(&*spec).map_err(|e| CrdError::Yaml(e.to_string()))?;
            bound(&mut value);
            *spec = serde_json::from_value(value).map_err(|e| CrdError::Yaml(e.to_string()))?;
        }
    }
    Ok(crd)
}

/// Adds the default bounds to every unbounded string, array and map of a JSON schema.
fn bound(schema: &mut serde_json::Value) {
    let Some(obj) = schema.as_object_mut() else {
        return;
    };
    let limit = |key: &str, v: i64, obj: &mut serde_json::Map<String, serde_json::Value>| {
        obj.entry(key).or_insert_with(|| v.into());
    };
    match obj.get("type").and_then(serde_json::Value::as_str) {
        Some("string") if !obj.contains_key("enum") => limit("maxLength", DEFAULT_MAX_STRING_LENGTH, obj),
        Some("array") => limit("maxItems", DEFAULT_MAX_ITEMS, obj),
        Some("object")
            if obj
                .get("additionalProperties")
                .is_some_and(serde_json::Value::is_object) =>
        {
            limit("maxProperties", DEFAULT_MAX_PROPERTIES, obj);
        }
        _ => {}
    }
    for key in ["items", "additionalProperties", "not"] {
        if let Some(child) = obj.get_mut(key) {
            bound(child);
        }
    }
    if let Some(props) = obj.get_mut("properties").and_then(serde_json::Value::as_object_mut) {
        props.values_mut().for_each(bound);
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        if let Some(list) = obj.get_mut(key).and_then(serde_json::Value::as_array_mut) {
            list.iter_mut().for_each(bound);
        }
    }
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

/// The merged CRD with `conversion.strategy: Webhook` and `v1alpha1` served: its reads and
/// writes are converted losslessly by the webhook instead of only relabelled. `caBundle` is
/// left empty for cert-manager's CA injector (or the installer) to fill.
pub fn crd_with_conversion_webhook(service: &ConversionService) -> Result<CustomResourceDefinition, CrdError> {
    let mut crd = crd()?;
    for version in &mut crd.spec.versions {
        version.served = true;
    }
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
