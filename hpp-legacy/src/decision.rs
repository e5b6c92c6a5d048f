//! Pure decisions: should this instance provision this claim, and what should happen to a
//! released volume. No I/O; every outcome carries its reason.

use std::path::{Component, Path, PathBuf};

use hpp_api::constants::{
    ANNOTATION_BETA_STORAGE_PROVISIONER, ANNOTATION_PROVISION_ON_NODE, ANNOTATION_PROVISIONED_BY,
    ANNOTATION_PROVISIONER_IDENTITY, ANNOTATION_SELECTED_NODE, ANNOTATION_STORAGE_PROVISIONER,
};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;

use crate::config::{
    ANNOTATION_ARCHIVE_ON_DELETE, ANNOTATION_BASE_DIR, ANNOTATION_TORCHBOX_IDENTITY, Mode, ProvisionerConfig,
};
use crate::params::ClassParams;
use crate::quantity::parse_bytes;
use crate::template::{self, TemplateInput};

/// Why a claim was left alone without comment (it is not this instance's business).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IgnoreReason {
    /// Already bound, being deleted, or not Pending.
    NotPending,
    /// Its StorageClass is missing or names another provisioner.
    OtherProvisioner,
    /// Another node is to provision it.
    OtherNode,
    /// WaitForFirstConsumer claim without a selected node yet, or an Immediate claim in
    /// KubeVirt mode without `kubevirt.io/provisionOnNode`.
    NoNodeYet,
    /// No `volume.kubernetes.io/storage-provisioner` annotation names this provisioner yet. The
    /// PV controller sets it only after finding no existing PV to bind the claim to, so acting
    /// earlier would race that binding and leave our PV Released.
    NotAddressed,
    /// `dataSourceRef` names a volume populator: the populator provisions through a claim of
    /// its own, and this one must wait for it.
    Populator,
}

/// Why a claim addressed to this instance cannot be provisioned; each becomes an Event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RefusalReason {
    /// `volumeMode: Block`.
    BlockMode,
    /// `spec.selector` is set.
    Selector,
    /// An access mode the mode cannot honour.
    AccessMode,
    /// Missing or unreadable storage request.
    BadRequest,
    /// A StorageClass parameter is wrong.
    BadParameters,
    /// The directory template gave no safe name.
    BadTemplate,
    /// No base directory (shared mode without `pvDir`).
    NoBaseDir,
    /// The request exceeds the filesystem size.
    TooLarge,
    /// The base directory is not on the expected mount.
    MountGuard,
    /// The Node object or its hostname label could not be read.
    NodeUnknown,
    /// The claim asks for a clone or a snapshot restore, which hostPath directories cannot
    /// give; an empty volume in its place would look like lost data.
    DataSource,
}

impl RefusalReason {
    /// PascalCase name used as the Event reason and metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::BlockMode => "BlockModeNotSupported",
            RefusalReason::Selector => "SelectorNotSupported",
            RefusalReason::AccessMode => "AccessModeNotSupported",
            RefusalReason::BadRequest => "InvalidStorageRequest",
            RefusalReason::BadParameters => "InvalidStorageClassParameters",
            RefusalReason::BadTemplate => "UnsafeDirectoryName",
            RefusalReason::NoBaseDir => "NoBaseDirectory",
            RefusalReason::TooLarge => "RequestTooLarge",
            RefusalReason::MountGuard => "BaseDirectoryNotMounted",
            RefusalReason::NodeUnknown => "NodeUnknown",
            RefusalReason::DataSource => "DataSourceNotSupported",
        }
    }
}

/// A refusal with the human-readable explanation put on the claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Bounded reason.
    pub reason: RefusalReason,
    /// What the user should know.
    pub message: String,
}

impl Refusal {
    /// Builds a refusal.
    pub fn new(reason: RefusalReason, message: impl Into<String>) -> Self {
        Refusal {
            reason,
            message: message.into(),
        }
    }
}

/// Everything needed to create the directory and the PV for one claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProvisionPlan {
    /// Name of the PV (`pvc-<claim uid>`, as every classic provisioner did).
    pub pv_name: String,
    /// Base directory the volume lives under.
    pub base_dir: PathBuf,
    /// Directory relative to `base_dir`.
    pub rel_dir: PathBuf,
    /// Requested size in bytes.
    pub request_bytes: u64,
    /// Requested size as the claim spelled it (copied into the PV capacity).
    pub request_quantity: String,
    /// Access modes copied from the claim.
    pub access_modes: Vec<String>,
    /// Reclaim policy of the PV.
    pub reclaim_policy: String,
    /// StorageClass name copied to the PV.
    pub storage_class: String,
    /// Directory mode.
    pub dir_mode: u32,
    /// Directory owner.
    pub uid: Option<u32>,
    /// Directory group.
    pub gid: Option<u32>,
    /// Rename instead of remove on delete.
    pub archive_on_delete: bool,
    /// Set the CephFS quota xattr to the request.
    pub cephfs_quota: bool,
    /// Node whose disk holds the volume (node-local modes).
    pub node: Option<String>,
    /// StorageClass parameters (the mount guard needs them).
    pub params: ClassParams,
    /// The class's `mountOptions`: a hostPath volume cannot apply them, and the kubelet refuses
    /// to mount a hostPath PV that carries any, so they stay off the PV and the user is warned.
    pub ignored_mount_options: Vec<String>,
}

impl ProvisionPlan {
    /// Absolute directory of the volume.
    pub fn dir(&self) -> PathBuf {
        self.base_dir.join(&self.rel_dir)
    }
}

/// Outcome of looking at one claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimDecision {
    /// Not this instance's business.
    Ignore(IgnoreReason),
    /// Addressed to this instance but impossible: tell the user.
    Refuse(Refusal),
    /// Go ahead.
    Provision(Box<ProvisionPlan>),
}

/// Name of the PV for a claim, the convention of every classic provisioner.
pub fn pv_name_for(claim: &PersistentVolumeClaim) -> Option<String> {
    claim.metadata.uid.as_ref().map(|uid| format!("pvc-{uid}"))
}

/// Decides whether this instance provisions `claim`.
pub fn decide_claim(
    cfg: &ProvisionerConfig,
    claim: &PersistentVolumeClaim,
    class: Option<&StorageClass>,
) -> ClaimDecision {
    use ClaimDecision::{Ignore, Refuse};
    let meta = &claim.metadata;
    let spec = claim.spec.clone().unwrap_or_default();
    let phase = claim
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending");
    if meta.deletion_timestamp.is_some() || spec.volume_name.is_some() || phase != "Pending" {
        return Ignore(IgnoreReason::NotPending);
    }
    let Some(class) = class.filter(|c| c.provisioner == cfg.provisioner_name) else {
        return Ignore(IgnoreReason::OtherProvisioner);
    };
    if data_source(&spec) == Some(DataSource::Populator) {
        return Ignore(IgnoreReason::Populator);
    }
    let annotations = meta.annotations.clone().unwrap_or_default();
    let on_node = annotations.get(ANNOTATION_PROVISION_ON_NODE);
    let node = cfg.node_name.as_ref();
    // Read as the provisioner library reads it: the GA annotation, else the beta one. The
    // claim may be addressed to someone else (e.g. after a class edit), or to nobody yet.
    let addressed = annotations
        .get(ANNOTATION_STORAGE_PROVISIONER)
        .or_else(|| annotations.get(ANNOTATION_BETA_STORAGE_PROVISIONER));
    match addressed {
        Some(p) if *p != cfg.provisioner_name => return Ignore(IgnoreReason::OtherProvisioner),
        Some(_) => {}
        // KubeVirt's one exception: a claim sent to this node by `kubevirt.io/provisionOnNode`
        // counts as addressed to us.
        None if on_node.is_some() && on_node == node => {}
        None => return Ignore(IgnoreReason::NotAddressed),
    }
    let selected = annotations.get(ANNOTATION_SELECTED_NODE);
    let wffc = class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer");
    match cfg.mode {
        Mode::Kubevirt => {
            let target = on_node.or(if wffc { selected } else { None });
            match target {
                None => return Ignore(IgnoreReason::NoNodeYet),
                Some(t) if Some(t) != node => return Ignore(IgnoreReason::OtherNode),
                Some(_) => {}
            }
        }
        Mode::SingleNode => {
            if let (Some(target), Some(node)) = (on_node.or(selected), node)
                && target != node
            {
                return Ignore(IgnoreReason::OtherNode);
            }
            if wffc && selected.is_none() && on_node.is_none() {
                return Ignore(IgnoreReason::NoNodeYet);
            }
        }
        // Any replica can serve a shared filesystem, but a WaitForFirstConsumer claim still
        // waits for the scheduler, as the provisioner library makes every provisioner wait.
        Mode::Shared => {
            if wffc && selected.is_none() && on_node.is_none() {
                return Ignore(IgnoreReason::NoNodeYet);
            }
        }
    }
    match plan(cfg, claim, class, &spec) {
        Ok(p) => ClaimDecision::Provision(Box::new(p)),
        Err(r) => Refuse(r),
    }
}

fn plan(
    cfg: &ProvisionerConfig,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    spec: &k8s_openapi::api::core::v1::PersistentVolumeClaimSpec,
) -> Result<ProvisionPlan, Refusal> {
    use RefusalReason as R;
    if spec.volume_mode.as_deref() == Some("Block") {
        return Err(Refusal::new(
            R::BlockMode,
            "volumeMode Block is not supported: hostPath volumes are directories; use volumeMode Filesystem",
        ));
    }
    if let Some(DataSource::Contents(kind)) = data_source(spec) {
        return Err(Refusal::new(
            R::DataSource,
            format!(
                "the claim asks for the contents of a {kind}; hostPath directories cannot be cloned or \
                 restored by this provisioner, and an empty volume would look like lost data. \
                 Use the CSI driver's StorageClass for clones and snapshots"
            ),
        ));
    }
    if spec.selector.is_some() {
        return Err(Refusal::new(
            R::Selector,
            "claims with spec.selector cannot be dynamically provisioned",
        ));
    }
    let access_modes = spec.access_modes.clone().unwrap_or_default();
    if access_modes.is_empty() {
        return Err(Refusal::new(R::AccessMode, "the claim has no access modes"));
    }
    if cfg.mode.is_node_local() && access_modes.iter().any(|m| m == "ReadWriteMany") {
        return Err(Refusal::new(
            R::AccessMode,
            "ReadWriteMany needs a shared filesystem; this provisioner creates node-local directories",
        ));
    }
    let quantity = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .map(|q| q.0.clone())
        .ok_or_else(|| Refusal::new(R::BadRequest, "the claim requests no storage"))?;
    let request_bytes = parse_bytes(&quantity)
        .ok_or_else(|| Refusal::new(R::BadRequest, format!("cannot read storage request {quantity:?}")))?;
    let params =
        ClassParams::parse(class.parameters.as_ref()).map_err(|e| Refusal::new(R::BadParameters, e.to_string()))?;
    if cfg.mode.is_node_local() && params.pv_dir.is_some() {
        return Err(Refusal::new(
            R::BadParameters,
            "StorageClass parameter pvDir is only used in shared mode; node-local volumes go under PV_DIR",
        ));
    }
    let base_dir = match cfg.mode {
        Mode::Shared => params.pv_dir.clone().or_else(|| cfg.pv_dir.clone()),
        _ => cfg.pv_dir.clone(),
    }
    .ok_or_else(|| Refusal::new(R::NoBaseDir, "the StorageClass has no pvDir parameter"))?;
    let pv_name = pv_name_for(claim).ok_or_else(|| Refusal::new(R::BadRequest, "the claim has no uid"))?;
    let template = params
        .path_template
        .clone()
        .unwrap_or_else(|| cfg.mode.default_template(cfg.use_naming_prefix).to_owned());
    let meta = &claim.metadata;
    let input = TemplateInput {
        namespace: meta.namespace.as_deref().unwrap_or(""),
        claim: meta.name.as_deref().unwrap_or(""),
        pv: &pv_name,
        labels: meta.labels.as_ref(),
        annotations: meta.annotations.as_ref(),
    };
    let rel_dir = template::render(&template, &input).map_err(|e| Refusal::new(R::BadTemplate, e.to_string()))?;
    let reclaim_policy = cfg
        .reclaim_override
        .map(|o| o.as_str().to_owned())
        .or_else(|| class.reclaim_policy.clone())
        .unwrap_or_else(|| "Delete".to_owned());
    Ok(ProvisionPlan {
        pv_name,
        base_dir,
        rel_dir,
        request_bytes,
        request_quantity: quantity,
        access_modes,
        reclaim_policy,
        storage_class: class.metadata.name.clone().unwrap_or_default(),
        dir_mode: params.dir_mode.unwrap_or_else(|| cfg.mode.default_dir_mode()),
        uid: params.uid,
        gid: params.gid,
        archive_on_delete: params.archive_on_delete,
        cephfs_quota: params.cephfs_quota,
        node: if cfg.mode.is_node_local() {
            cfg.node_name.clone()
        } else {
            None
        },
        params,
        ignored_mount_options: class.mount_options.clone().unwrap_or_default(),
    })
}

/// API group of VolumeSnapshots, the one non-core data source Kubernetes itself knows.
const SNAPSHOT_GROUP: &str = "snapshot.storage.k8s.io";

/// What a claim's data source asks for.
#[derive(Debug, PartialEq, Eq)]
enum DataSource {
    /// A volume populator (any kind outside the core group and the snapshot group), which fills
    /// the volume through a claim of its own.
    Populator,
    /// The contents of an object of this kind: a clone or a snapshot restore.
    Contents(String),
}

/// The claim's data source, from `dataSource` or `dataSourceRef` (a populator in either wins).
fn data_source(spec: &k8s_openapi::api::core::v1::PersistentVolumeClaimSpec) -> Option<DataSource> {
    let sources = [
        spec.data_source.as_ref().map(|s| (s.api_group.as_deref(), &s.kind)),
        spec.data_source_ref.as_ref().map(|r| (r.api_group.as_deref(), &r.kind)),
    ];
    let sources: Vec<_> = sources.into_iter().flatten().collect();
    let populator = |group: Option<&str>| group.is_some_and(|g| !g.is_empty() && g != SNAPSHOT_GROUP);
    if sources.iter().any(|(group, _)| populator(*group)) {
        return Some(DataSource::Populator);
    }
    sources.first().map(|(_, kind)| DataSource::Contents((*kind).clone()))
}

/// Refuses a request larger than the filesystem holding the base directory.
pub fn check_capacity(request_bytes: u64, fs_total_bytes: u64) -> Result<(), Refusal> {
    if request_bytes > fs_total_bytes {
        return Err(Refusal::new(
            RefusalReason::TooLarge,
            format!("requested {request_bytes} bytes but the filesystem holds only {fs_total_bytes} bytes"),
        ));
    }
    Ok(())
}

/// What to do with a PV.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VolumeDecision {
    /// Nothing: not released, not ours, another node's, or kept by policy.
    Ignore(&'static str),
    /// Remove (or archive) the directory, then delete the PV.
    Delete {
        /// The volume directory.
        dir: PathBuf,
        /// The base directory it must stay under.
        base_dir: PathBuf,
        /// Rename to `archived-…` instead of removing.
        archive: bool,
    },
    /// Ours and released, but unsafe or inconsistent: report, touch nothing.
    Refuse(String),
}

/// Decides the fate of a PV. `class_params` are the parameters of its StorageClass if it still
/// exists (shared-mode PVs from the original provisioner record no base directory).
pub fn decide_volume(
    cfg: &ProvisionerConfig,
    pv: &PersistentVolume,
    class_params: Option<&ClassParams>,
) -> VolumeDecision {
    use VolumeDecision::{Ignore, Refuse};
    let ann = pv.metadata.annotations.clone().unwrap_or_default();
    if ann.get(ANNOTATION_PROVISIONED_BY) != Some(&cfg.provisioner_name) {
        return Ignore("provisioned by someone else");
    }
    let phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
    if phase != Some("Released") || pv.metadata.deletion_timestamp.is_some() {
        return Ignore("not released");
    }
    let spec = pv.spec.clone().unwrap_or_default();
    if spec.persistent_volume_reclaim_policy.as_deref() != Some("Delete") {
        return Ignore("reclaim policy keeps the directory");
    }
    let Some(identity) = ann
        .get(ANNOTATION_PROVISIONER_IDENTITY)
        .or_else(|| ann.get(ANNOTATION_TORCHBOX_IDENTITY))
    else {
        return Refuse(format!("PV has no {ANNOTATION_PROVISIONER_IDENTITY} annotation"));
    };
    if !cfg.owns_identity(identity) {
        return Ignore("provisioned by another instance");
    }
    if cfg.mode.is_node_local() {
        let on = ann.get(ANNOTATION_PROVISION_ON_NODE);
        match (cfg.mode, on, cfg.node_name.as_ref()) {
            (Mode::Kubevirt, on, node) if on != node => return Ignore("provisioned on another node"),
            (_, Some(on), Some(node)) if on != node => return Ignore("provisioned on another node"),
            _ => {}
        }
    }
    let Some(dir) = spec.host_path.as_ref().map(|h| PathBuf::from(&h.path)) else {
        return Refuse("PV has no hostPath source".into());
    };
    // The directories this instance provisions under: PV_DIR, and in shared mode the class's
    // pvDir. The PV's own record must name one of them, so that whoever can edit a PV cannot
    // widen what this privileged process deletes.
    let known: Vec<PathBuf> = match cfg.mode {
        Mode::Shared => class_params
            .and_then(|p| p.pv_dir.clone())
            .into_iter()
            .chain(cfg.pv_dir.clone())
            .collect(),
        _ => cfg.pv_dir.clone().into_iter().collect(),
    };
    let base_dir = match ann.get(ANNOTATION_BASE_DIR).map(PathBuf::from) {
        Some(recorded) if known.is_empty() || known.contains(&recorded) => Some(recorded),
        Some(recorded) => {
            let known: Vec<_> = known.iter().map(|k| k.display().to_string()).collect();
            return Refuse(format!(
                "the PV records base directory {} ({ANNOTATION_BASE_DIR}), which is not one this \
                 provisioner uses ({}); the directory is left alone",
                recorded.display(),
                known.join(", ")
            ));
        }
        None => known.into_iter().next(),
    };
    let Some(base_dir) = base_dir else {
        return Refuse("cannot tell the base directory of this PV (StorageClass gone?)".into());
    };
    if !is_strictly_inside(&dir, &base_dir) {
        return Refuse(format!("{} is not inside {}", dir.display(), base_dir.display()));
    }
    let archive = ann.get(ANNOTATION_ARCHIVE_ON_DELETE).map(String::as_str) == Some("true");
    VolumeDecision::Delete { dir, base_dir, archive }
}

/// Lexical check that `dir` is below `base` with only normal components in between.
pub fn is_strictly_inside(dir: &Path, base: &Path) -> bool {
    if !base.is_absolute()
        || base
            .components()
            .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
    {
        return false;
    }
    match dir.strip_prefix(base) {
        Ok(rest) => rest.components().next().is_some() && rest.components().all(|c| matches!(c, Component::Normal(_))),
        Err(_) => false,
    }
}

#[cfg(test)]
#[path = "decision_tests.rs"]
mod tests;
