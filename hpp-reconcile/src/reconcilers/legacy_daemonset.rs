//! The legacy (non-CSI) provisioner DaemonSet `hostpath-provisioner`, present only with
//! `pathConfig`; the pipeline's sweep removes it when `pathConfig` goes away.

use async_trait::async_trait;
use hpp_api::HostPathProvisioner;
use hpp_api::constants as c;
use kube::api::DynamicObject;

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec};
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec, VolumeMount};
use kube::api::ObjectMeta;

use super::common::{self, daemonset_kind};
use crate::config::OperatorConfig;
use crate::error::Result;
use crate::facts::ClusterFacts;
use crate::names;
use crate::object::{DesiredObject, Kind};
use crate::permissions::{Permission, WRITE};
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
        common::env_value("USE_NAMING_PREFIX", &pc.use_naming_prefix.unwrap_or(false).to_string()),
        common::env_from_field("NODE_NAME", "spec.nodeName"),
        common::env_value("PV_DIR", &pc.path),
    ];
    for (label, var) in [
        (c::LABEL_PART_OF, "INSTALLER_PART_OF_LABEL"),
        (c::LABEL_VERSION, "INSTALLER_VERSION_LABEL"),
    ] {
        if let Some(v) = cfg.installer_labels.get(label) {
            env.push(common::env_value(var, v));
        }
    }
    let container = Container {
        name: "hostpath-provisioner".into(),
        image: Some(cfg.images.legacy_provisioner.clone()),
        image_pull_policy: Some(common::pull_policy(hpp)),
        // The stock image's entrypoint is the CSI driver; the legacy provisioner ships beside it.
        command: Some(vec![LEGACY_PROVISIONER_COMMAND.to_owned()]),
        env: Some(env),
        volume_mounts: Some(vec![VolumeMount {
            name: "pv-volume".into(),
            mount_path: pc.path.clone(),
            ..Default::default()
        }]),
        ..Default::default()
    };
    let pod_spec = PodSpec {
        service_account_name: Some(names::LEGACY_SERVICE_ACCOUNT.into()),
        containers: vec![container],
        volumes: Some(vec![common::host_path_volume(
            "pv-volume",
            &pc.path,
            "DirectoryOrCreate",
        )]),
        ..Default::default()
    };
    let extra = [(LABEL_ALLOW_CLUSTER_SERVICES, "true")];
    let ds = DaemonSet {
        metadata: common::object_meta(names::LEGACY_DAEMONSET, Some(&cfg.namespace), cfg, &extra, Some(hpp)),
        spec: Some(DaemonSetSpec {
            selector: common::app_selector(),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(common::labels_value(cfg, &extra)),
                    ..Default::default()
                }),
                spec: Some(common::placed(hpp, pod_spec)),
            },
            ..Default::default()
        }),
        ..Default::default()
    };
    Ok(Some(common::typed_ssa(&ds)?))
}

/// Sub-reconciler for the legacy DaemonSet.
pub struct LegacyDaemonSet;

#[async_trait]
impl SubReconciler for LegacyDaemonSet {
    fn name(&self) -> &str {
        crate::names::STEP_LEGACY_DAEMONSET
    }

    fn kinds(&self, _facts: &ClusterFacts) -> Vec<Kind> {
        vec![daemonset_kind()]
    }

    fn permissions(&self, _facts: &ClusterFacts) -> Vec<Permission> {
        vec![
            Permission::on(&daemonset_kind(), &WRITE)
                .named([names::LEGACY_DAEMONSET])
                .because("legacy-daemonset: the legacy provisioner's DaemonSet."),
        ]
    }

    fn desired(&self, hpp: &HostPathProvisioner, cfg: &OperatorConfig, _: &ClusterFacts) -> Result<Vec<DesiredObject>> {
        Ok(desired_legacy_daemonset(hpp, cfg)?.into_iter().collect())
    }

    fn readiness(&self, _hpp: &HostPathProvisioner, _facts: &ClusterFacts, live: &[DynamicObject]) -> Readiness {
        super::rollout::daemonsets_readiness(live)
    }
}
