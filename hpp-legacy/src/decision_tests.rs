use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    HostPathVolumeSource, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus, PersistentVolumeSpec,
    PersistentVolumeStatus, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use super::*;
use crate::config::ReclaimOverride;

fn cfg(mode: Mode) -> ProvisionerConfig {
    let dir = match mode {
        Mode::Shared => None,
        _ => Some(PathBuf::from("/var/hpvolumes")),
    };
    ProvisionerConfig::new(mode, Some("node-a".into()), dir)
}

fn class(name: &str, provisioner: &str, wffc: bool, params: &[(&str, &str)]) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        provisioner: provisioner.into(),
        volume_binding_mode: Some(if wffc { "WaitForFirstConsumer" } else { "Immediate" }.into()),
        reclaim_policy: Some("Delete".into()),
        parameters: (!params.is_empty())
            .then(|| params.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()),
        ..Default::default()
    }
}

/// A Pending claim no storage-provisioner annotation addresses yet.
fn claim(annotations: &[(&str, &str)]) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("data".into()),
            namespace: Some("ns".into()),
            uid: Some("u-1".into()),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: Some("sc".into()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".to_owned(), Quantity("1Gi".into()))])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: Some(PersistentVolumeClaimStatus {
            phase: Some("Pending".into()),
            ..Default::default()
        }),
    }
}

/// [`decide_claim`] on `claim` as the PV controller hands it over: addressed to the class's
/// provisioner (the annotation it sets once no existing PV binds the claim), unless the test
/// addressed it itself.
fn decide(cfg: &ProvisionerConfig, claim: &PersistentVolumeClaim, class: Option<&StorageClass>) -> ClaimDecision {
    let mut claim = claim.clone();
    if let Some(class) = class {
        let annotations = claim.metadata.annotations.get_or_insert_default();
        if !annotations.contains_key(ANNOTATION_BETA_STORAGE_PROVISIONER) {
            annotations
                .entry(ANNOTATION_STORAGE_PROVISIONER.to_owned())
                .or_insert_with(|| class.provisioner.clone());
        }
    }
    decide_claim(cfg, &claim, class)
}

fn plan_of(d: ClaimDecision) -> ProvisionPlan {
    match d {
        ClaimDecision::Provision(p) => *p,
        other => panic!("expected Provision, got {other:?}"),
    }
}

fn refusal_of(d: ClaimDecision) -> RefusalReason {
    match d {
        ClaimDecision::Refuse(r) => r.reason,
        other => panic!("expected Refuse, got {other:?}"),
    }
}

const KV: &str = hpp_api::constants::LEGACY_PROVISIONER_NAME;

#[test]
fn kubevirt_provision_on_node_must_match() {
    let c = cfg(Mode::Kubevirt);
    let sc = class("sc", KV, false, &[]);
    let mine = claim(&[(ANNOTATION_PROVISION_ON_NODE, "node-a")]);
    let p = plan_of(decide(&c, &mine, Some(&sc)));
    assert_eq!(p.pv_name, "pvc-u-1");
    assert_eq!(p.dir(), PathBuf::from("/var/hpvolumes/pvc-u-1"));
    assert_eq!(p.node.as_deref(), Some("node-a"));
    assert_eq!(p.dir_mode, 0o777);
    let theirs = claim(&[(ANNOTATION_PROVISION_ON_NODE, "node-b")]);
    assert_eq!(
        decide(&c, &theirs, Some(&sc)),
        ClaimDecision::Ignore(IgnoreReason::OtherNode)
    );
    // Immediate claims without the annotation are never provisioned (as in KubeVirt).
    assert_eq!(
        decide(&c, &claim(&[]), Some(&sc)),
        ClaimDecision::Ignore(IgnoreReason::NoNodeYet)
    );
    // selected-node counts only for WaitForFirstConsumer classes.
    let sel = claim(&[(ANNOTATION_SELECTED_NODE, "node-a")]);
    assert_eq!(
        decide(&c, &sel, Some(&sc)),
        ClaimDecision::Ignore(IgnoreReason::NoNodeYet)
    );
}

#[test]
fn kubevirt_wffc_uses_selected_node_and_naming_prefix() {
    let mut c = cfg(Mode::Kubevirt);
    c.use_naming_prefix = true;
    let sc = class("sc", KV, true, &[]);
    let p = plan_of(decide(&c, &claim(&[(ANNOTATION_SELECTED_NODE, "node-a")]), Some(&sc)));
    assert_eq!(p.rel_dir, PathBuf::from("data-pvc-u-1"));
    let other = claim(&[(ANNOTATION_SELECTED_NODE, "node-b")]);
    assert_eq!(
        decide(&c, &other, Some(&sc)),
        ClaimDecision::Ignore(IgnoreReason::OtherNode)
    );
    assert_eq!(
        decide(&c, &claim(&[]), Some(&sc)),
        ClaimDecision::Ignore(IgnoreReason::NoNodeYet)
    );
}

#[test]
fn other_provisioners_and_bound_claims_are_ignored() {
    let c = cfg(Mode::SingleNode);
    let sc = class("sc", "someone/else", false, &[]);
    assert_eq!(
        decide(&c, &claim(&[]), Some(&sc)),
        ClaimDecision::Ignore(IgnoreReason::OtherProvisioner)
    );
    assert_eq!(
        decide(&c, &claim(&[]), None),
        ClaimDecision::Ignore(IgnoreReason::OtherProvisioner)
    );
    let sc = class("sc", "hostpath", false, &[]);
    let addressed = claim(&[(ANNOTATION_STORAGE_PROVISIONER, "someone/else")]);
    assert_eq!(
        decide(&c, &addressed, Some(&sc)),
        ClaimDecision::Ignore(IgnoreReason::OtherProvisioner)
    );
    let mut bound = claim(&[]);
    bound.spec.as_mut().unwrap().volume_name = Some("pv".into());
    assert_eq!(
        decide(&c, &bound, Some(&sc)),
        ClaimDecision::Ignore(IgnoreReason::NotPending)
    );
}

#[test]
fn single_node_names_and_reclaim() {
    let mut c = cfg(Mode::SingleNode);
    let sc = class("sc", "hostpath", false, &[]);
    let p = plan_of(decide(&c, &claim(&[]), Some(&sc)));
    assert_eq!(p.rel_dir, PathBuf::from("ns-data-pvc-u-1"));
    assert_eq!(p.reclaim_policy, "Delete");
    assert_eq!(p.dir_mode, 0o770);
    c.reclaim_override = Some(ReclaimOverride::Retain);
    assert_eq!(plan_of(decide(&c, &claim(&[]), Some(&sc))).reclaim_policy, "Retain");
    let other = claim(&[(ANNOTATION_SELECTED_NODE, "node-b")]);
    assert_eq!(
        decide(&c, &other, Some(&sc)),
        ClaimDecision::Ignore(IgnoreReason::OtherNode)
    );
}

#[test]
fn shared_mode_takes_pv_dir_and_allows_rwx() {
    let c = cfg(Mode::Shared);
    let sc = class(
        "sc",
        "torchbox.com/hostpath",
        false,
        &[("pvDir", "/mnt/ceph/k8s"), ("dirMode", "0750")],
    );
    let mut rwx = claim(&[]);
    rwx.spec.as_mut().unwrap().access_modes = Some(vec!["ReadWriteMany".into()]);
    let p = plan_of(decide(&c, &rwx, Some(&sc)));
    assert_eq!(p.dir(), PathBuf::from("/mnt/ceph/k8s/pvc-u-1"));
    assert_eq!(p.node, None);
    assert_eq!(p.dir_mode, 0o750);
    assert_eq!(p.access_modes, vec!["ReadWriteMany"]);
    let no_dir = class("sc", "torchbox.com/hostpath", false, &[]);
    assert_eq!(
        refusal_of(decide(&c, &claim(&[]), Some(&no_dir))),
        RefusalReason::NoBaseDir
    );
}

#[test]
fn refusals() {
    let c = cfg(Mode::SingleNode);
    let sc = class("sc", "hostpath", false, &[]);
    let mut block = claim(&[]);
    block.spec.as_mut().unwrap().volume_mode = Some("Block".into());
    assert_eq!(refusal_of(decide(&c, &block, Some(&sc))), RefusalReason::BlockMode);
    let mut rwx = claim(&[]);
    rwx.spec.as_mut().unwrap().access_modes = Some(vec!["ReadWriteMany".into()]);
    assert_eq!(refusal_of(decide(&c, &rwx, Some(&sc))), RefusalReason::AccessMode);
    let mut sel = claim(&[]);
    sel.spec.as_mut().unwrap().selector = Some(LabelSelector::default());
    assert_eq!(refusal_of(decide(&c, &sel, Some(&sc))), RefusalReason::Selector);
    let mut nosize = claim(&[]);
    nosize.spec.as_mut().unwrap().resources = None;
    assert_eq!(refusal_of(decide(&c, &nosize, Some(&sc))), RefusalReason::BadRequest);
    let typo = class("sc", "hostpath", false, &[("pvDirectory", "/x")]);
    assert_eq!(
        refusal_of(decide(&c, &claim(&[]), Some(&typo))),
        RefusalReason::BadParameters
    );
    let shared_only = class("sc", "hostpath", false, &[("pvDir", "/x")]);
    assert_eq!(
        refusal_of(decide(&c, &claim(&[]), Some(&shared_only))),
        RefusalReason::BadParameters
    );
    let evil = class("sc", "hostpath", false, &[("pathTemplate", "../{pv}")]);
    assert_eq!(
        refusal_of(decide(&c, &claim(&[]), Some(&evil))),
        RefusalReason::BadTemplate
    );
    let nopv = class("sc", "hostpath", false, &[("pathTemplate", "{claim}")]);
    assert_eq!(
        refusal_of(decide(&c, &claim(&[]), Some(&nopv))),
        RefusalReason::BadTemplate
    );
}

#[test]
fn capacity() {
    assert!(check_capacity(10, 10).is_ok());
    assert_eq!(check_capacity(11, 10).unwrap_err().reason, RefusalReason::TooLarge);
}

fn pv(phase: &str, policy: &str, ann: &[(&str, &str)], path: &str) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some("pvc-u-1".into()),
            annotations: Some(ann.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            persistent_volume_reclaim_policy: Some(policy.into()),
            host_path: Some(HostPathVolumeSource {
                path: path.into(),
                type_: None,
            }),
            ..Default::default()
        }),
        status: Some(PersistentVolumeStatus {
            phase: Some(phase.into()),
            ..Default::default()
        }),
    }
}

#[test]
fn kubevirt_volume_deletion_rules() {
    let c = cfg(Mode::Kubevirt);
    let ok = [
        (ANNOTATION_PROVISIONED_BY, KV),
        (ANNOTATION_PROVISIONER_IDENTITY, KV),
        (ANNOTATION_PROVISION_ON_NODE, "node-a"),
    ];
    let d = decide_volume(&c, &pv("Released", "Delete", &ok, "/var/hpvolumes/pvc-u-1"), None);
    assert_eq!(
        d,
        VolumeDecision::Delete {
            dir: "/var/hpvolumes/pvc-u-1".into(),
            base_dir: "/var/hpvolumes".into(),
            archive: false
        }
    );
    assert!(matches!(
        decide_volume(&c, &pv("Bound", "Delete", &ok, "/var/hpvolumes/x"), None),
        VolumeDecision::Ignore(_)
    ));
    assert!(matches!(
        decide_volume(&c, &pv("Released", "Retain", &ok, "/var/hpvolumes/x"), None),
        VolumeDecision::Ignore(_)
    ));
    let other_node = [ok[0], ok[1], (ANNOTATION_PROVISION_ON_NODE, "node-b")];
    assert!(matches!(
        decide_volume(&c, &pv("Released", "Delete", &other_node, "/var/hpvolumes/x"), None),
        VolumeDecision::Ignore(_)
    ));
    let no_identity = [ok[0], ok[2]];
    assert!(matches!(
        decide_volume(&c, &pv("Released", "Delete", &no_identity, "/var/hpvolumes/x"), None),
        VolumeDecision::Refuse(_)
    ));
    for outside in ["/etc", "/var/hpvolumes", "/var/hpvolumes/../etc", "/var/hpvolumesX/a"] {
        assert!(
            matches!(
                decide_volume(&c, &pv("Released", "Delete", &ok, outside), None),
                VolumeDecision::Refuse(_)
            ),
            "{outside}"
        );
    }
    let foreign = [(ANNOTATION_PROVISIONED_BY, "x"), ok[1], ok[2]];
    assert!(matches!(
        decide_volume(&c, &pv("Released", "Delete", &foreign, "/var/hpvolumes/x"), None),
        VolumeDecision::Ignore(_)
    ));
}

#[test]
fn shared_volume_base_dir_from_annotation_or_class() {
    let c = cfg(Mode::Shared);
    let name = "torchbox.com/hostpath";
    // PVs of the original shared provisioner carry its own identity annotation.
    let base = [
        (ANNOTATION_PROVISIONED_BY, name),
        (crate::config::ANNOTATION_TORCHBOX_IDENTITY, name),
    ];
    let old = pv("Released", "Delete", &base, "/mnt/ceph/pvc-u-1");
    assert!(matches!(decide_volume(&c, &old, None), VolumeDecision::Refuse(_)));
    let params = ClassParams {
        pv_dir: Some("/mnt/ceph".into()),
        ..Default::default()
    };
    assert!(matches!(
        decide_volume(&c, &old, Some(&params)),
        VolumeDecision::Delete { .. }
    ));
    let new = [
        base[0],
        base[1],
        (ANNOTATION_BASE_DIR, "/mnt/ceph"),
        (ANNOTATION_ARCHIVE_ON_DELETE, "true"),
    ];
    assert!(matches!(
        decide_volume(&c, &pv("Released", "Delete", &new, "/mnt/ceph/pvc-u-1"), None),
        VolumeDecision::Delete { archive: true, .. }
    ));
}

#[test]
fn a_recorded_base_dir_must_be_one_the_provisioner_uses() {
    let kv = cfg(Mode::Kubevirt);
    let ours = [
        (ANNOTATION_PROVISIONED_BY, KV),
        (ANNOTATION_PROVISIONER_IDENTITY, KV),
        (ANNOTATION_PROVISION_ON_NODE, "node-a"),
    ];
    let with_base = |base: &'static str| [ours[0], ours[1], ours[2], (ANNOTATION_BASE_DIR, base)];
    // Edited to `/`: every hostPath would be "inside" it.
    let widened = pv("Released", "Delete", &with_base("/"), "/etc/kubernetes");
    assert!(matches!(decide_volume(&kv, &widened, None), VolumeDecision::Refuse(m) if m.contains("not one")));
    let recorded = pv(
        "Released",
        "Delete",
        &with_base("/var/hpvolumes"),
        "/var/hpvolumes/pvc-u-1",
    );
    assert!(matches!(
        decide_volume(&kv, &recorded, None),
        VolumeDecision::Delete { .. }
    ));

    // Shared mode: the class's pvDir or PV_DIR; with neither known, the record is all there is.
    let mut shared = cfg(Mode::Shared);
    let name = shared.provisioner_name.clone();
    let mine = [
        (ANNOTATION_PROVISIONED_BY, name.as_str()),
        (ANNOTATION_PROVISIONER_IDENTITY, name.as_str()),
        (ANNOTATION_BASE_DIR, "/mnt/ceph"),
    ];
    let vol = pv("Released", "Delete", &mine, "/mnt/ceph/pvc-u-1");
    let class_dir = |dir: &str| ClassParams {
        pv_dir: Some(dir.into()),
        ..Default::default()
    };
    assert!(matches!(
        decide_volume(&shared, &vol, None),
        VolumeDecision::Delete { .. }
    ));
    assert!(matches!(
        decide_volume(&shared, &vol, Some(&class_dir("/mnt/ceph"))),
        VolumeDecision::Delete { .. }
    ));
    assert!(matches!(
        decide_volume(&shared, &vol, Some(&class_dir("/mnt/other"))),
        VolumeDecision::Refuse(_)
    ));
    shared.pv_dir = Some(PathBuf::from("/mnt/ceph"));
    assert!(matches!(
        decide_volume(&shared, &vol, Some(&class_dir("/mnt/other"))),
        VolumeDecision::Delete { .. }
    ));
}

#[test]
fn strictly_inside() {
    assert!(is_strictly_inside(Path::new("/a/b/c"), Path::new("/a/b")));
    assert!(!is_strictly_inside(Path::new("/a/b"), Path::new("/a/b")));
    assert!(!is_strictly_inside(Path::new("/a/b/../c"), Path::new("/a/b")));
    assert!(!is_strictly_inside(Path::new("/a/bc"), Path::new("/a/b")));
    assert!(!is_strictly_inside(Path::new("a/b/c"), Path::new("a/b")));
}

#[test]
fn claims_wait_until_the_pv_controller_addresses_them() {
    for mode in [Mode::Kubevirt, Mode::SingleNode, Mode::Shared] {
        let mut c = cfg(mode);
        if mode == Mode::Shared {
            c.pv_dir = Some(PathBuf::from("/mnt/shared"));
        }
        let me = c.provisioner_name.clone();
        let sc = class("sc", &me, false, &[]);
        let on_node = [(ANNOTATION_PROVISION_ON_NODE, "node-a")];
        // Immediate claim, no annotation yet: the PV controller may still bind it to an
        // existing PV.
        let waiting = claim(&[]);
        assert_eq!(
            decide_claim(&c, &waiting, Some(&sc)),
            ClaimDecision::Ignore(IgnoreReason::NotAddressed),
            "{mode:?}"
        );
        // KubeVirt's exception: provisionOnNode naming this node addresses it.
        assert!(
            matches!(
                decide_claim(&c, &claim(&on_node), Some(&sc)),
                ClaimDecision::Provision(_)
            ),
            "{mode:?}"
        );
        // The beta annotation counts when the GA one is absent; the GA one wins when both are set.
        let beta = claim(&[(ANNOTATION_BETA_STORAGE_PROVISIONER, me.as_str()), on_node[0]]);
        assert!(matches!(
            decide_claim(&c, &beta, Some(&sc)),
            ClaimDecision::Provision(_)
        ));
        let both = claim(&[
            (ANNOTATION_STORAGE_PROVISIONER, me.as_str()),
            (ANNOTATION_BETA_STORAGE_PROVISIONER, "someone/else"),
            on_node[0],
        ]);
        assert!(matches!(
            decide_claim(&c, &both, Some(&sc)),
            ClaimDecision::Provision(_)
        ));
        let elsewhere = claim(&[(ANNOTATION_STORAGE_PROVISIONER, "someone/else"), on_node[0]]);
        assert_eq!(
            decide_claim(&c, &elsewhere, Some(&sc)),
            ClaimDecision::Ignore(IgnoreReason::OtherProvisioner)
        );
    }
}

#[test]
fn shared_mode_waits_for_the_scheduler_on_wait_for_first_consumer_classes() {
    let mut c = cfg(Mode::Shared);
    c.pv_dir = Some(PathBuf::from("/mnt/shared"));
    let sc = class("sc", &c.provisioner_name, true, &[]);
    assert_eq!(
        decide(&c, &claim(&[]), Some(&sc)),
        ClaimDecision::Ignore(IgnoreReason::NoNodeYet)
    );
    let scheduled = claim(&[(ANNOTATION_SELECTED_NODE, "node-z")]);
    let p = plan_of(decide(&c, &scheduled, Some(&sc)));
    assert_eq!(p.node, None);
}

#[test]
fn clones_and_restores_are_refused_and_populators_left_alone() {
    use k8s_openapi::api::core::v1::{TypedLocalObjectReference, TypedObjectReference};
    let c = cfg(Mode::Kubevirt);
    let sc = class("sc", KV, true, &[]);
    let base = claim(&[(ANNOTATION_SELECTED_NODE, "node-a")]);
    let with = |source: Option<TypedLocalObjectReference>, source_ref: Option<TypedObjectReference>| {
        let mut c = base.clone();
        let spec = c.spec.get_or_insert_default();
        spec.data_source = source;
        spec.data_source_ref = source_ref;
        c
    };
    let local = |group: Option<&str>, kind: &str| TypedLocalObjectReference {
        api_group: group.map(str::to_owned),
        kind: kind.into(),
        name: "src".into(),
    };
    let typed = |group: Option<&str>, kind: &str| TypedObjectReference {
        api_group: group.map(str::to_owned),
        kind: kind.into(),
        name: "src".into(),
        namespace: None,
    };
    let clone = with(
        Some(local(None, "PersistentVolumeClaim")),
        Some(typed(None, "PersistentVolumeClaim")),
    );
    assert_eq!(refusal_of(decide(&c, &clone, Some(&sc))), RefusalReason::DataSource);
    let restore = with(None, Some(typed(Some("snapshot.storage.k8s.io"), "VolumeSnapshot")));
    assert_eq!(refusal_of(decide(&c, &restore, Some(&sc))), RefusalReason::DataSource);
    let populated = with(
        Some(local(Some("cdi.kubevirt.io"), "VolumeImportSource")),
        Some(typed(Some("cdi.kubevirt.io"), "VolumeImportSource")),
    );
    assert_eq!(
        decide(&c, &populated, Some(&sc)),
        ClaimDecision::Ignore(IgnoreReason::Populator)
    );
    // Without a data source the same claim is provisioned.
    assert!(matches!(
        decide(&c, &with(None, None), Some(&sc)),
        ClaimDecision::Provision(_)
    ));
}
