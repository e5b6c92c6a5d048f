//! `hostpathprovisioner.kubevirt.io/v1alpha1`: the original API, served but not stored.
//! `pathConfig` is required and `useNamingPrefix` is a string. [`crate::conversion`] converts
//! losslessly to and from [`crate::v1beta1`].

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::v1beta1::{Condition, NodePlacement};

/// Desired state in the v1alpha1 shape.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "hostpathprovisioner.kubevirt.io",
    version = "v1alpha1",
    kind = "HostPathProvisioner",
    plural = "hostpathprovisioners",
    singular = "hostpathprovisioner",
    shortname = "hpp",
    derive = "PartialEq",
    status = "HostPathProvisionerStatus",
    printcolumn = r#"{"name":"Available","type":"string","jsonPath":".status.conditions[?(@.type==\"Available\")].status"}"#,
    printcolumn = r#"{"name":"Progressing","type":"string","jsonPath":".status.conditions[?(@.type==\"Progressing\")].status"}"#,
    printcolumn = r#"{"name":"Degraded","type":"string","jsonPath":".status.conditions[?(@.type==\"Degraded\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct HostPathProvisionerSpec {
    /// Pull policy copied to every container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    /// Host directory configuration (required in this version).
    pub path_config: PathConfig,
    /// Where the provisioner DaemonSets run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<NodePlacement>,
}

/// Host directory configuration in the v1alpha1 shape.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PathConfig {
    /// Host directory volumes are created in.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub path: String,
    /// `"true"` (any case) names volume directories `<pvc name>-<pv name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_naming_prefix: Option<String>,
}

/// Observed state in the v1alpha1 shape.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostPathProvisionerStatus {
    /// Available, Progressing and Degraded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Version the deployment last completed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_version: Option<String>,
    /// Version of the running operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_version: Option<String>,
    /// Version being deployed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_version: Option<String>,
}
