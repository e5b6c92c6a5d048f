//! Paths, object names and defaults of the webhook. The validation path and the object names are
//! wire contracts with KubeVirt's deployment manifests: existing ValidatingWebhookConfigurations
//! keep working only while they stay the same.

/// Path of the validating webhook, as KubeVirt's ValidatingWebhookConfiguration calls it.
pub const VALIDATE_PATH: &str = "/validate-hostpathprovisioner-kubevirt-io-v1beta1-hostpathprovisioner";
/// Path of the CRD conversion webhook (ConversionReview `apiextensions.k8s.io/v1`).
pub const CONVERT_PATH: &str = "/convert";
/// Liveness endpoint.
pub const HEALTHZ_PATH: &str = "/healthz";
/// Readiness endpoint: ready once a serving certificate is loaded.
pub const READYZ_PATH: &str = "/readyz";

/// Port the webhook listens on inside the pod.
pub const DEFAULT_PORT: u16 = 9443;
/// Default listen address.
pub const DEFAULT_LISTEN_ADDR: &str = "0.0.0.0:9443";
/// Directory cert-manager and OLM mount the serving certificate into.
pub const DEFAULT_CERT_DIR: &str = "/tmp/k8s-webhook-server/serving-certs";
/// Certificate chain file name inside the cert directory.
pub const CERT_FILE: &str = "tls.crt";
/// Private key file name inside the cert directory.
pub const KEY_FILE: &str = "tls.key";

/// Namespace the operator and its webhook Service run in.
pub const NAMESPACE: &str = "hostpath-provisioner";
/// Service in front of the webhook (443 → [`DEFAULT_PORT`]).
pub const SERVICE_NAME: &str = "hostpath-provisioner-operator-webhook-service";
/// cert-manager Certificate and Secret holding the serving certificate.
pub const CERT_SECRET_NAME: &str = "hostpath-provisioner-operator-webhook-service-cert";
/// Name of the ValidatingWebhookConfiguration object.
pub const WEBHOOK_CONFIGURATION_NAME: &str = "hostpathprovisioner.kubevirt.io";
/// Name of the webhook entry inside the configuration.
pub const WEBHOOK_NAME: &str = "validate-hostpath-provisioner.kubevirt.io";

/// Env var naming the minimum TLS version (`VersionTLS12`, `VersionTLS13`).
pub const ENV_TLS_MIN_VERSION: &str = "TLS_MIN_VERSION_OVERRIDE";
/// Env var with a comma-separated cipher suite list (IANA or OpenSSL names).
pub const ENV_TLS_CIPHERS: &str = "TLS_CIPHERS_OVERRIDE";
