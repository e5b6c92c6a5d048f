//! The CSIDriver object `kubevirt.io.hostpath-provisioner`.

use async_trait::async_trait;
use hpp_api::HostPathProvisioner;
use hpp_api::constants as c;
use serde_json::json;

use super::common::{self, csi_driver_kind};
use crate::config::OperatorConfig;
use crate::error::Result;
use crate::facts::ClusterFacts;
use crate::object::{DesiredObject, Kind};
use crate::subreconciler::SubReconciler;

/// The desired CSIDriver.
pub fn desired_csi_driver(hpp: &HostPathProvisioner, cfg: &OperatorConfig) -> Result<DesiredObject> {
    common::ssa(
        csi_driver_kind(),
        json!({
            "metadata": common::meta(c::DRIVER_NAME, None, cfg, &[], Some(hpp)),
            "spec": {
                "attachRequired": false,
                "fsGroupPolicy": "File",
                "volumeLifecycleModes": ["Persistent", "Ephemeral"],
                "podInfoOnMount": true,
                "storageCapacity": true,
                "requiresRepublish": false,
            },
        }),
    )
}

/// Sub-reconciler for the CSIDriver.
pub struct CsiDriver;

#[async_trait]
impl SubReconciler for CsiDriver {
    fn name(&self) -> &str {
        "csi-driver"
    }

    fn kinds(&self, _facts: &ClusterFacts) -> Vec<Kind> {
        vec![csi_driver_kind()]
    }

    fn desired(&self, hpp: &HostPathProvisioner, cfg: &OperatorConfig, _: &ClusterFacts) -> Result<Vec<DesiredObject>> {
        Ok(vec![desired_csi_driver(hpp, cfg)?])
    }
}
