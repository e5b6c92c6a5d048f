//! The objects an adoption creates: the CSI PV, and the claim that replaces the old one. Pure.
//!
//! The PV is what csi-provisioner would have made had hpp's driver created the volume: driver
//! `kubevirt.io.hostpath-provisioner`, `volumeHandle` = the volume id (the directory's name in
//! the pool), the volume attributes CreateVolume answers with (the class's parameters, the pool,
//! and what `--extra-create-metadata` adds), node affinity on `topology.hostpath.csi/node` for a
//! node-local pool, `pv.kubernetes.io/provisioned-by` so csi-provisioner deletes it like its
//! own, and the old PV's capacity and access modes. It is pre-bound to the claim by name
//! (`claimRef` without uid: the PV controller binds it to the claim of that name that names it
//! back in `spec.volumeName`). Its reclaim policy stays `Retain` until the adoption is complete
//! ([`keys::RECLAIM_POLICY`] keeps the old one): csi-provisioner honours a `Delete` policy even
//! on a PV deleted by hand, and undoing an adoption deletes this PV.

use std::collections::BTreeMap;

use hpp_api::constants::{ANNOTATION_PROVISIONED_BY, DRIVER_NAME, PARAM_STORAGE_POOL, TOPOLOGY_KEY};
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, ObjectReference,
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeSpec, VolumeNodeAffinity,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::keys;
use super::pools::{ClassInfo, PoolInfo};
use super::source::Source;

/// Volume attribute csi-provisioner's `--extra-create-metadata` adds: the claim's name.
pub const ATTR_CLAIM_NAME: &str = "csi.storage.k8s.io/pvc/name";
/// Same: the claim's namespace.
pub const ATTR_CLAIM_NAMESPACE: &str = "csi.storage.k8s.io/pvc/namespace";
/// Same: the PV's name.
pub const ATTR_PV_NAME: &str = "csi.storage.k8s.io/pv/name";
/// Prefix of the parameters csi-provisioner consumes itself (secrets, fsType, the metadata
/// above), never passed to the driver as class parameters.
const PROVISIONER_PARAMS: &str = "csi.storage.k8s.io/";

/// What the new PV is made from.
#[derive(Clone, Copy, Debug)]
pub struct NewVolume<'a> {
    /// The PV being replaced.
    pub old_pv: &'a PersistentVolume,
    /// Who made it.
    pub source: Source,
    /// Its node; `None` in a shared pool.
    pub node: Option<&'a str>,
    /// Its directory on the node.
    pub directory: &'a str,
    /// The pool holding it.
    pub pool: &'a PoolInfo,
    /// Its volume id (its name in the pool).
    pub volume_id: &'a str,
    /// The StorageClass of the new PV and claim.
    pub class: &'a ClassInfo,
    /// The old PV's reclaim policy, which the new PV gets once adopted.
    pub reclaim_policy: &'a str,
}

/// The claim that replaces `claim`: same name, namespace, labels, annotations (less the
/// [`keys::BINDING_ANNOTATIONS`]), owners and spec, naming `new_pv` in `spec.volumeName` and
/// `class` in `spec.storageClassName`. A label selector is dropped (it chose among PVs; this
/// claim names its own), and so is a VolumeAttributesClass (it belonged to the old driver).
pub fn new_claim(claim: &PersistentVolumeClaim, new_pv: &str, class: &str, old_pv: &str) -> PersistentVolumeClaim {
    let mut annotations = claim.metadata.annotations.clone().unwrap_or_default();
    annotations.retain(|k, _| !keys::BINDING_ANNOTATIONS.contains(&k.as_str()));
    annotations.insert(keys::ADOPTED_FROM.to_owned(), old_pv.to_owned());
    let spec = claim.spec.clone().unwrap_or_default();
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: claim.metadata.name.clone(),
            namespace: claim.metadata.namespace.clone(),
            labels: claim.metadata.labels.clone(),
            annotations: Some(annotations),
            owner_references: claim.metadata.owner_references.clone(),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: spec.access_modes,
            resources: spec.resources,
            volume_mode: spec.volume_mode,
            data_source: spec.data_source,
            data_source_ref: spec.data_source_ref,
            storage_class_name: Some(class.to_owned()),
            volume_name: Some(new_pv.to_owned()),
            selector: None,
            volume_attributes_class_name: None,
        }),
        status: None,
    }
}

/// The volume attributes CreateVolume would have answered with: the class's parameters, the
/// pool, and the claim and PV names.
pub fn volume_attributes(v: &NewVolume<'_>, claim: &PersistentVolumeClaim, new_pv: &str) -> BTreeMap<String, String> {
    let mut attributes: BTreeMap<String, String> = v
        .class
        .parameters
        .iter()
        .filter(|(k, _)| !k.starts_with(PROVISIONER_PARAMS))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    attributes.insert(PARAM_STORAGE_POOL.to_owned(), v.pool.name.clone());
    attributes.insert(
        ATTR_CLAIM_NAME.to_owned(),
        claim.metadata.name.clone().unwrap_or_default(),
    );
    attributes.insert(
        ATTR_CLAIM_NAMESPACE.to_owned(),
        claim.metadata.namespace.clone().unwrap_or_default(),
    );
    attributes.insert(ATTR_PV_NAME.to_owned(), new_pv.to_owned());
    attributes
}

/// The CSI PV for `v`, pre-bound to `template` (the claim [`new_claim`] built), carrying it in
/// [`keys::CLAIM_TEMPLATE`] together with what a later run needs to go on.
pub fn new_pv(
    v: &NewVolume<'_>,
    template: &PersistentVolumeClaim,
    old_claim_uid: &str,
) -> Result<PersistentVolume, serde_json::Error> {
    let old_name = v.old_pv.metadata.name.clone().unwrap_or_default();
    let name = keys::new_pv_name(&old_name);
    let old_spec = v.old_pv.spec.clone().unwrap_or_default();
    let annotations = BTreeMap::from([
        (ANNOTATION_PROVISIONED_BY.to_owned(), DRIVER_NAME.to_owned()),
        (keys::ADOPTED_FROM.to_owned(), old_name),
        (keys::ADOPTED_SOURCE.to_owned(), v.source.as_str().to_owned()),
        (
            keys::ADOPTED_DIRECTORY.to_owned(),
            format!("{}:{}", v.node.unwrap_or_default(), v.directory),
        ),
        (keys::CLAIM_UID.to_owned(), old_claim_uid.to_owned()),
        (keys::RECLAIM_POLICY.to_owned(), v.reclaim_policy.to_owned()),
        (keys::STATE.to_owned(), keys::STATE_PENDING.to_owned()),
        (keys::CLAIM_TEMPLATE.to_owned(), serde_json::to_string(template)?),
    ]);
    let node_affinity = v.node.filter(|_| !v.pool.shared).map(|node| VolumeNodeAffinity {
        required: Some(NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: Some(vec![NodeSelectorRequirement {
                    key: TOPOLOGY_KEY.to_owned(),
                    operator: "In".to_owned(),
                    values: Some(vec![node.to_owned()]),
                }]),
                match_fields: None,
            }],
        }),
    });
    Ok(PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            capacity: old_spec.capacity,
            access_modes: old_spec.access_modes,
            volume_mode: Some("Filesystem".to_owned()),
            persistent_volume_reclaim_policy: Some("Retain".to_owned()),
            storage_class_name: Some(v.class.name.clone()),
            mount_options: Some(v.class.mount_options.clone()).filter(|m| !m.is_empty()),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("PersistentVolumeClaim".to_owned()),
                namespace: template.metadata.namespace.clone(),
                name: template.metadata.name.clone(),
                ..ObjectReference::default()
            }),
            csi: Some(CSIPersistentVolumeSource {
                driver: DRIVER_NAME.to_owned(),
                volume_handle: v.volume_id.to_owned(),
                volume_attributes: Some(volume_attributes(v, template, &name)),
                ..CSIPersistentVolumeSource::default()
            }),
            node_affinity,
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    })
}

/// The claim a new PV carries in [`keys::CLAIM_TEMPLATE`].
pub fn claim_template(pv: &PersistentVolume) -> Result<PersistentVolumeClaim, String> {
    let text = pv
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(keys::CLAIM_TEMPLATE))
        .ok_or_else(|| format!("annotation {} is missing", keys::CLAIM_TEMPLATE))?;
    serde_json::from_str(text).map_err(|e| format!("annotation {} is not a claim: {e}", keys::CLAIM_TEMPLATE))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use hpp_api::quota::QuotaMode;
    use serde_json::json;

    fn claim() -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "shop", "uid": "u-1", "resourceVersion": "7",
                         "labels": {"app": "db"},
                         "annotations": {"pv.kubernetes.io/bind-completed": "yes",
                                         "volume.beta.kubernetes.io/storage-provisioner": "kubevirt.io/hostpath-provisioner",
                                         "volume.kubernetes.io/selected-node": "node-a",
                                         "backup.example.com/schedule": "daily"},
                         "finalizers": ["kubernetes.io/pvc-protection"],
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "s-1"}]},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "old", "volumeName": "pvc-1",
                     "volumeMode": "Filesystem", "selector": {"matchLabels": {"a": "b"}},
                     "resources": {"requests": {"storage": "5Gi"}}},
            "status": {"phase": "Bound"},
        }))
        .unwrap()
    }

    #[test]
    fn the_new_claim_keeps_what_the_user_gave_and_drops_the_old_binding() {
        let c = new_claim(&claim(), "pvc-1-hpp", "hostpath-csi", "pvc-1");
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["metadata"]["labels"], json!({"app": "db"}));
        assert_eq!(
            v["metadata"]["annotations"],
            json!({"backup.example.com/schedule": "daily", keys::ADOPTED_FROM: "pvc-1"})
        );
        assert_eq!(v["metadata"]["ownerReferences"][0]["name"], "db");
        for gone in ["uid", "resourceVersion", "finalizers"] {
            assert!(v["metadata"].get(gone).is_none(), "{gone}");
        }
        assert_eq!(
            v["spec"],
            json!({"accessModes": ["ReadWriteOnce"], "storageClassName": "hostpath-csi", "volumeName": "pvc-1-hpp",
                   "volumeMode": "Filesystem", "resources": {"requests": {"storage": "5Gi"}}})
        );
        assert!(v.get("status").is_none());
    }

    #[test]
    fn the_new_pv_is_what_csi_provisioner_would_have_made_retained_until_done() {
        let old: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": "pvc-1"},
            "spec": {"capacity": {"storage": "5Gi"}, "accessModes": ["ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Delete", "hostPath": {"path": "/var/hpvolumes/csi/pvc-1"}},
        }))
        .unwrap();
        let pool = PoolInfo {
            name: "local".into(),
            base: "/var/hpvolumes".into(),
            dir: "/var/hpvolumes/csi".into(),
            shared: false,
            quota: QuotaMode::None,
            snapshots: false,
            path_config: false,
        };
        let class = ClassInfo {
            name: "hostpath-csi".into(),
            pool: "local".into(),
            parameters: BTreeMap::from([
                ("storagePool".into(), "local".into()),
                ("nodeLossPolicy".into(), "Recreate".into()),
                ("csi.storage.k8s.io/fstype".into(), "xfs".into()),
            ]),
            mount_options: vec![],
        };
        let v = NewVolume {
            old_pv: &old,
            source: Source::KubevirtLegacy,
            node: Some("node-a"),
            directory: "/var/hpvolumes/csi/pvc-1",
            pool: &pool,
            volume_id: "pvc-1",
            class: &class,
            reclaim_policy: "Delete",
        };
        let template = new_claim(&claim(), "pvc-1-hpp", "hostpath-csi", "pvc-1");
        let pv = new_pv(&v, &template, "u-1").unwrap();
        let j = serde_json::to_value(&pv).unwrap();
        assert_eq!(j["metadata"]["name"], "pvc-1-hpp");
        assert_eq!(j["spec"]["persistentVolumeReclaimPolicy"], "Retain");
        assert_eq!(j["spec"]["capacity"]["storage"], "5Gi");
        assert_eq!(
            j["spec"]["claimRef"],
            json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": "shop", "name": "data"})
        );
        assert_eq!(
            j["spec"]["csi"],
            json!({"driver": DRIVER_NAME, "volumeHandle": "pvc-1", "volumeAttributes": {
                "storagePool": "local", "nodeLossPolicy": "Recreate",
                ATTR_CLAIM_NAME: "data", ATTR_CLAIM_NAMESPACE: "shop", ATTR_PV_NAME: "pvc-1-hpp"}})
        );
        assert_eq!(
            j["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0],
            json!({"key": TOPOLOGY_KEY, "operator": "In", "values": ["node-a"]})
        );
        let ann = &j["metadata"]["annotations"];
        assert_eq!(ann[ANNOTATION_PROVISIONED_BY], DRIVER_NAME);
        assert_eq!(ann[keys::RECLAIM_POLICY], "Delete");
        assert_eq!(ann[keys::STATE], keys::STATE_PENDING);
        assert_eq!(ann[keys::ADOPTED_DIRECTORY], "node-a:/var/hpvolumes/csi/pvc-1");
        assert_eq!(claim_template(&pv).unwrap(), template);

        let shared = PoolInfo {
            shared: true,
            ..pool.clone()
        };
        let on_shared = new_pv(&NewVolume { pool: &shared, ..v }, &template, "u-1").unwrap();
        assert!(on_shared.spec.unwrap().node_affinity.is_none());
    }
}
