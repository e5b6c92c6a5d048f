//! OpenShift SecurityContextConstraints, only when discovery finds the API.

use async_trait::async_trait;
use hpp_api::HostPathProvisioner;
use serde_json::json;

use super::common::{self, scc_kind};
use crate::config::OperatorConfig;
use crate::error::Result;
use crate::facts::ClusterFacts;
use crate::names;
use crate::object::{DesiredObject, Kind};
use crate::permissions::{Permission, WRITE};
use crate::subreconciler::SubReconciler;

fn scc(
    hpp: &HostPathProvisioner,
    cfg: &OperatorConfig,
    name: &str,
    sa: &str,
    privileged: bool,
) -> Result<DesiredObject> {
    let volumes = if privileged {
        json!(["*"])
    } else {
        json!(["hostPath", "secret", "projected"])
    };
    common::ssa(
        scc_kind(),
        json!({
            "metadata": common::meta(name, None, cfg, &[], Some(hpp)),
            "allowPrivilegedContainer": privileged,
            "allowHostDirVolumePlugin": true,
            "allowHostIPC": false,
            "allowHostNetwork": false,
            "allowHostPID": false,
            "allowHostPorts": false,
            "readOnlyRootFilesystem": false,
            "requiredDropCapabilities": ["KILL", "MKNOD", "SETUID", "SETGID"],
            "runAsUser": { "type": "RunAsAny" },
            "seLinuxContext": { "type": "RunAsAny" },
            "fsGroup": { "type": "RunAsAny" },
            "supplementalGroups": { "type": "RunAsAny" },
            "users": [format!("system:serviceaccount:{}:{sa}", cfg.namespace)],
            "volumes": volumes,
        }),
    )
}

/// The desired SCCs (CSI always, legacy with `pathConfig`), or none without the API.
pub fn desired_sccs(
    hpp: &HostPathProvisioner,
    cfg: &OperatorConfig,
    facts: &ClusterFacts,
) -> Result<Vec<DesiredObject>> {
    if !facts.has_scc {
        return Ok(vec![]);
    }
    let mut out = vec![scc(hpp, cfg, names::CSI_SCC, names::CSI_SERVICE_ACCOUNT, true)?];
    if common::is_legacy(hpp) {
        out.push(scc(hpp, cfg, names::LEGACY_SCC, names::LEGACY_SERVICE_ACCOUNT, false)?);
    }
    Ok(out)
}

/// Sub-reconciler for SCCs.
pub struct Scc;

#[async_trait]
impl SubReconciler for Scc {
    fn name(&self) -> &str {
        crate::names::STEP_SCC
    }

    fn kinds(&self, facts: &ClusterFacts) -> Vec<Kind> {
        if facts.has_scc { vec![scc_kind()] } else { vec![] }
    }

    fn permissions(&self, facts: &ClusterFacts) -> Vec<Permission> {
        if !facts.has_scc {
            return Vec::new();
        }
        vec![
            Permission::on(&scc_kind(), &WRITE)
                .named([names::CSI_SCC, names::LEGACY_SCC])
                .because("scc (OpenShift): only hpp's own SCCs can be changed, never `restricted` and friends."),
        ]
    }

    fn desired(
        &self,
        hpp: &HostPathProvisioner,
        cfg: &OperatorConfig,
        facts: &ClusterFacts,
    ) -> Result<Vec<DesiredObject>> {
        desired_sccs(hpp, cfg, facts)
    }
}
