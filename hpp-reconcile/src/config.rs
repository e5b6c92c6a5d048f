//! Operator configuration read once from the environment by a pure function, so every builder
//! is testable without touching the process environment.

use std::collections::BTreeMap;

/// Namespace used when neither `POD_NAMESPACE` nor the service-account namespace file says otherwise.
pub const DEFAULT_NAMESPACE: &str = "hostpath-provisioner";
/// Default CSI DaemonSet `--metrics-tls-version` (KubeVirt's servers' Intermediate default).
pub const DEFAULT_METRICS_TLS_VERSION: &str = "VersionTLS12";

/// The version the operator writes to `status.operatorVersion`, `targetVersion` and
/// `observedVersion` (and gives the driver as `--version`) unless `OPERATOR_VERSION` says
/// otherwise: `hpp-v<crate version>`. Not semver on purpose, so KubeVirt's operator never reads
/// it as newer than itself (see [`crate::status::HPP_VERSION_PREFIX`]).
pub fn default_version() -> String {
    format!("{}v{}", crate::status::HPP_VERSION_PREFIX, env!("CARGO_PKG_VERSION"))
}

/// Container images of everything the operator deploys (same env names as KubeVirt).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Images {
    /// `CSI_PROVISIONER_IMAGE`: the hpp CSI driver.
    pub csi_driver: String,
    /// `NODE_DRIVER_REG_IMAGE`: node-driver-registrar sidecar.
    pub node_driver_registrar: String,
    /// `LIVENESS_PROBE_IMAGE`: livenessprobe sidecar.
    pub liveness_probe: String,
    /// `CSI_SIG_STORAGE_PROVISIONER_IMAGE`: external csi-provisioner sidecar.
    pub csi_provisioner: String,
    /// `CSI_SNAPSHOT_IMAGE`: csi-snapshotter sidecar.
    pub csi_snapshotter: String,
    /// `CSI_RESIZER_IMAGE`: csi-resizer sidecar (volume expansion and modification; hpp only).
    pub csi_resizer: String,
    /// `PROVISIONER_IMAGE`: the legacy (non-CSI) provisioner.
    pub legacy_provisioner: String,
    /// `OPERATOR_IMAGE`: the operator image, which also carries the pool mounter.
    pub operator: String,
}

impl Default for Images {
    fn default() -> Self {
        Images {
            csi_driver: "hostpath-provisioner-csi".into(),
            node_driver_registrar: "registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.2.0".into(),
            liveness_probe: "registry.k8s.io/sig-storage/livenessprobe:v2.3.0".into(),
            csi_provisioner: "registry.k8s.io/sig-storage/csi-provisioner:v3.4.1".into(),
            csi_snapshotter: "registry.k8s.io/sig-storage/csi-snapshotter:v8.2.0".into(),
            csi_resizer: "registry.k8s.io/sig-storage/csi-resizer:v1.13.1".into(),
            legacy_provisioner: "hostpath-provisioner".into(),
            operator: "hostpath-provisioner-operator".into(),
        }
    }
}

/// Everything the builders need besides the CR and the cluster facts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperatorConfig {
    /// Namespace of the operator and of every namespaced object it owns.
    pub namespace: String,
    /// Version of this operator: `operatorVersion`/`targetVersion`, the driver's `--version`.
    pub version: String,
    /// Images of the deployed components.
    pub images: Images,
    /// `--v` passed to the CSI driver (`VERBOSITY`, default 3, non-integer means 0).
    pub verbosity: u32,
    /// Namespace of the Prometheus service account (`MONITORING_NAMESPACE`).
    pub monitoring_namespace: String,
    /// Runbook URL with one `%s` for the alert name (`RUNBOOK_URL_TEMPLATE`).
    pub runbook_url_template: String,
    /// Extra labels copied from `INSTALLER_PART_OF_LABEL` / `INSTALLER_VERSION_LABEL`.
    pub installer_labels: BTreeMap<String, String>,
    /// `--metrics-tls-version` given to the CSI driver.
    pub metrics_tls_version: String,
}

impl Default for OperatorConfig {
    fn default() -> Self {
        Self::from_env(std::iter::empty::<(String, String)>())
    }
}

/// Default runbook URL template.
pub const DEFAULT_RUNBOOK_URL_TEMPLATE: &str = "https://kubevirt.io/monitoring/runbooks/%s";

impl OperatorConfig {
    /// Builds the configuration from environment pairs (pass `std::env::vars()` in a main).
    /// Unknown variables are ignored; empty values count as unset.
    pub fn from_env<I, K, V>(vars: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let env: BTreeMap<String, String> = vars
            .into_iter()
            .filter(|(_, v)| !v.as_ref().is_empty())
            .map(|(k, v)| (k.as_ref().to_owned(), v.as_ref().to_owned()))
            .collect();
        let get = |key: &str, default: String| env.get(key).cloned().unwrap_or(default);
        let d = Images::default();
        let images = Images {
            csi_driver: get("CSI_PROVISIONER_IMAGE", d.csi_driver),
            node_driver_registrar: get("NODE_DRIVER_REG_IMAGE", d.node_driver_registrar),
            liveness_probe: get("LIVENESS_PROBE_IMAGE", d.liveness_probe),
            csi_provisioner: get("CSI_SIG_STORAGE_PROVISIONER_IMAGE", d.csi_provisioner),
            csi_snapshotter: get("CSI_SNAPSHOT_IMAGE", d.csi_snapshotter),
            csi_resizer: get("CSI_RESIZER_IMAGE", d.csi_resizer),
            legacy_provisioner: get("PROVISIONER_IMAGE", d.legacy_provisioner),
            operator: get("OPERATOR_IMAGE", d.operator),
        };
        let mut installer_labels = BTreeMap::new();
        if let Some(v) = env.get("INSTALLER_PART_OF_LABEL") {
            installer_labels.insert(hpp_api::constants::LABEL_PART_OF.to_owned(), v.clone());
        }
        if let Some(v) = env.get("INSTALLER_VERSION_LABEL") {
            installer_labels.insert(hpp_api::constants::LABEL_VERSION.to_owned(), v.clone());
        }
        let runbook = env
            .get("RUNBOOK_URL_TEMPLATE")
            .filter(|t| t.matches("%s").count() == 1)
            .cloned()
            .unwrap_or_else(|| DEFAULT_RUNBOOK_URL_TEMPLATE.to_owned());
        OperatorConfig {
            namespace: get("POD_NAMESPACE", DEFAULT_NAMESPACE.to_owned()),
            version: get("OPERATOR_VERSION", default_version()),
            images,
            verbosity: env.get("VERBOSITY").map_or(3, |v| v.trim().parse().unwrap_or(0)),
            monitoring_namespace: get("MONITORING_NAMESPACE", "monitoring".to_owned()),
            runbook_url_template: runbook,
            installer_labels,
            metrics_tls_version: get("TLS_MIN_VERSION_OVERRIDE", DEFAULT_METRICS_TLS_VERSION.to_owned()),
        }
    }

    /// The runbook URL of one alert.
    pub fn runbook_url(&self, alert: &str) -> String {
        self.runbook_url_template.replacen("%s", alert, 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_kubevirt() {
        let cfg = OperatorConfig::default();
        assert_eq!(cfg.namespace, "hostpath-provisioner");
        assert_eq!(cfg.verbosity, 3);
        assert_eq!(
            cfg.images.csi_provisioner,
            "registry.k8s.io/sig-storage/csi-provisioner:v3.4.1"
        );
        assert_eq!(
            cfg.runbook_url("HPPNotReady"),
            "https://kubevirt.io/monitoring/runbooks/HPPNotReady"
        );
        assert_eq!(cfg.metrics_tls_version, "VersionTLS12");
        assert!(cfg.installer_labels.is_empty());
    }

    #[test]
    fn every_image_variable_is_read() {
        let vars = [
            ("CSI_PROVISIONER_IMAGE", "a"),
            ("NODE_DRIVER_REG_IMAGE", "b"),
            ("LIVENESS_PROBE_IMAGE", "c"),
            ("CSI_SIG_STORAGE_PROVISIONER_IMAGE", "d"),
            ("CSI_SNAPSHOT_IMAGE", "e"),
            ("CSI_RESIZER_IMAGE", "h"),
            ("PROVISIONER_IMAGE", "f"),
            ("OPERATOR_IMAGE", "g"),
            ("VERBOSITY", "x"),
            ("POD_NAMESPACE", "ns"),
            ("OPERATOR_VERSION", "v1.2.3"),
            ("INSTALLER_PART_OF_LABEL", "kubevirt"),
            ("RUNBOOK_URL_TEMPLATE", "no-placeholder"),
            ("MONITORING_NAMESPACE", ""),
        ];
        let cfg = OperatorConfig::from_env(vars);
        let i = &cfg.images;
        let got = [
            &i.csi_driver,
            &i.node_driver_registrar,
            &i.liveness_probe,
            &i.csi_provisioner,
            &i.csi_snapshotter,
            &i.legacy_provisioner,
            &i.operator,
            &i.csi_resizer,
        ];
        assert_eq!(got, ["a", "b", "c", "d", "e", "f", "g", "h"]);
        assert_eq!(cfg.verbosity, 0, "a non-integer VERBOSITY means 0, as in KubeVirt");
        assert_eq!(cfg.namespace, "ns");
        assert_eq!(cfg.version, "v1.2.3");
        assert_eq!(
            cfg.installer_labels
                .get("app.kubernetes.io/part-of")
                .map(String::as_str),
            Some("kubevirt")
        );
        assert_eq!(
            cfg.runbook_url_template, DEFAULT_RUNBOOK_URL_TEMPLATE,
            "a template without %s is ignored"
        );
        assert_eq!(cfg.monitoring_namespace, "monitoring", "empty values count as unset");
    }
}
