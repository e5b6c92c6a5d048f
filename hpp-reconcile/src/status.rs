//! Pure status derivation: conditions, versions, pool statuses and the node-loss summary from
//! the previous status and the outcome of a pass, with KubeVirt's states, reasons and messages.

use hpp_api::condition as cond;
use hpp_api::v1beta1::{Condition, HostPathProvisionerStatus, StoragePoolStatus};

use crate::subreconciler::Readiness;

/// The operator's own conditions, in the order they are written; steps add others after them.
const OPERATOR_CONDITIONS: [&str; 3] = [cond::AVAILABLE, cond::PROGRESSING, cond::DEGRADED];

/// How a pass ended, as far as the status is concerned.
#[derive(Debug)]
pub enum Outcome<'a> {
    /// Every sub-reconciler applied; this is what they reported.
    Applied(&'a Readiness),
    /// A step failed with this message.
    Failed(String),
    /// The operator refused to act (downgrade, second CR); the message says why.
    Refused(String),
}

/// The derived state, as in KubeVirt's table (Available / Progressing / Degraded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// F/T/F: first deployment under way.
    Deploying,
    /// T/F/F: everything ready.
    Healthy,
    /// T/T/F: a rollout (new pod template) is under way on a CR that was Available.
    RollingOut,
    /// T/T/T: upgrade under way.
    UpgradeHealingDegraded,
    /// F/F/T: deployed but not working, or refused.
    Failed,
    /// F/T/T: failing, still trying.
    FailedHealing,
}

impl State {
    fn flags(self) -> [bool; 3] {
        match self {
            State::Deploying => [false, true, false],
            State::Healthy => [true, false, false],
            State::RollingOut => [true, true, false],
            State::UpgradeHealingDegraded => [true, true, true],
            State::Failed => [false, false, true],
            State::FailedHealing => [false, true, true],
        }
    }

    /// The condition type that carries reason and message in this state.
    fn carrier(self) -> &'static str {
        match self {
            State::Deploying | State::RollingOut => cond::PROGRESSING,
            State::Healthy => cond::AVAILABLE,
            _ => cond::DEGRADED,
        }
    }

    /// Whether a transition into this state deserves a Warning event.
    pub fn is_warning(self) -> bool {
        matches!(
            self,
            State::UpgradeHealingDegraded | State::Failed | State::FailedHealing
        )
    }
}

/// The new status and what changed.
#[derive(Clone, Debug, PartialEq)]
pub struct Derived {
    /// Status to write.
    pub status: HostPathProvisionerStatus,
    /// Derived state.
    pub state: State,
    /// Reason on the carrying condition (Event reason on a transition).
    pub reason: String,
    /// Message on the carrying condition.
    pub message: String,
    /// Whether conditions differ from the previous ones (ignoring heartbeat times): a transition.
    pub transition: bool,
    /// Whether anything besides heartbeat times differs: a status write is needed.
    pub changed: bool,
}

/// Prefix of the versions hpp writes by default (`hpp-v0.1.0`). KubeVirt's operator compares
/// `status.observedVersion` with its own version as semver and refuses to reconcile ("operator
/// downgraded from X to Y") only when both parse and its own is lower; a version that is not
/// semver (this prefix makes it so) counts there as an upgrade. So KubeVirt's operator takes a CR
/// back from hpp whatever the two version numbers, and hpp, which compares only versions of its
/// own family (see [`is_downgrade`]), takes a CR over from any KubeVirt release.
pub const HPP_VERSION_PREFIX: &str = "hpp-";

/// Whether an operator at version `own` must refuse a CR whose `observedVersion` is `observed`:
/// only when both are of the same family (both hpp's `hpp-v…`, or both plain semver as set with
/// `OPERATOR_VERSION`) and `observed` is newer. A plain version next to an `hpp-` one is the
/// other product's: taking over from it is an upgrade, whatever the numbers.
pub fn is_downgrade(observed: &str, own: &str) -> bool {
    match (
        observed.strip_prefix(HPP_VERSION_PREFIX),
        own.strip_prefix(HPP_VERSION_PREFIX),
    ) {
        (Some(o), Some(n)) => version_newer(o, n),
        (None, None) => version_newer(observed, own),
        _ => false,
    }
}

/// A timestamp as status and conditions write it (RFC 3339, whole seconds, UTC).
pub fn rfc3339(t: k8s_openapi::jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Whether the version string `a` is newer than `b` (semver, leading `v` ignored; unparsable
/// parts compare as 0).
pub fn version_newer(a: &str, b: &str) -> bool {
    fn parts(v: &str) -> Vec<u64> {
        let core = v.trim_start_matches('v').split(['-', '+']).next().unwrap_or_default();
        core.split('.').map(|p| p.parse().unwrap_or(0)).collect()
    }
    let (pa, pb) = (parts(a), parts(b));
    let n = pa.len().max(pb.len());
    let get = |p: &Vec<u64>, i: usize| p.get(i).copied().unwrap_or(0);
    (0..n).map(|i| get(&pa, i).cmp(&get(&pb, i))).find(|o| o.is_ne()) == Some(std::cmp::Ordering::Greater)
}

fn strip_times(conditions: &[Condition]) -> Vec<Condition> {
    conditions
        .iter()
        .map(|c| Condition {
            last_heartbeat_time: None,
            last_transition_time: None,
            ..c.clone()
        })
        .collect()
}

/// Whether two statuses differ at most in their conditions' heartbeat and transition times:
/// [`comparable`] of each, compared without copying the pool statuses (a claim per node).
pub fn same_but_times(a: &HostPathProvisionerStatus, b: &HostPathProvisionerStatus) -> bool {
    same_except(a, b, |p, q| p == q)
}

/// Whether two statuses differ at most in times and in their pools' usage figures
/// (`committed` and `available`): figures that move all the time on a live cluster (each
/// node's csi-provisioner republishes its capacity every minute) and are written at most once
/// per [`Context::usage_interval`](crate::operator::Context::usage_interval) when nothing else changed.
pub fn same_but_usage(a: &HostPathProvisionerStatus, b: &HostPathProvisionerStatus) -> bool {
    same_except(a, b, |p, q| {
        p.len() == q.len() && p.iter().zip(q).all(|(p, q)| pool_same_but_usage(p, q))
    })
}

/// [`same_but_times`] with the pool statuses compared by `pools_same`.
fn same_except(
    a: &HostPathProvisionerStatus,
    b: &HostPathProvisionerStatus,
    pools_same: impl Fn(&[StoragePoolStatus], &[StoragePoolStatus]) -> bool,
) -> bool {
    // Every field by name: a new field fails to compile here until it is compared.
    let HostPathProvisionerStatus {
        conditions,
        observed_version,
        operator_version,
        target_version,
        storage_pool_statuses,
        node_loss,
        volume_audit,
    } = a;
    strip_times(conditions) == strip_times(&b.conditions)
        && *observed_version == b.observed_version
        && *operator_version == b.operator_version
        && *target_version == b.target_version
        && pools_same(storage_pool_statuses, &b.storage_pool_statuses)
        && *node_loss == b.node_loss
        && *volume_audit == b.volume_audit
}

/// Whether two pool statuses differ at most in `committed` and `available`.
fn pool_same_but_usage(a: &StoragePoolStatus, b: &StoragePoolStatus) -> bool {
    // Every field by name, as in `same_except`.
    let StoragePoolStatus {
        name,
        phase,
        current_ready,
        desired_ready,
        claim_statuses,
        message,
        quota,
        committed: _,
        available: _,
        volume_audit,
    } = a;
    *name == b.name
        && *phase == b.phase
        && *current_ready == b.current_ready
        && *desired_ready == b.desired_ready
        && *claim_statuses == b.claim_statuses
        && *message == b.message
        && *quota == b.quota
        && *volume_audit == b.volume_audit
}

/// Status without heartbeat/transition times, for change detection.
pub fn comparable(status: &HostPathProvisionerStatus) -> HostPathProvisionerStatus {
    HostPathProvisionerStatus {
        conditions: strip_times(&status.conditions),
        ..status.clone()
    }
}

/// Derives the next status. `now` is an RFC 3339 timestamp (injected for deterministic tests).
pub fn derive(prev: &HostPathProvisionerStatus, version: &str, outcome: &Outcome<'_>, now: &str) -> Derived {
    let observed = prev.observed_version.clone().filter(|v| !v.is_empty());
    let deploying = observed.is_none();
    let upgrading = observed.as_deref().is_some_and(|o| o != version);
    let was = |ty: &str| prev.conditions.iter().any(|c| c.type_ == ty && c.status == "True");
    let was_available = was(cond::AVAILABLE);
    // A rollout stays under way until its new pods are ready, even once every pod is updated.
    let rollout_pending = was(cond::PROGRESSING)
        && prev
            .conditions
            .iter()
            .any(|c| c.reason.as_deref() == Some(cond::REASON_UPGRADE_STARTED));
    let mut status = HostPathProvisionerStatus {
        operator_version: Some(version.to_owned()),
        target_version: Some(version.to_owned()),
        // Derived below from the outcome and the previous ones.
        conditions: Vec::new(),
        observed_version: prev.observed_version.clone(),
        // A pass's pools replace the last ones: not copied first (a claim per node).
        storage_pool_statuses: match outcome {
            Outcome::Applied(r) => r.pool_statuses.clone(),
            _ => prev.storage_pool_statuses.clone(),
        },
        node_loss: prev.node_loss.clone(),
        volume_audit: prev.volume_audit.clone(),
    };
    let (state, reason, message) = match outcome {
        Outcome::Applied(r) => {
            // `None`: the step had nothing to say; the stored summary stays.
            if let Some(node_loss) = &r.node_loss {
                status.node_loss = (!node_loss.is_empty()).then(|| node_loss.clone());
            }
            // The audit reports on every pass while it is on; absent, it is off.
            status.volume_audit = r.volume_audit.as_ref().map(|a| a.status.clone());
            if let Some(audit) = &r.volume_audit {
                for pool in &mut status.storage_pool_statuses {
                    pool.volume_audit = audit.pools.get(&pool.name).cloned();
                }
            }
            let rolling_out = !r.workloads_rolling_out.is_empty();
            if rolling_out || !r.workloads_not_ready.is_empty() {
                let detail = r
                    .workloads_rolling_out
                    .iter()
                    .chain(&r.workloads_not_ready)
                    .next()
                    .cloned()
                    .unwrap_or_default();
                if deploying {
                    (
                        State::Deploying,
                        cond::REASON_DEPLOY_STARTED,
                        "Started Deployment".to_owned(),
                    )
                } else if upgrading {
                    (
                        State::UpgradeHealingDegraded,
                        cond::REASON_UPGRADE_STARTED,
                        format!("Started upgrade to version {version}"),
                    )
                } else if (rolling_out || rollout_pending) && was_available {
                    (
                        State::RollingOut,
                        cond::REASON_UPGRADE_STARTED,
                        format!("Rolling out: {detail}"),
                    )
                } else if rolling_out || rollout_pending {
                    (
                        State::FailedHealing,
                        cond::REASON_UPGRADE_STARTED,
                        format!("Rolling out: {detail}"),
                    )
                } else {
                    (
                        State::Failed,
                        cond::REASON_DEGRADED,
                        format!("CR is deployed but DaemonSets are not ready: {detail}"),
                    )
                }
            } else if let Some(first) = r.pools_not_ready.first() {
                (State::FailedHealing, cond::REASON_STORAGE_POOL_NOT_READY, first.clone())
            } else {
                status.observed_version = Some(version.to_owned());
                (
                    State::Healthy,
                    cond::REASON_COMPLETE,
                    "Application Available".to_owned(),
                )
            }
        }
        Outcome::Failed(msg) => (
            State::FailedHealing,
            cond::REASON_RECONCILE_FAILED,
            format!("Unable to successfully reconcile: {msg}"),
        ),
        Outcome::Refused(msg) => (State::Failed, cond::REASON_RECONCILE_FAILED, msg.clone()),
    };
    let flags = state.flags();
    let condition = |ty: &str, on: bool, reason: Option<String>, message: Option<String>| {
        condition(&prev.conditions, ty, on, reason, message, now)
    };
    let mut conditions: Vec<Condition> = OPERATOR_CONDITIONS
        .iter()
        .zip(flags)
        .map(|(ty, on)| {
            let carries = *ty == state.carrier();
            condition(
                ty,
                on,
                carries.then(|| reason.to_owned()),
                carries.then(|| message.clone()),
            )
        })
        .collect();
    // Conditions of plugged-in steps: as reported by this pass, or kept from the last status
    // when the pass did not get as far as asking the steps.
    match outcome {
        Outcome::Applied(r) => conditions.extend(
            r.conditions
                .iter()
                .filter(|c| !OPERATOR_CONDITIONS.contains(&c.type_.as_str()))
                .map(|c| condition(&c.type_, c.status, Some(c.reason.clone()), Some(c.message.clone()))),
        ),
        _ => conditions.extend(
            prev.conditions
                .iter()
                .filter(|c| !OPERATOR_CONDITIONS.contains(&c.type_.as_str()))
                .cloned(),
        ),
    }
    status.conditions = conditions;
    let transition = strip_times(&status.conditions) != strip_times(&prev.conditions);
    let changed = !same_but_times(&status, prev);
    Derived {
        status,
        state,
        reason: reason.to_owned(),
        message,
        transition,
        changed,
    }
}

/// A condition as written at `now`: its transition time is kept from `prev` while its status
/// stays the same.
fn condition(
    prev: &[Condition],
    ty: &str,
    on: bool,
    reason: Option<String>,
    message: Option<String>,
    now: &str,
) -> Condition {
    let value = if on { "True" } else { "False" };
    let transition_time = match prev.iter().find(|c| c.type_ == ty) {
        Some(o) if o.status == value => o.last_transition_time.clone().or_else(|| Some(now.to_owned())),
        _ => Some(now.to_owned()),
    };
    Condition {
        type_: ty.to_owned(),
        status: value.to_owned(),
        reason,
        message,
        last_heartbeat_time: Some(now.to_owned()),
        last_transition_time: transition_time,
    }
}

/// Condition type: whether the HostPathProvisioner CRD has the status subresource. Written only
/// once the operator found it missing (KubeVirt's CRD): `False` while status goes through the
/// whole object, `True` after the CRD gained it.
pub const CONDITION_STATUS_SUBRESOURCE: &str = "StatusSubresource";
/// Reason: the CRD has no status subresource; status is written with the whole object.
pub const REASON_CRD_WITHOUT_STATUS_SUBRESOURCE: &str = "CRDWithoutStatusSubresource";
/// Reason: the CRD has the status subresource again; status is written through `/status`.
pub const REASON_STATUS_SUBRESOURCE_PRESENT: &str = "StatusSubresourcePresent";

/// What the `StatusSubresource` condition says while status is written through the whole
/// object.
pub const MESSAGE_WITHOUT_STATUS_SUBRESOURCE: &str = "The HostPathProvisioner CRD has no status subresource \
     (KubeVirt's CRD, as its deploy/operator.yaml ships it): PATCH .../status answered 404 NotFound, so \
     the operator writes status with the whole object, as KubeVirt's operator does. Fields hpp's CRD \
     adds are pruned by this CRD until hpp's is applied: kubectl apply -f \
     deploy/crds/hostpathprovisioner.kubevirt.io_hostpathprovisioners.yaml";
/// What the `StatusSubresource` condition says once the CRD has the subresource again.
pub const MESSAGE_STATUS_SUBRESOURCE_PRESENT: &str =
    "The HostPathProvisioner CRD has the status subresource: status is written through /status";

/// Adds the `StatusSubresource` condition to a derived status: `False` while the status is
/// written through the whole object (`via_main`), `True` once it goes through `/status` again
/// after the previous status said `False` (or `True`); absent on a CRD that always had the
/// subresource. `transition` says whether any other condition changed: the switch has its own
/// Event.
pub fn with_status_path(mut d: Derived, prev: &HostPathProvisionerStatus, via_main: bool, now: &str) -> Derived {
    let had = prev.conditions.iter().any(|c| c.type_ == CONDITION_STATUS_SUBRESOURCE);
    d.status.conditions.retain(|c| c.type_ != CONDITION_STATUS_SUBRESOURCE);
    let (on, reason, message) = if via_main {
        (
            false,
            REASON_CRD_WITHOUT_STATUS_SUBRESOURCE,
            MESSAGE_WITHOUT_STATUS_SUBRESOURCE,
        )
    } else if had {
        (
            true,
            REASON_STATUS_SUBRESOURCE_PRESENT,
            MESSAGE_STATUS_SUBRESOURCE_PRESENT,
        )
    } else {
        return d;
    };
    d.status.conditions.push(condition(
        &prev.conditions,
        CONDITION_STATUS_SUBRESOURCE,
        on,
        Some(reason.to_owned()),
        Some(message.to_owned()),
        now,
    ));
    d.changed = !same_but_times(&d.status, prev);
    // A transition is a change of the other conditions; this one's switch has its own Event.
    let others = |c: &[Condition]| {
        strip_times(c)
            .into_iter()
            .filter(|c| c.type_ != CONDITION_STATUS_SUBRESOURCE)
            .collect::<Vec<_>>()
    };
    d.transition = others(&d.status.conditions) != others(&prev.conditions);
    d
}

/// Value of `kubevirt_hpp_cr_ready` for a status: 1 when Available and neither Progressing nor
/// Degraded, 0 otherwise (so a deploy or rollout that never finishes fires HPPNotReady).
pub fn cr_ready_value(status: &HostPathProvisionerStatus) -> i64 {
    let is_true = |ty: &str| status.conditions.iter().any(|c| c.type_ == ty && c.status == "True");
    i64::from(is_true(cond::AVAILABLE) && !is_true(cond::PROGRESSING) && !is_true(cond::DEGRADED))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(s: &HostPathProvisionerStatus) -> Vec<(String, String)> {
        s.conditions
            .iter()
            .map(|c| (c.type_.clone(), c.status.clone()))
            .collect()
    }

    fn not_ready() -> Readiness {
        Readiness {
            workloads_not_ready: vec!["ds".into()],
            ..Default::default()
        }
    }

    #[test]
    fn first_pass_is_deploying_then_healthy() {
        let r = not_ready();
        let d = derive(&Default::default(), "v1", &Outcome::Applied(&r), "t0");
        assert_eq!(d.state, State::Deploying);
        assert_eq!(d.reason, "DeployStarted");
        assert!(d.transition && d.changed);
        assert_eq!(d.status.observed_version, None);
        let progressing = d.status.conditions.iter().find(|c| c.type_ == "Progressing").unwrap();
        assert_eq!(progressing.message.as_deref(), Some("Started Deployment"));
        let ready = Readiness::ready();
        let h = derive(&d.status, "v1", &Outcome::Applied(&ready), "t1");
        assert_eq!(h.state, State::Healthy);
        assert_eq!(h.status.observed_version.as_deref(), Some("v1"));
        assert_eq!(
            flags(&h.status),
            [
                ("Available".into(), "True".into()),
                ("Progressing".into(), "False".into()),
                ("Degraded".into(), "False".into())
            ]
        );
        // Steady state: only heartbeats differ, so no write and no event.
        let again = derive(&h.status, "v1", &Outcome::Applied(&ready), "t2");
        assert!(!again.changed && !again.transition);
        let available = again.status.conditions.iter().find(|c| c.type_ == "Available").unwrap();
        assert_eq!(
            available.last_transition_time.as_deref(),
            Some("t1"),
            "transition time kept while status is unchanged"
        );
        assert_eq!(available.last_heartbeat_time.as_deref(), Some("t2"));
        assert_eq!(cr_ready_value(&again.status), 1);
        assert_eq!(cr_ready_value(&d.status), 0, "a first deploy is not ready");
    }

    #[test]
    fn upgrade_failure_and_pool_states() {
        let prev = HostPathProvisionerStatus {
            observed_version: Some("v1".into()),
            ..Default::default()
        };
        let up = derive(&prev, "v2", &Outcome::Applied(&not_ready()), "t");
        assert_eq!(up.state, State::UpgradeHealingDegraded);
        assert_eq!(up.message, "Started upgrade to version v2");
        let failed = derive(&prev, "v1", &Outcome::Applied(&not_ready()), "t");
        assert_eq!(failed.state, State::Failed);
        assert_eq!(failed.reason, "Degraded");
        assert_eq!(cr_ready_value(&failed.status), 0);
        assert_eq!(cr_ready_value(&up.status), 0, "not ready while upgrading");
        let pools = Readiness {
            pools_not_ready: vec!["error: Pool PVC x is Pending instead of Bound".into()],
            ..Default::default()
        };
        let p = derive(&prev, "v1", &Outcome::Applied(&pools), "t");
        assert_eq!(
            (p.state, p.reason.as_str()),
            (State::FailedHealing, "StoragePoolNotReady")
        );
        let e = derive(&prev, "v1", &Outcome::Failed("boom".into()), "t");
        assert_eq!(e.message, "Unable to successfully reconcile: boom");
        assert_eq!(e.reason, "ReconcileFailed");
        assert_eq!(flags(&e.status)[1].1, "True");
    }

    #[test]
    fn a_rollout_is_progressing_until_its_updated_pods_are_ready() {
        let ready = Readiness::ready();
        let healthy = derive(&Default::default(), "v1", &Outcome::Applied(&ready), "t0");
        assert_eq!(healthy.state, State::Healthy);
        let rolling = Readiness {
            workloads_rolling_out: vec!["DaemonSet ds: 0 of 2 pods updated".into()],
            ..Default::default()
        };
        let r = derive(&healthy.status, "v1", &Outcome::Applied(&rolling), "t1");
        assert_eq!((r.state, r.reason.as_str()), (State::RollingOut, "UpgradeStarted"));
        assert!(!r.state.is_warning(), "a rollout is routine");
        assert_eq!(
            flags(&r.status),
            [
                ("Available".into(), "True".into()),
                ("Progressing".into(), "True".into()),
                ("Degraded".into(), "False".into())
            ]
        );
        assert_eq!(cr_ready_value(&r.status), 0);
        // Every pod updated, not all ready yet: still the rollout, not Degraded.
        let r2 = derive(&r.status, "v1", &Outcome::Applied(&not_ready()), "t2");
        assert_eq!((r2.state, r2.reason.as_str()), (State::RollingOut, "UpgradeStarted"));
        let done = derive(&r2.status, "v1", &Outcome::Applied(&ready), "t3");
        assert_eq!(done.state, State::Healthy);
        // Once healthy, pods going unready is Degraded again.
        let degraded = derive(&done.status, "v1", &Outcome::Applied(&not_ready()), "t4");
        assert_eq!(degraded.state, State::Failed);
        // A rollout on a CR that was not Available is failing-and-healing.
        let from_failed = derive(&degraded.status, "v1", &Outcome::Applied(&rolling), "t5");
        assert_eq!(
            (from_failed.state, from_failed.reason.as_str()),
            (State::FailedHealing, "UpgradeStarted")
        );
    }

    #[test]
    fn steps_contribute_conditions_that_keep_their_transition_time() {
        let quota = |ok: bool| Readiness {
            conditions: vec![crate::subreconciler::StepCondition {
                type_: "QuotaReady".into(),
                status: ok,
                reason: if ok { "Enforced" } else { "NoQuotaSupport" }.into(),
                message: "project quotas".into(),
            }],
            ..Default::default()
        };
        let first = derive(&Default::default(), "v1", &Outcome::Applied(&quota(false)), "t0");
        let q = first
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == "QuotaReady")
            .unwrap();
        assert_eq!(
            (q.status.as_str(), q.reason.as_deref()),
            ("False", Some("NoQuotaSupport"))
        );
        assert_eq!(first.status.conditions.len(), 4);
        let same = derive(&first.status, "v1", &Outcome::Applied(&quota(false)), "t1");
        let q = same.status.conditions.iter().find(|c| c.type_ == "QuotaReady").unwrap();
        assert_eq!(q.last_transition_time.as_deref(), Some("t0"));
        let flipped = derive(&same.status, "v1", &Outcome::Applied(&quota(true)), "t2");
        assert!(flipped.transition, "a step condition flip is a transition");
        // A failed pass keeps the step's last word.
        let failed = derive(&flipped.status, "v1", &Outcome::Failed("boom".into()), "t3");
        let q = failed
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == "QuotaReady")
            .unwrap();
        assert_eq!(q.status, "True");
    }

    #[test]
    fn status_subresource_condition_follows_how_status_is_written() {
        let ready = Readiness::ready();
        let healthy = derive(&Default::default(), "v1", &Outcome::Applied(&ready), "t0");
        // A CRD that always had the subresource: no condition at all.
        let plain = with_status_path(healthy.clone(), &Default::default(), false, "t0");
        assert!(
            plain
                .status
                .conditions
                .iter()
                .all(|c| c.type_ != CONDITION_STATUS_SUBRESOURCE)
        );
        // KubeVirt's CRD: False, with the way out in the message.
        let main = with_status_path(healthy.clone(), &Default::default(), true, "t0");
        let c = main.status.conditions.last().unwrap();
        assert_eq!(
            (c.type_.as_str(), c.status.as_str(), c.reason.as_deref()),
            (
                CONDITION_STATUS_SUBRESOURCE,
                "False",
                Some(REASON_CRD_WITHOUT_STATUS_SUBRESOURCE)
            )
        );
        assert!(c.message.as_deref().unwrap().contains("kubectl apply -f deploy/crds/"));
        // Steady: the next pass writes nothing new.
        let again = derive(&main.status, "v1", &Outcome::Applied(&ready), "t1");
        let again = with_status_path(again, &main.status, true, "t1");
        assert!(!again.changed && !again.transition, "{:?}", again.status.conditions);
        assert_eq!(again.status.conditions.len(), main.status.conditions.len());
        // The CRD gained the subresource: True, a change to write, then steady again.
        let back = derive(&main.status, "v1", &Outcome::Applied(&ready), "t2");
        let back = with_status_path(back, &main.status, false, "t2");
        let c = back.status.conditions.last().unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref()),
            ("True", Some(REASON_STATUS_SUBRESOURCE_PRESENT))
        );
        assert!(back.changed);
        let steady = with_status_path(
            derive(&back.status, "v1", &Outcome::Applied(&ready), "t3"),
            &back.status,
            false,
            "t3",
        );
        assert!(!steady.changed);
        // A failed pass keeps step conditions from the last status; the condition is not doubled.
        let failed = derive(&main.status, "v1", &Outcome::Failed("x".into()), "t4");
        let failed = with_status_path(failed, &main.status, true, "t4");
        let n = failed
            .status
            .conditions
            .iter()
            .filter(|c| c.type_ == CONDITION_STATUS_SUBRESOURCE)
            .count();
        assert_eq!(n, 1);
    }

    #[test]
    fn downgrades_are_refused_only_within_one_family() {
        // hpp after hpp: a lower hpp version is refused.
        assert!(is_downgrade("hpp-v0.2.0", "hpp-v0.1.0"));
        assert!(!is_downgrade("hpp-v0.1.0", "hpp-v0.2.0"));
        assert!(!is_downgrade("hpp-v0.1.0", "hpp-v0.1.0"));
        // hpp after KubeVirt (any release, even one numbered higher): an upgrade.
        assert!(!is_downgrade("v0.25.2", "hpp-v0.1.0"));
        assert!(!is_downgrade("v9.0.0", "hpp-v0.1.0"));
        // An explicit OPERATOR_VERSION in plain semver keeps the plain comparison.
        assert!(is_downgrade("v2.0.0", "v1.0.0"));
        assert!(!is_downgrade("v1.0.0", "v2.0.0"));
        assert!(!is_downgrade("hpp-v9.0.0", "v1.0.0"));
    }

    /// KubeVirt's `canUpgrade` (pkg/controller/hostpathprovisioner/controller.go): strip one
    /// leading `v`, parse both as strict semver (blang/semver `Make`: exactly three numeric
    /// parts, optional `-pre` and `+build`); only when both parse and its own version is lower
    /// does it refuse. hpp's default version must never be refused, whatever KubeVirt release
    /// comes back.
    #[test]
    fn kubevirts_operator_takes_back_a_cr_hpp_wrote() {
        fn strict_semver(v: &str) -> Option<(u64, u64, u64)> {
            let v = v.strip_prefix('v').unwrap_or(v);
            let core = v.split(['-', '+']).next()?;
            let parts: Vec<&str> = core.split('.').collect();
            let [a, b, c] = parts.as_slice() else { return None };
            let num = |p: &str| (!p.is_empty() && p.bytes().all(|c| c.is_ascii_digit())).then(|| p.parse().ok())?;
            Some((num(a)?, num(b)?, num(c)?))
        }
        fn kubevirt_refuses(observed: &str, kubevirt: &str) -> bool {
            matches!((strict_semver(observed), strict_semver(kubevirt)), (Some(o), Some(k)) if k < o)
        }
        let written = crate::OperatorConfig::default().version;
        assert!(written.starts_with(HPP_VERSION_PREFIX), "{written}");
        for kubevirt in ["v0.0.1", "v0.25.2", "v0.26.0", "v1.0.0"] {
            assert!(!kubevirt_refuses(&written, kubevirt), "{kubevirt} after {written}");
        }
        // What the old default did: a plain v0.26.0 stranded KubeVirt v0.25.2.
        assert!(kubevirt_refuses("v0.26.0", "v0.25.2"));
    }

    #[test]
    fn node_loss_summary_is_kept_unless_a_step_reports_one() {
        use hpp_api::v1beta1::NodeLossStatus;
        let ready = Readiness::ready();
        let base = derive(&Default::default(), "v1", &Outcome::Applied(&ready), "t0").status;
        assert_eq!(base.node_loss, None, "absent until reported");
        let summary = NodeLossStatus {
            claims_released: 2,
            ..Default::default()
        };
        let reported = Readiness {
            node_loss: Some(summary.clone()),
            ..Default::default()
        };
        let with = derive(&base, "v1", &Outcome::Applied(&reported), "t1");
        assert!(with.changed && !with.transition);
        assert_eq!(with.status.node_loss.as_ref(), Some(&summary));
        // A pass with nothing to say, a failed or a refused pass: the summary stays, no write.
        for outcome in [
            Outcome::Applied(&ready),
            Outcome::Failed("boom".into()),
            Outcome::Refused("no".into()),
        ] {
            let d = derive(&with.status, "v1", &outcome, "t2");
            assert_eq!(d.status.node_loss.as_ref(), Some(&summary), "{outcome:?}");
        }
        assert!(!derive(&with.status, "v1", &Outcome::Applied(&ready), "t2").changed);
        // An empty report clears it.
        let empty = Readiness {
            node_loss: Some(NodeLossStatus::default()),
            ..Default::default()
        };
        assert_eq!(
            derive(&with.status, "v1", &Outcome::Applied(&empty), "t3")
                .status
                .node_loss,
            None
        );
    }

    #[test]
    fn versions_compare_semantically() {
        assert!(version_newer("v0.10.0", "v0.9.9"));
        assert!(version_newer("1.2.3", "v1.2"));
        assert!(!version_newer("v1.2.3", "v1.2.3"));
        assert!(!version_newer("v1.2.3-rc1", "v1.2.3"));
        assert!(!version_newer("v0.9.0", "v0.10.0"));
    }

    #[test]
    fn usage_figures_alone_are_told_apart_from_other_changes() {
        let pool = |phase: &str, available: &str| StoragePoolStatus {
            name: "local".into(),
            phase: Some(phase.into()),
            committed: Some("1Gi".into()),
            available: Some(available.into()),
            ..Default::default()
        };
        let status = |pool: StoragePoolStatus| HostPathProvisionerStatus {
            storage_pool_statuses: vec![pool],
            ..Default::default()
        };
        let before = status(pool("Ready", "100Gi"));
        let usage = status(pool("Ready", "99Gi"));
        assert!(!same_but_times(&before, &usage));
        assert!(same_but_usage(&before, &usage));
        let phase = status(pool("Mounting", "99Gi"));
        assert!(!same_but_usage(&before, &phase), "a phase change is not a usage change");
        let mut fewer = usage.clone();
        fewer.storage_pool_statuses.clear();
        assert!(!same_but_usage(&before, &fewer), "a pool gone is not a usage change");
    }
}
