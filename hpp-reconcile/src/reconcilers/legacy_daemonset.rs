//! The legacy (non-CSI) provisioner DaemonSet `hostpath-provisioner`, present only with
//! `pathConfig`; the pipeline's sweep removes it when `pathConfig` goes away.

use async_trait::async_trait;
use hpp_api::HostPathProvisioner;
use hpp_api::constants as c;
use kube::api::DynamicObject;
use serde_json::{Value, json};

use super::common::{self, daemonset_kind};
use super::csi_daemonset::daemonset_ready;
use crate::config::OperatorConfig;
use crate::error::Result;
use crate::facts::ClusterFacts;
use crate::names;
use crate::object::{DesiredObject, Kind};
use crate::subreconciler::{Readiness, SubReconciler};

/// Extra label letting the legacy pods reach cluster services under KubeVirt's NetworkPolicies.
pub const LABEL_ALLOW_CLUSTER_SERVICES: &str = "np.kubevirt.io/allow-access-cluster-services";

/// Path of the legacy provisioner in the stock `hpp-csi-driver` image.
pub const LEGACY_PROVISIONER_COMMAND: &str = "/usr/bin/hpp-provisioner";

/// The desired legacy DaemonSet, or `None` when `pathConfig` is not set.
pub fn desired_legacy_daemonset(hpp: &HostPathProvisioner, cfg: &OperatorConfig) -> Result<Option<DesiredObject>> {
    let Some(pc) = &hpp.spec.path_config else {
        return Ok(None);
    };
    let mut env = vec![
        json!({ "name": "USE_NAMING_PREFIX", "value": pc.use_naming_prefix.unwrap_or(false).to_string() }),
        json!({ "name": "NODE_NAME", "valueFrom": { "fieldRef": { "apiVersion": "v1", "fieldPath": "spec.nodeName" } } }),
        json!({ "name": "PV_DIR", "value": pc.path }),
    ];
    for (label, var) in [
        (c::LABEL_PART_OF, "INSTALLER_PART_OF_LABEL"),
        (c::LABEL_VERSION, "INSTALLER_VERSION_LABEL"),
    ] {
        if let Some(v) = cfg.installer_labels.get(label) {
            env.push(json!({ "name": var, "value": v }));
        }
    }
    let mut pod_spec = json!({
        "serviceAccountName": names::LEGACY_SERVICE_ACCOUNT,
        "containers": [{
            "name": "hostpath-provisioner",
            "image": cfg.images.legacy_provisioner,
            "imagePullPolicy": common::pull_policy(hpp),
            // The stock image's entrypoint is the CSI driver; the legacy provisioner ships beside it.
            "command": [LEGACY_PROVISIONER_COMMAND],
            "env": env,
            "volumeMounts": [{ "name": "pv-volume", "mountPath": pc.path }],
        }],
        "volumes": [{ "name": "pv-volume", "hostPath": { "path": pc.path, "type": "DirectoryOrCreate" } }],
    });
    if let Value::Object(spec) = &mut pod_spec {
        spec.extend(common::placement(hpp));
    }
    let extra = [(LABEL_ALLOW_CLUSTER_SERVICES, "true")];
    let obj = json!({
        "metadata": common::meta(names::LEGACY_DAEMONSET, Some(&cfg.namespace), cfg, &extra, Some(hpp)),
        "spec": {
            "selector": { "matchLabels": { c::LABEL_APP: c::LABEL_APP_VALUE } },
            "template": {
                "metadata": { "labels": common::labels_value(cfg, &extra) },
                "spec": pod_spec,
            },
        },
    });
    Ok(Some(common::ssa(daemonset_kind(), obj)?))
}

/// Sub-reconciler for the legacy DaemonSet.
pub struct LegacyDaemonSet;

#[async_trait]
impl SubReconciler for LegacyDaemonSet {
    fn name(&self) -> &str {
        "legacy-daemonset"
    }

    fn kinds(&self, _facts: &ClusterFacts) -> Vec<Kind> {
        vec![daemonset_kind()]
    }

    fn desired(&self, hpp: &HostPathProvisioner, cfg: &OperatorConfig, _: &ClusterFacts) -> Result<Vec<DesiredObject>> {
        Ok(desired_legacy_daemonset(hpp, cfg)?.into_iter().collect())
    }

    fn readiness(&self, _hpp: &HostPathProvisioner, live: &[DynamicObject]) -> Readiness {
        let mut r = Readiness::ready();
        r.workloads_not_ready
            .extend(live.iter().map(daemonset_ready).filter(|(ok, _)| !ok).map(|(_, m)| m));
        r
    }
}
