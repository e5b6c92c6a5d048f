//! The Kubernetes objects that wire the webhook into a cluster, built from the same names the
//! server uses, and rendered to the YAML committed under `deploy/webhook/` (a test keeps the
//! files in sync). The operator can also apply them itself.
//!
//! cert-manager issues the serving certificate and injects its CA into the
//! ValidatingWebhookConfiguration and the CRD's conversion webhook through the
//! `cert-manager.io/inject-ca-from` annotation. KubeVirt's `deploy/webhook.yaml` issues the
//! serving certificate from a self-signed Issuer, so every renewal (with a new key) changes the
//! trust anchor: the injected `caBundle` changes at once, the Secret the pod mounts only a
//! kubelet sync later (up to a minute or two), and in between the API server rejects the
//! webhook's certificate, which `failurePolicy: Fail` turns into refused writes. Here the
//! self-signed Issuer only signs a long-lived CA, a CA Issuer signs the serving certificate, and
//! `caBundle` (that CA) stays the same across serving renewals.

use std::collections::BTreeMap;

use hpp_api::constants::{GROUP, PLURAL};
use hpp_api::crd::{ConversionService, CrdError, crd_with_conversion_webhook};
use k8s_openapi::api::admissionregistration::v1::{
    RuleWithOperations, ServiceReference, ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::ObjectMeta;
use serde_json::{Value, json};

use crate::names::{
    CERT_SECRET_NAME, CONVERT_PATH, DEFAULT_PORT, NAMESPACE, SERVICE_NAME, VALIDATE_PATH, WEBHOOK_CONFIGURATION_NAME,
    WEBHOOK_NAME,
};

/// Path of the generated webhook objects inside the repository.
pub const WEBHOOK_FILE: &str = "deploy/webhook/webhook.yaml";
/// Path of the generated CRD with the conversion webhook inside the repository.
pub const CONVERSION_CRD_FILE: &str = "deploy/webhook/hostpathprovisioner.kubevirt.io_hostpathprovisioners.yaml";

/// The self-signed cert-manager Issuer (it signs only the CA certificate).
pub const ISSUER_NAME: &str = "selfsigned-issuer";
/// The CA certificate and its Secret.
pub const CA_NAME: &str = "hostpath-provisioner-webhook-ca";
/// The CA Issuer that signs the serving certificate.
pub const CA_ISSUER_NAME: &str = "hostpath-provisioner-webhook-ca-issuer";
/// Lifetime of the CA: ten years. Its renewal changes `caBundle`, so it should be rare; the
/// serving certificate keeps cert-manager's default (90 days).
pub const CA_DURATION: &str = "87600h";
/// cert-manager's CA injection annotation.
pub const INJECT_CA_ANNOTATION: &str = "cert-manager.io/inject-ca-from";
/// Label selecting the operator pods (which serve the webhook in-process), as in KubeVirt.
pub const OPERATOR_SELECTOR: (&str, &str) = ("name", "hostpath-provisioner-operator");

/// Why the manifests could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The CRD could not be built.
    #[error(transparent)]
    Crd(#[from] CrdError),
    /// An object could not be turned into YAML.
    #[error("cannot render YAML: {0}")]
    Yaml(String),
    /// An object could not be turned into JSON.
    #[error("cannot encode object: {0}")]
    Json(#[from] serde_json::Error),
}

fn inject_ca() -> BTreeMap<String, String> {
    [(
        INJECT_CA_ANNOTATION.to_string(),
        format!("{NAMESPACE}/{CERT_SECRET_NAME}"),
    )]
    .into()
}

fn labels() -> BTreeMap<String, String> {
    [
        ("app.kubernetes.io/component".to_string(), "webhook".to_string()),
        (
            "app.kubernetes.io/part-of".to_string(),
            "hostpath-provisioner".to_string(),
        ),
    ]
    .into()
}

/// The Service in front of the webhook: 443 → the operator's webhook port.
pub fn service() -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(SERVICE_NAME.into()),
            namespace: Some(NAMESPACE.into()),
            labels: Some(labels()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            selector: Some([(OPERATOR_SELECTOR.0.to_string(), OPERATOR_SELECTOR.1.to_string())].into()),
            ports: Some(vec![ServicePort {
                name: Some("webhook".into()),
                port: 443,
                protocol: Some("TCP".into()),
                target_port: Some(IntOrString::Int(i32::from(DEFAULT_PORT))),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

/// The ValidatingWebhookConfiguration KubeVirt installs, with both AdmissionReview versions.
pub fn validating_webhook_configuration() -> ValidatingWebhookConfiguration {
    ValidatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(WEBHOOK_CONFIGURATION_NAME.into()),
            annotations: Some(inject_ca()),
            labels: Some(labels()),
            ..Default::default()
        },
        webhooks: Some(vec![ValidatingWebhook {
            name: WEBHOOK_NAME.into(),
            admission_review_versions: vec!["v1".into(), "v1beta1".into()],
            client_config: WebhookClientConfig {
                service: Some(ServiceReference {
                    name: SERVICE_NAME.into(),
                    namespace: NAMESPACE.into(),
                    path: Some(VALIDATE_PATH.into()),
                    port: Some(443),
                }),
                ..Default::default()
            },
            failure_policy: Some("Fail".into()),
            match_policy: Some("Equivalent".into()),
            rules: Some(vec![RuleWithOperations {
                api_groups: Some(vec![GROUP.into()]),
                api_versions: Some(vec!["v1beta1".into()]),
                // The main resource only: the operator's status writes do not need the webhook.
                resources: Some(vec![PLURAL.into()]),
                operations: Some(vec!["CREATE".into(), "UPDATE".into(), "DELETE".into()]),
                scope: Some("Cluster".into()),
            }]),
            side_effects: "None".into(),
            timeout_seconds: Some(30),
            ..Default::default()
        }]),
    }
}

/// The self-signed cert-manager Issuer.
pub fn issuer() -> Value {
    json!({
        "apiVersion": "cert-manager.io/v1",
        "kind": "Issuer",
        "metadata": {"name": ISSUER_NAME, "namespace": NAMESPACE},
        "spec": {"selfSigned": {}},
    })
}

/// The CA certificate, self-signed; its key is kept across renewals.
pub fn ca_certificate() -> Value {
    json!({
        "apiVersion": "cert-manager.io/v1",
        "kind": "Certificate",
        "metadata": {"name": CA_NAME, "namespace": NAMESPACE},
        "spec": {
            "isCA": true,
            "commonName": CA_NAME,
            "secretName": CA_NAME,
            "duration": CA_DURATION,
            "issuerRef": {"kind": "Issuer", "name": ISSUER_NAME},
            "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Never"},
        },
    })
}

/// The CA Issuer that signs the serving certificate with [`ca_certificate`]'s key.
pub fn ca_issuer() -> Value {
    json!({
        "apiVersion": "cert-manager.io/v1",
        "kind": "Issuer",
        "metadata": {"name": CA_ISSUER_NAME, "namespace": NAMESPACE},
        "spec": {"ca": {"secretName": CA_NAME}},
    })
}

/// The cert-manager Certificate whose Secret the operator pod mounts at the cert directory.
pub fn certificate() -> Value {
    json!({
        "apiVersion": "cert-manager.io/v1",
        "kind": "Certificate",
        "metadata": {"name": CERT_SECRET_NAME, "namespace": NAMESPACE},
        "spec": {
            "secretName": CERT_SECRET_NAME,
            "dnsNames": [
                format!("{SERVICE_NAME}.{NAMESPACE}.svc"),
                format!("{SERVICE_NAME}.{NAMESPACE}.svc.cluster.local"),
            ],
            "issuerRef": {"kind": "Issuer", "name": CA_ISSUER_NAME},
            "privateKey": {"rotationPolicy": "Always"},
        },
    })
}

/// The HostPathProvisioner CRD with the conversion webhook and cert-manager CA injection.
pub fn conversion_crd() -> Result<CustomResourceDefinition, ManifestError> {
    let mut crd = crd_with_conversion_webhook(&ConversionService {
        namespace: NAMESPACE.into(),
        name: SERVICE_NAME.into(),
        port: 443,
        path: CONVERT_PATH.into(),
    })?;
    crd.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .extend(inject_ca());
    Ok(crd)
}

fn yaml_documents(objects: &[Value]) -> Result<String, ManifestError> {
    serde_saphyr::to_string_multiple(objects).map_err(|e| ManifestError::Yaml(e.to_string()))
}

/// `deploy/webhook/webhook.yaml`: Issuer, Certificate, Service, ValidatingWebhookConfiguration.
pub fn webhook_yaml() -> Result<String, ManifestError> {
    let mut service = serde_json::to_value(service())?;
    let mut vwc = serde_json::to_value(validating_webhook_configuration())?;
    for (value, api_version, kind) in [
        (&mut service, "v1", "Service"),
        (
            &mut vwc,
            "admissionregistration.k8s.io/v1",
            "ValidatingWebhookConfiguration",
        ),
    ] {
        if let Some(map) = value.as_object_mut() {
            map.insert("apiVersion".into(), api_version.into());
            map.insert("kind".into(), kind.into());
        }
    }
    yaml_documents(&[issuer(), ca_certificate(), ca_issuer(), certificate(), service, vwc])
}

/// The CRD with the conversion webhook as YAML.
pub fn conversion_crd_yaml() -> Result<String, ManifestError> {
    yaml_documents(&[serde_json::to_value(conversion_crd()?)?])
}
