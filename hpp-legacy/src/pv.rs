//! The PersistentVolume for a provisioned directory, built without I/O.

use std::collections::BTreeMap;

use hpp_api::constants::{ANNOTATION_PROVISION_ON_NODE, ANNOTATION_PROVISIONED_BY, ANNOTATION_PROVISIONER_IDENTITY};
use k8s_openapi::api::core::v1::{
    HostPathVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, ObjectReference, PersistentVolume,
    PersistentVolumeClaim, PersistentVolumeSpec, VolumeNodeAffinity,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::config::{
    ANNOTATION_ARCHIVE_ON_DELETE, ANNOTATION_BASE_DIR, ANNOTATION_TORCHBOX_IDENTITY, Mode, ProvisionerConfig,
};
use crate::decision::ProvisionPlan;

/// Node label PV node affinity uses.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// Builds the PV for `plan`. `hostname` is the value of the Node's `kubernetes.io/hostname`
/// label (node-local modes only): it may differ from the node name.
pub fn build_pv(
    cfg: &ProvisionerConfig,
    plan: &ProvisionPlan,
    claim: &PersistentVolumeClaim,
    hostname: Option<&str>,
) -> PersistentVolume {
    let mut annotations = BTreeMap::from([
        (ANNOTATION_PROVISIONED_BY.to_owned(), cfg.provisioner_name.clone()),
        (ANNOTATION_PROVISIONER_IDENTITY.to_owned(), cfg.identity.clone()),
        (ANNOTATION_BASE_DIR.to_owned(), plan.base_dir.display().to_string()),
    ]);
    if let Some(node) = &plan.node {
        annotations.insert(ANNOTATION_PROVISION_ON_NODE.to_owned(), node.clone());
    }
    if cfg.mode == Mode::Shared {
        // Lets a rollback to the original shared provisioner still recognise its volumes.
        annotations.insert(ANNOTATION_TORCHBOX_IDENTITY.to_owned(), cfg.identity.clone());
    }
    if plan.archive_on_delete {
        annotations.insert(ANNOTATION_ARCHIVE_ON_DELETE.to_owned(), "true".to_owned());
    }
    let node_affinity = hostname.map(|h| VolumeNodeAffinity {
        required: Some(NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: Some(vec![NodeSelectorRequirement {
                    key: HOSTNAME_LABEL.to_owned(),
                    operator: "In".to_owned(),
                    values: Some(vec![h.to_owned()]),
                }]),
                match_fields: None,
            }],
        }),
    });
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(plan.pv_name.clone()),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            capacity: Some(BTreeMap::from([(
                "storage".to_owned(),
                Quantity(plan.request_quantity.clone()),
            )])),
            access_modes: Some(plan.access_modes.clone()),
            persistent_volume_reclaim_policy: Some(plan.reclaim_policy.clone()),
            storage_class_name: Some(plan.storage_class.clone()),
            volume_mode: Some("Filesystem".to_owned()),
            // `Directory`, not `DirectoryOrCreate`: if the directory vanished (failed mount),
            // the kubelet must fail instead of silently creating it on the root disk.
            host_path: Some(HostPathVolumeSource {
                path: plan.dir().display().to_string(),
                type_: Some("Directory".to_owned()),
            }),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("PersistentVolumeClaim".to_owned()),
                name: claim.metadata.name.clone(),
                namespace: claim.metadata.namespace.clone(),
                uid: claim.metadata.uid.clone(),
                resource_version: claim.metadata.resource_version.clone(),
                ..Default::default()
            }),
            node_affinity,
            ..Default::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Mode;
    use crate::params::ClassParams;

    fn plan(node: Option<&str>, archive: bool) -> ProvisionPlan {
        ProvisionPlan {
            pv_name: "pvc-1".into(),
            base_dir: "/var/hpvolumes".into(),
            rel_dir: "ns-c-pvc-1".into(),
            request_bytes: 1 << 30,
            request_quantity: "1Gi".into(),
            access_modes: vec!["ReadWriteOnce".into()],
            reclaim_policy: "Retain".into(),
            storage_class: "local".into(),
            dir_mode: 0o770,
            uid: None,
            gid: None,
            archive_on_delete: archive,
            cephfs_quota: false,
            node: node.map(str::to_owned),
            params: ClassParams::default(),
            ignored_mount_options: Vec::new(),
        }
    }

    fn claim() -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("c".into()),
                namespace: Some("ns".into()),
                uid: Some("1".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn node_local_pv_pins_to_hostname_label() {
        let cfg = ProvisionerConfig::new(Mode::Kubevirt, Some("node-a".into()), Some("/var/hpvolumes".into()));
        let pv = build_pv(&cfg, &plan(Some("node-a"), false), &claim(), Some("node-a.example.com"));
        let ann = pv.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann[ANNOTATION_PROVISION_ON_NODE], "node-a");
        assert_eq!(
            ann[ANNOTATION_PROVISIONER_IDENTITY],
            hpp_api::constants::LEGACY_PROVISIONER_NAME
        );
        assert_eq!(
            ann[ANNOTATION_PROVISIONED_BY],
            hpp_api::constants::LEGACY_PROVISIONER_NAME
        );
        assert!(!ann.contains_key(ANNOTATION_ARCHIVE_ON_DELETE));
        let spec = pv.spec.unwrap();
        let term = &spec.node_affinity.unwrap().required.unwrap().node_selector_terms[0];
        let req = &term.match_expressions.as_ref().unwrap()[0];
        assert_eq!(req.key, HOSTNAME_LABEL);
        assert_eq!(req.values.as_deref(), Some(&["node-a.example.com".to_owned()][..]));
        assert_eq!(spec.host_path.unwrap().path, "/var/hpvolumes/ns-c-pvc-1");
        assert_eq!(spec.persistent_volume_reclaim_policy.as_deref(), Some("Retain"));
        assert_eq!(spec.claim_ref.unwrap().uid.as_deref(), Some("1"));
        assert_eq!(spec.capacity.unwrap()["storage"].0, "1Gi");
    }

    #[test]
    fn shared_pv_has_no_affinity() {
        let cfg = ProvisionerConfig::new(Mode::Shared, None, None);
        let pv = build_pv(&cfg, &plan(None, true), &claim(), None);
        let ann = pv.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann[ANNOTATION_ARCHIVE_ON_DELETE], "true");
        assert_eq!(ann[ANNOTATION_TORCHBOX_IDENTITY], crate::config::SHARED_DEFAULT_NAME);
        assert!(!ann.contains_key(ANNOTATION_PROVISION_ON_NODE));
        assert!(pv.spec.unwrap().node_affinity.is_none());
    }
}
