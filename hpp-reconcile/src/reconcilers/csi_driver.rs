//! The CSIDriver object `kubevirt.io.hostpath-provisioner`.

use async_trait::async_trait;
use hpp_api::HostPathProvisioner;
use hpp_api::constants as c;
use k8s_openapi::api::storage::v1::{CSIDriver as CsiDriverObject, CSIDriverSpec};

use super::common::{self, csi_driver_kind};
use crate::config::OperatorConfig;
use crate::error::Result;
use crate::facts::ClusterFacts;
use crate::object::{DesiredObject, Kind};
use crate::permissions::{Permission, WRITE};
use crate::subreconciler::SubReconciler;

/// The desired CSIDriver.
pub fn desired_csi_driver(hpp: &HostPathProvisioner, cfg: &OperatorConfig) -> Result<DesiredObject> {
    common::typed_ssa(&CsiDriverObject {
        metadata: common::object_meta(c::DRIVER_NAME, None, cfg, &[], Some(hpp)),
        spec: CSIDriverSpec {
            attach_required: Some(false),
            fs_group_policy: Some("File".into()),
            volume_lifecycle_modes: Some(vec!["Persistent".into(), "Ephemeral".into()]),
            pod_info_on_mount: Some(true),
            storage_capacity: Some(true),
            requires_republish: Some(false),
            ..Default::default()
        },
    })
}

/// Sub-reconciler for the CSIDriver.
pub struct CsiDriver;

#[async_trait]
impl SubReconciler for CsiDriver {
    fn name(&self) -> &str {
        crate::names::STEP_CSI_DRIVER
    }

    fn kinds(&self, _facts: &ClusterFacts) -> Vec<Kind> {
        vec![csi_driver_kind()]
    }

    fn permissions(&self, _facts: &ClusterFacts) -> Vec<Permission> {
        vec![
            Permission::on(&csi_driver_kind(), &WRITE)
                .named([c::DRIVER_NAME])
                .because("csi-driver: the driver's CSIDriver object."),
        ]
    }

    fn desired(&self, hpp: &HostPathProvisioner, cfg: &OperatorConfig, _: &ClusterFacts) -> Result<Vec<DesiredObject>> {
        Ok(vec![desired_csi_driver(hpp, cfg)?])
    }
}
