//! Which provisioner made a PersistentVolume, read from the shape it gives its PVs. Pure.
//!
//! Each recognised shape, and where it comes from:
//!
//! - **kubevirt-legacy**: KubeVirt's legacy provisioner (`kubevirt/hostpath-provisioner`,
//!   `cmd/provisioner/hostpath-provisioner.go`, `Provision`): a `hostPath` PV (no type) on
//!   `PV_DIR/<pv>` (or `PV_DIR/<claim>-<pv>` with `USE_NAMING_PREFIX`), annotations
//!   `hostPathProvisionerIdentity: kubevirt.io/hostpath-provisioner` and
//!   `kubevirt.io/provisionOnNode: <node>`, `pv.kubernetes.io/provisioned-by` from the library,
//!   node affinity `kubernetes.io/hostname In [<node>]`. hpp's own `hpp-provisioner --mode
//!   kubevirt` makes the same shape (`hpp-legacy/src/pv.rs`, `build_pv`), with a `Directory`
//!   hostPath type and the Node's hostname label in the affinity.
//! - **local-path-provisioner**: rancher's (`rancher/local-path-provisioner`, `provisioner.go`,
//!   `provisionFor`): `<path>/<pv>_<namespace>_<claim>` (or a `pathPattern`), a `hostPath`
//!   (`DirectoryOrCreate`) or, with `volumeType: local`, a `local` PV, the annotation
//!   `local.path.provisioner/selected-node: <node>`, provisioned-by `rancher.io/local-path`
//!   (its default `--provisioner-name`), node affinity `kubernetes.io/hostname In [<hostname
//!   label>]`, none on a `sharedFileSystemPath`.
//! - **openebs-hostpath**: OpenEBS LocalPV hostpath (`openebs/dynamic-localpv-provisioner`,
//!   `cmd/provisioner-localpv/app/provisioner_hostpath.go`, `ProvisionHostPath`; `GetPath` in
//!   `config.go`): a `local` PV on `<BasePath>/<pv>` (default `/var/openebs/local`), label
//!   `openebs.io/cas-type: local-hostpath`, provisioned-by `openebs.io/local`, node affinity on
//!   `kubernetes.io/hostname` or the class's `NodeAffinityLabels`.
//! - **torchbox**: the shared-filesystem provisioner (`torchbox/k8s-hostpath-provisioner`,
//!   `hostpath-provisioner.go`, `Provision`): a `hostPath` PV on `<pvDir>/<pv>`, annotation
//!   `torchbox.com/hostpath-provisioner-id`, provisioned-by `torchbox.com/hostpath`, no node
//!   affinity (the same filesystem is mounted on every node). `hpp-provisioner --mode shared`
//!   writes the same annotations.
//! - **hostpath**: any other `hostPath` or `local` PV: made by hand, or by the single-node
//!   provisioner (`MaZderMind/hostpath-provisioner`: `PV_DIR/<ns>-<claim>-<pv>`, no affinity,
//!   `hostPathProvisionerIdentity: <node name>`).

use hpp_api::constants::{
    ANNOTATION_PROVISIONED_BY, ANNOTATION_PROVISIONER_IDENTITY, DRIVER_NAME, LEGACY_PROVISIONER_NAME,
};
use k8s_openapi::api::core::v1::PersistentVolume;
use serde::Serialize;

/// Provisioner name of rancher's local-path-provisioner (its default `--provisioner-name`).
pub const LOCAL_PATH_PROVISIONER: &str = "rancher.io/local-path";
/// PV annotation local-path-provisioner records the node in.
pub const LOCAL_PATH_SELECTED_NODE: &str = "local.path.provisioner/selected-node";
/// Provisioner name of OpenEBS LocalPV.
pub const OPENEBS_PROVISIONER: &str = "openebs.io/local";
/// PV label OpenEBS LocalPV sets to `local-<storage type>`.
pub const OPENEBS_CAS_TYPE: &str = "openebs.io/cas-type";
/// Provisioner name of torchbox's shared-filesystem provisioner.
pub const TORCHBOX_PROVISIONER: &str = "torchbox.com/hostpath";
/// PV annotation torchbox's provisioner records its identity in (also `hpp-legacy`'s
/// `ANNOTATION_TORCHBOX_IDENTITY`).
pub const TORCHBOX_IDENTITY: &str = "torchbox.com/hostpath-provisioner-id";

/// The provisioner a directory volume came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// KubeVirt's legacy (non-CSI) hostPath provisioner, or hpp's in its `kubevirt` mode.
    KubevirtLegacy,
    /// rancher/local-path-provisioner.
    LocalPathProvisioner,
    /// OpenEBS LocalPV hostpath.
    OpenebsHostpath,
    /// torchbox/k8s-hostpath-provisioner, or hpp's `shared` mode.
    Torchbox,
    /// A hand-made hostPath/local PV, or one of a provisioner not named above.
    Hostpath,
}

impl Source {
    /// The name shown in tables and annotations.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::KubevirtLegacy => "kubevirt-legacy",
            Source::LocalPathProvisioner => "local-path-provisioner",
            Source::OpenebsHostpath => "openebs-hostpath",
            Source::Torchbox => "torchbox",
            Source::Hostpath => "hostpath",
        }
    }

    /// The source named `s` ([`Source::as_str`]).
    pub fn parse(s: &str) -> Option<Source> {
        [
            Source::KubevirtLegacy,
            Source::LocalPathProvisioner,
            Source::OpenebsHostpath,
            Source::Torchbox,
            Source::Hostpath,
        ]
        .into_iter()
        .find(|x| x.as_str() == s)
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a PV's volume is, as far as adoption is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Volume {
    /// A directory on a node: a `hostPath` or `local` PV.
    Directory {
        /// Who made it.
        source: Source,
        /// The directory, as the PV names it.
        path: String,
    },
    /// Already a volume of hpp's CSI driver.
    Hpp,
    /// Anything else (another CSI driver, NFS, ...), named for the refusal.
    Other(String),
}

/// Classifies `pv`.
pub fn classify(pv: &PersistentVolume) -> Volume {
    let Some(spec) = pv.spec.as_ref() else {
        return Volume::Other("a PersistentVolume without a spec".into());
    };
    if let Some(csi) = &spec.csi {
        return match csi.driver.as_str() {
            DRIVER_NAME => Volume::Hpp,
            other => Volume::Other(format!("a volume of CSI driver {other}")),
        };
    }
    let path = match (&spec.host_path, &spec.local) {
        (Some(h), _) => h.path.clone(),
        (None, Some(l)) => l.path.clone(),
        (None, None) => return Volume::Other(format!("a volume of type {}", other_kind(pv))),
    };
    Volume::Directory {
        source: source_of(pv),
        path,
    }
}

/// The provisioner of a directory PV, from its annotations and labels.
fn source_of(pv: &PersistentVolume) -> Source {
    let annotation = |key: &str| {
        pv.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
    };
    let label = |key: &str| pv.metadata.labels.as_ref().and_then(|l| l.get(key)).map(String::as_str);
    let by = annotation(ANNOTATION_PROVISIONED_BY);
    if by == Some(LEGACY_PROVISIONER_NAME)
        || annotation(ANNOTATION_PROVISIONER_IDENTITY) == Some(LEGACY_PROVISIONER_NAME)
    {
        Source::KubevirtLegacy
    } else if by == Some(TORCHBOX_PROVISIONER) || annotation(TORCHBOX_IDENTITY).is_some() {
        Source::Torchbox
    } else if by == Some(LOCAL_PATH_PROVISIONER) || annotation(LOCAL_PATH_SELECTED_NODE).is_some() {
        Source::LocalPathProvisioner
    } else if by == Some(OPENEBS_PROVISIONER) || label(OPENEBS_CAS_TYPE) == Some("local-hostpath") {
        Source::OpenebsHostpath
    } else {
        Source::Hostpath
    }
}

/// The volume source a PV has, by its field name, for a refusal ("nfs", "iscsi", ...).
fn other_kind(pv: &PersistentVolume) -> String {
    serde_json::to_value(&pv.spec)
        .ok()
        .and_then(|spec| {
            spec.as_object()
                .and_then(|o| o.keys().find(|k| !NOT_SOURCES.contains(&k.as_str())).cloned())
        })
        .unwrap_or_else(|| "none".into())
}

/// Fields of a PV spec that are not its volume source.
const NOT_SOURCES: &[&str] = &[
    "accessModes",
    "capacity",
    "claimRef",
    "mountOptions",
    "nodeAffinity",
    "persistentVolumeReclaimPolicy",
    "storageClassName",
    "volumeAttributesClassName",
    "volumeMode",
];

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn pv(v: serde_json::Value) -> PersistentVolume {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn each_provisioner_is_told_by_what_it_writes() {
        let dir = |meta: serde_json::Value, source: serde_json::Value| {
            let mut spec = json!({"capacity": {"storage": "1Gi"}});
            spec.as_object_mut()
                .unwrap()
                .extend(source.as_object().unwrap().clone());
            classify(&pv(json!({"metadata": meta, "spec": spec})))
        };
        let host = json!({"hostPath": {"path": "/d/x"}});
        let local = json!({"local": {"path": "/d/x"}});
        let cases = [
            (
                json!({"annotations": {"hostPathProvisionerIdentity": "kubevirt.io/hostpath-provisioner"}}),
                &host,
                Source::KubevirtLegacy,
            ),
            (
                json!({"annotations": {"pv.kubernetes.io/provisioned-by": "kubevirt.io/hostpath-provisioner"}}),
                &host,
                Source::KubevirtLegacy,
            ),
            (
                json!({"annotations": {"local.path.provisioner/selected-node": "n1"}}),
                &local,
                Source::LocalPathProvisioner,
            ),
            (
                json!({"annotations": {"pv.kubernetes.io/provisioned-by": "rancher.io/local-path"}}),
                &host,
                Source::LocalPathProvisioner,
            ),
            (
                json!({"labels": {"openebs.io/cas-type": "local-hostpath"}}),
                &local,
                Source::OpenebsHostpath,
            ),
            (
                json!({"annotations": {"pv.kubernetes.io/provisioned-by": "openebs.io/local"}}),
                &local,
                Source::OpenebsHostpath,
            ),
            (
                json!({"annotations": {"torchbox.com/hostpath-provisioner-id": "torchbox.com/hostpath"}}),
                &host,
                Source::Torchbox,
            ),
            (
                json!({"annotations": {"hostPathProvisionerIdentity": "node-a"}}),
                &host,
                Source::Hostpath,
            ),
            (json!({}), &local, Source::Hostpath),
        ];
        for (meta, source, want) in cases {
            assert_eq!(
                dir(meta.clone(), source.clone()),
                Volume::Directory {
                    source: want,
                    path: "/d/x".into()
                },
                "{meta}"
            );
        }
    }

    #[test]
    fn csi_and_other_volumes_are_named() {
        let hpp = pv(json!({"spec": {"csi": {"driver": DRIVER_NAME, "volumeHandle": "v"}}}));
        assert_eq!(classify(&hpp), Volume::Hpp);
        let other = pv(json!({"spec": {"csi": {"driver": "rbd.csi.ceph.com", "volumeHandle": "v"}}}));
        assert_eq!(
            classify(&other),
            Volume::Other("a volume of CSI driver rbd.csi.ceph.com".into())
        );
        let nfs = pv(
            json!({"spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"],
                                     "nfs": {"server": "s", "path": "/e"}}}),
        );
        assert_eq!(classify(&nfs), Volume::Other("a volume of type nfs".into()));
    }
}
