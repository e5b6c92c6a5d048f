//! The I/O half: reads the objects a decision needs, acts on the filesystem and the API, and
//! reports every refusal as an Event on the claim (or the PV).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use hpp_reconcile::events::EventRecorder;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource};
use tracing::{Instrument, debug, info, info_span, warn};

use crate::config::{Mode, ProvisionerConfig};
use crate::decision::{
    self, ClaimDecision, IgnoreReason, ProvisionPlan, Refusal, RefusalReason, VolumeDecision, check_capacity,
};
use crate::fsops::{self, DirSpec, Removed};
use crate::metrics::{DeleteLabels, ErrorLabels, Metrics, ModeLabels, OperationLabels, ReasonLabels};
use crate::mount_guard::{self, GuardSpec, MOUNTINFO_PATH};
use crate::params::ClassParams;
use crate::pv::{HOSTNAME_LABEL, build_pv};
use crate::selinux::Labeler;
use crate::{Error, Result};

/// Legacy beta annotation naming the claim's class (still honoured by the PV controller).
const ANNOTATION_BETA_STORAGE_CLASS: &str = "volume.beta.kubernetes.io/storage-class";

/// The StorageClass of a claim as Kubernetes reads it (`GetPersistentVolumeClaimClass`): the
/// beta annotation wins over `spec.storageClassName`, so the PV gets the class the binder
/// matches it against.
pub fn claim_class(claim: &PersistentVolumeClaim) -> Option<String> {
    claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_BETA_STORAGE_CLASS).cloned())
        .or_else(|| claim.spec.as_ref().and_then(|s| s.storage_class_name.clone()))
}

/// Event reason of every claim that cannot be provisioned, as the provisioner library (and so
/// KubeVirt's provisioner) records it.
pub const PROVISIONING_FAILED: &str = "ProvisioningFailed";

/// Event reason of a released volume that is not deleted, as the provisioner library records it.
pub const VOLUME_FAILED_DELETE: &str = "VolumeFailedDelete";

/// What happened to a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// Not this instance's business.
    Ignored(IgnoreReason),
    /// Refused; an Event says why.
    Refused(RefusalReason),
    /// A PV was created.
    Provisioned(String),
    /// The PV already existed (an earlier attempt, or another instance won the race).
    AlreadyExists(String),
}

/// What happened to a PV.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VolumeOutcome {
    /// Nothing to do.
    Ignored(&'static str),
    /// The directory was handled and the PV deleted.
    Deleted(Removed),
    /// Left alone; an Event on the PV says why.
    Refused(String),
}

/// One provisioner instance: configuration plus the handles its I/O needs.
pub struct Provisioner {
    client: Client,
    cfg: ProvisionerConfig,
    recorder: EventRecorder,
    metrics: Arc<Metrics>,
    labeler: Labeler,
    mountinfo: PathBuf,
    /// StorageClasses from a watch, so deciding about a claim costs no API call; a miss
    /// falls back to a GET (the cache may not have caught up yet).
    classes: std::sync::RwLock<Option<Store<StorageClass>>>,
}

impl std::fmt::Debug for Provisioner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provisioner")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::fs("blocking task", "", std::io::Error::other(e.to_string())))
}

fn is_status(err: &kube::Error, code: u16) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == code)
}

impl Provisioner {
    /// Builds an instance; `instance` names it in Events (pod name or node name).
    pub fn new(client: Client, cfg: ProvisionerConfig, metrics: Arc<Metrics>, instance: Option<String>) -> Self {
        let reporter = Reporter {
            controller: "hpp-provisioner".into(),
            instance,
        };
        Provisioner {
            recorder: EventRecorder::new(client.clone(), reporter),
            client,
            cfg,
            metrics,
            labeler: Labeler::default(),
            mountinfo: PathBuf::from(MOUNTINFO_PATH),
            classes: std::sync::RwLock::new(None),
        }
    }

    /// Uses another SELinux enforce flag file (tests).
    pub fn with_labeler(mut self, labeler: Labeler) -> Self {
        self.labeler = labeler;
        self
    }

    /// Reads mounts from another file (tests).
    pub fn with_mountinfo(mut self, path: impl Into<PathBuf>) -> Self {
        self.mountinfo = path.into();
        self
    }

    /// The configuration.
    pub fn config(&self) -> &ProvisionerConfig {
        &self.cfg
    }

    /// The Kubernetes client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Serves StorageClass lookups from `store` (kept current by a reflector) from now on.
    pub fn set_class_cache(&self, store: Option<Store<StorageClass>>) {
        match self.classes.write() {
            Ok(mut guard) => *guard = store,
            Err(poisoned) => *poisoned.into_inner() = store,
        }
    }

    fn cached_class(&self, name: Option<&str>) -> Option<StorageClass> {
        let name = name.filter(|n| !n.is_empty())?;
        let store = self.classes.read().ok().and_then(|g| g.clone())?;
        store.get(&ObjectRef::new(name)).map(|c| c.as_ref().clone())
    }

    async fn storage_class(&self, name: Option<&str>) -> Result<Option<StorageClass>> {
        let Some(name) = name.filter(|n| !n.is_empty()) else {
            return Ok(None);
        };
        Ok(Api::<StorageClass>::all(self.client.clone()).get_opt(name).await?)
    }

    /// Decides from the cached class when possible. Only a claim this instance would act on
    /// (provision or refuse) costs a GET, so the decision never rests on a stale cache entry
    /// (a class deleted and re-created with other parameters).
    async fn decide(&self, claim: &PersistentVolumeClaim, class_name: Option<&str>) -> Result<ClaimDecision> {
        if let Some(cached) = self.cached_class(class_name) {
            let decision = decision::decide_claim(&self.cfg, claim, Some(&cached));
            if matches!(decision, ClaimDecision::Ignore(_)) {
                return Ok(decision);
            }
        }
        let class = self.storage_class(class_name).await?;
        Ok(decision::decide_claim(&self.cfg, claim, class.as_ref()))
    }

    async fn event(
        &self,
        warning: bool,
        reason: &str,
        note: String,
        action: &str,
        reference: k8s_openapi::api::core::v1::ObjectReference,
    ) {
        let ev = Event {
            type_: if warning { EventType::Warning } else { EventType::Normal },
            reason: reason.to_owned(),
            note: Some(note.chars().take(1000).collect()),
            action: action.to_owned(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &reference).await {
            warn!(error = %e, reason, "cannot publish event");
        }
    }

    /// Handles one claim: decides, and provisions or refuses.
    pub async fn reconcile_claim(&self, claim: &PersistentVolumeClaim) -> Result<ClaimOutcome> {
        let span = info_span!(
            "reconcile_claim",
            namespace = claim.metadata.namespace.as_deref().unwrap_or(""),
            claim = claim.metadata.name.as_deref().unwrap_or(""),
            mode = self.cfg.mode.as_str()
        );
        let start = Instant::now();
        let result = self.reconcile_claim_inner(claim).instrument(span).await;
        match &result {
            Ok(ClaimOutcome::Provisioned(_)) => {
                self.metrics
                    .duration_seconds
                    .get_or_create(&OperationLabels { operation: "provision" })
                    .observe(start.elapsed().as_secs_f64());
            }
            Err(e) => {
                self.metrics
                    .errors
                    .get_or_create(&ErrorLabels {
                        operation: "provision",
                        category: e.category(),
                    })
                    .inc();
                // An API server that is down or unreachable is not the user's business; its
                // refusal (RBAC, validation) is, as is anything else. A conflict means another
                // instance won, which is no failure.
                let tell = match e {
                    Error::Kube(kube::Error::Api(status)) => (400..500).contains(&status.code) && status.code != 409,
                    Error::Kube(_) => false,
                    _ => true,
                };
                if tell {
                    let note = format!("{}: will retry: {e}", self.cfg.provisioner_name);
                    self.event(true, PROVISIONING_FAILED, note, "Provision", claim.object_ref(&()))
                        .await;
                }
            }
            Ok(_) => {}
        }
        result
    }

    async fn reconcile_claim_inner(&self, claim: &PersistentVolumeClaim) -> Result<ClaimOutcome> {
        let class_name = claim_class(claim);
        let plan = match self.decide(claim, class_name.as_deref()).await? {
            ClaimDecision::Ignore(reason) => {
                debug!(?reason, "ignoring claim");
                return Ok(ClaimOutcome::Ignored(reason));
            }
            ClaimDecision::Refuse(refusal) => return Ok(self.refuse(claim, refusal).await),
            ClaimDecision::Provision(plan) => *plan,
        };
        let pvs = Api::<PersistentVolume>::all(self.client.clone());
        if pvs.get_opt(&plan.pv_name).await?.is_some() {
            return Ok(ClaimOutcome::AlreadyExists(plan.pv_name));
        }
        if let Err(refusal) = self.check_filesystem(&plan).await? {
            return Ok(self.refuse(claim, refusal).await);
        }
        let (ns, name) = (
            claim.metadata.namespace.as_deref().unwrap_or_default(),
            claim.metadata.name.as_deref().unwrap_or_default(),
        );
        self.event(
            false,
            "Provisioning",
            format!("External provisioner is provisioning volume for claim \"{ns}/{name}\""),
            "Provision",
            claim.object_ref(&()),
        )
        .await;
        let hostname = match &plan.node {
            Some(node) => match self.hostname_of(node).await? {
                Ok(h) => Some(h),
                Err(refusal) => return Ok(self.refuse(claim, refusal).await),
            },
            None => None,
        };
        let (base, rel) = (plan.base_dir.clone(), plan.rel_dir.clone());
        let spec = DirSpec {
            mode: plan.dir_mode,
            uid: plan.uid,
            gid: plan.gid,
            ceph_quota_bytes: plan.cephfs_quota.then_some(plan.request_bytes),
        };
        let labeler = self.labeler.clone();
        let quota = self.cfg.quota_for(&base);
        let limit = plan.request_bytes;
        let created = blocking(move || match quota {
            Some(q) => fsops::create_volume_dir_in(&base, &rel, spec, &labeler, &*q, limit),
            None => fsops::create_volume_dir(&base, &rel, spec, &labeler),
        })
        .await??;
        let pv = build_pv(&self.cfg, &plan, claim, hostname.as_deref());
        match pvs.create(&PostParams::default(), &pv).await {
            Ok(_) => {}
            Err(e) if is_status(&e, 409) => {
                info!(pv = %plan.pv_name, "PV created concurrently by another instance");
                return Ok(ClaimOutcome::AlreadyExists(plan.pv_name));
            }
            Err(e) => {
                // Only a definite rejection proves the PV was not stored. After a timeout, a 5xx
                // or a dropped connection it may well have been, and removing the directory would
                // leave a PV whose hostPath (type Directory) no pod can ever mount; the retry
                // then finds the directory (creating it is idempotent) or the PV.
                let rejected = [400, 403, 422].iter().any(|code| is_status(&e, *code));
                if created.newly_created && rejected {
                    let (base, rel) = (plan.base_dir.clone(), plan.rel_dir.clone());
                    if let Err(undo) = blocking(move || fsops::remove_if_empty(&base, &rel)).await? {
                        warn!(error = %undo, "cannot undo directory creation");
                    }
                }
                return Err(e.into());
            }
        }
        info!(pv = %plan.pv_name, dir = %plan.dir().display(), selinux = ?created.selinux_context, "provisioned");
        self.metrics
            .provisioned
            .get_or_create(&ModeLabels {
                mode: self.cfg.mode.as_str(),
            })
            .inc();
        self.event(
            false,
            "ProvisioningSucceeded",
            format!("provisioned volume {} at {}", plan.pv_name, plan.dir().display()),
            "Provision",
            claim.object_ref(&()),
        )
        .await;
        if !plan.ignored_mount_options.is_empty() {
            let class = plan.storage_class.as_str();
            let options = plan.ignored_mount_options.join(",");
            let note = format!(
                "StorageClass {class} has mountOptions {options}, which hostPath volumes cannot apply; \
                 the PV was created without them"
            );
            warn!(%class, %options, "mount options ignored");
            self.event(true, "MountOptionsIgnored", note, "Provision", claim.object_ref(&()))
                .await;
        }
        Ok(ClaimOutcome::Provisioned(plan.pv_name))
    }

    async fn refuse(&self, claim: &PersistentVolumeClaim, refusal: Refusal) -> ClaimOutcome {
        warn!(reason = refusal.reason.as_str(), message = %refusal.message, "refusing claim");
        self.metrics
            .refused
            .get_or_create(&ReasonLabels {
                reason: refusal.reason.as_str(),
            })
            .inc();
        // The reason every provisioner uses, so `kubectl get events --field-selector
        // reason=ProvisioningFailed` and alerts on it find ours too; the specific reason leads
        // the note and labels the metric.
        self.event(
            true,
            PROVISIONING_FAILED,
            format!(
                "{}: {}: {}",
                refusal.reason.as_str(),
                self.cfg.provisioner_name,
                refusal.message
            ),
            "Provision",
            claim.object_ref(&()),
        )
        .await;
        ClaimOutcome::Refused(refusal.reason)
    }

    /// Mount guard and size check; the outer error is an I/O failure, the inner a refusal.
    async fn check_filesystem(&self, plan: &ProvisionPlan) -> Result<Result<(), Refusal>> {
        let guard = GuardSpec::from_params(&plan.params, self.cfg.mode == Mode::Shared);
        let base = plan.base_dir.clone();
        let mountinfo = self.mountinfo.clone();
        let request = plan.request_bytes;
        blocking(move || {
            if let Err(r) = mount_guard::check_live(&guard, &base, &mountinfo) {
                return Ok(Err(r));
            }
            if !base.is_dir() {
                return Ok(Err(Refusal::new(
                    RefusalReason::NoBaseDir,
                    format!("base directory {} does not exist", base.display()),
                )));
            }
            let total = fsops::filesystem_size(&base)?;
            Ok(check_capacity(request, total))
        })
        .await?
    }

    async fn hostname_of(&self, node: &str) -> Result<Result<String, Refusal>> {
        let found = Api::<Node>::all(self.client.clone()).get_opt(node).await?;
        let Some(found) = found else {
            return Ok(Err(Refusal::new(
                RefusalReason::NodeUnknown,
                format!("node {node} not found"),
            )));
        };
        Ok(found
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(HOSTNAME_LABEL))
            .cloned()
            .ok_or_else(|| {
                Refusal::new(
                    RefusalReason::NodeUnknown,
                    format!("node {node} has no {HOSTNAME_LABEL} label"),
                )
            }))
    }

    /// Handles one PV: on a released volume this instance owns, removes or archives the
    /// directory, then deletes the PV.
    pub async fn reconcile_volume(&self, pv: &PersistentVolume) -> Result<VolumeOutcome> {
        let span = info_span!(
            "reconcile_volume",
            pv = pv.metadata.name.as_deref().unwrap_or(""),
            mode = self.cfg.mode.as_str()
        );
        let start = Instant::now();
        let result = self.reconcile_volume_inner(pv).instrument(span).await;
        match &result {
            Ok(VolumeOutcome::Deleted(_)) => {
                self.metrics
                    .duration_seconds
                    .get_or_create(&OperationLabels { operation: "delete" })
                    .observe(start.elapsed().as_secs_f64());
            }
            Err(e) => {
                self.metrics
                    .errors
                    .get_or_create(&ErrorLabels {
                        operation: "delete",
                        category: e.category(),
                    })
                    .inc();
            }
            Ok(_) => {}
        }
        result
    }

    async fn reconcile_volume_inner(&self, pv: &PersistentVolume) -> Result<VolumeOutcome> {
        // Cheap filter first: most PVs in a cluster are not ours and must cost no API call.
        let quick = decision::decide_volume(&self.cfg, pv, None);
        if let VolumeDecision::Ignore(why) = quick {
            return Ok(VolumeOutcome::Ignored(why));
        }
        // The class gives the shared base directory and, in every mode, the mount guard.
        let name = pv.spec.as_ref().and_then(|s| s.storage_class_name.clone());
        let class_params = self
            .storage_class(name.as_deref())
            .await?
            .and_then(|c| ClassParams::parse(c.parameters.as_ref()).ok());
        let (dir, base, archive) = match decision::decide_volume(&self.cfg, pv, class_params.as_ref()) {
            VolumeDecision::Ignore(why) => return Ok(VolumeOutcome::Ignored(why)),
            VolumeDecision::Refuse(why) => return Ok(self.refuse_delete(pv, why).await),
            VolumeDecision::Delete { dir, base_dir, archive } => (dir, base_dir, archive),
        };
        // In every mode where a guard is configured (always in shared mode): a node-local disk
        // or shared filesystem that is not mounted would make the directory look already gone,
        // and deleting the PV would orphan the data. Keep the PV, warn, retry later.
        let guard = GuardSpec::from_params(&class_params.unwrap_or_default(), self.cfg.mode == Mode::Shared);
        if guard.is_active() {
            let (b, m) = (base.clone(), self.mountinfo.clone());
            if let Err(r) = blocking(move || mount_guard::check_live(&guard, &b, &m)).await? {
                return Ok(self.refuse_delete(pv, r.message).await);
            }
        }
        let quota = self.cfg.quota_for(&base);
        let trash = self.cfg.trash.is_some() && !archive;
        let removed = match blocking(move || match quota {
            _ if trash => fsops::trash_volume_dir(&base, &dir, std::time::SystemTime::now()),
            Some(q) if !archive => fsops::remove_volume_dir_in(&base, &dir, archive, &*q),
            _ => fsops::remove_volume_dir(&base, &dir, archive),
        })
        .await?
        {
            Ok(r) => r,
            Err(e @ Error::UnsafeDelete { .. }) => return Ok(self.refuse_delete(pv, e.to_string()).await),
            Err(e) => return Err(e),
        };
        let name = pv.metadata.name.clone().unwrap_or_default();
        let params = DeleteParams {
            preconditions: pv.metadata.uid.clone().map(|uid| kube::api::Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..Default::default()
        };
        match Api::<PersistentVolume>::all(self.client.clone())
            .delete(&name, &params)
            .await
        {
            Ok(_) => {}
            Err(e) if is_status(&e, 404) => {}
            Err(e) => return Err(e.into()),
        }
        let action = match &removed {
            Removed::Deleted => "deleted",
            Removed::Archived(_) => "archived",
            Removed::Trashed(_) => "trashed",
            Removed::Missing => "missing",
        };
        info!(pv = %name, action, "released volume cleaned up");
        self.metrics.deleted.get_or_create(&DeleteLabels { action }).inc();
        Ok(VolumeOutcome::Deleted(removed))
    }

    /// Base directories whose trash this instance purges: the node-local `pv_dir`, and in
    /// shared mode the `pvDir` of every StorageClass of this provisioner in the class cache.
    fn trash_bases(&self) -> Vec<PathBuf> {
        let mut bases: Vec<PathBuf> = self.cfg.pv_dir.iter().cloned().collect();
        if self.cfg.mode == Mode::Shared
            && let Some(store) = self.classes.read().ok().and_then(|g| g.clone())
        {
            for class in store.state() {
                if class.provisioner != self.cfg.provisioner_name {
                    continue;
                }
                if let Some(dir) = class
                    .parameters
                    .as_ref()
                    .and_then(|p| p.get(crate::params::PARAM_PV_DIR))
                    .map(PathBuf::from)
                    .filter(|d| d.is_absolute() && !bases.contains(d))
                {
                    bases.push(dir);
                }
            }
        }
        bases
    }

    /// Purges the trash of every base directory this instance keeps volumes in (entries older
    /// than the retention, then the oldest while free space is under the floor); nothing
    /// without a trash retention.
    pub async fn purge_trash(&self) {
        let Some(settings) = self.cfg.trash else {
            return;
        };
        for base in self.trash_bases() {
            let quota = self.cfg.quota_for(&base);
            let b = base.clone();
            let outcome = blocking(move || {
                let backend: &dyn hpp_fs::quota::QuotaBackend = match &quota {
                    Some(q) => &**q,
                    None => &hpp_fs::quota::Unlimited,
                };
                fsops::purge_trash(&b, settings, std::time::SystemTime::now(), backend)
            })
            .await;
            match outcome {
                Ok(Ok(report)) => {
                    for (_, reason) in &report.purged {
                        self.metrics
                            .trash_purged
                            .get_or_create(&ReasonLabels {
                                reason: reason.as_str(),
                            })
                            .inc();
                    }
                }
                Ok(Err(e)) | Err(e) => warn!(base = %base.display(), error = %e, "cannot purge the trash"),
            }
        }
    }

    async fn refuse_delete(&self, pv: &PersistentVolume, why: String) -> VolumeOutcome {
        warn!(reason = %why, "not deleting released volume");
        self.metrics.delete_refused.inc();
        self.event(true, VOLUME_FAILED_DELETE, why.clone(), "Delete", pv.object_ref(&()))
            .await;
        VolumeOutcome::Refused(why)
    }
}
