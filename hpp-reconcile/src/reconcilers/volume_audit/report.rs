//! What the volume audit publishes, pure: the status summary and per-pool findings, the
//! `OrphanedVolumes` condition (with the exact command to move an orphan into the trash) and
//! the Warning Events of missing volumes.

use std::collections::BTreeMap;

use hpp_api::inventory::Inventory;
use hpp_api::quantity::format_bytes;
use hpp_api::v1beta1::{
    HostPathProvisionerStatus, MAX_AUDIT_NAMES, NodeNotAudited, PoolVolumeAudit, VolumeAuditStatus,
};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;

use super::decide::{DRIVER_CONTAINER, Findings, Missing};
use crate::subreconciler::{ObjectWarning, StepCondition, VolumeAuditReport};

/// Condition type on the CR: the last volume audit found volumes no PersistentVolume refers to.
pub const CONDITION_ORPHANED_VOLUMES: &str = "OrphanedVolumes";
/// Reason (True): orphans were found; the message names them and the command to trash one.
pub const REASON_ORPHANS_FOUND: &str = "OrphansFound";
/// Reason (False): the nodes that answered hold no orphan.
pub const REASON_NO_ORPHANS: &str = "NoOrphans";
/// Reason (False): no audit has run yet (the driver pods roll out the report token first).
pub const REASON_AUDIT_PENDING: &str = "AuditPending";
/// Reason (False): no node's driver answered the last audit, so nothing was judged.
pub const REASON_NO_NODE_AUDITED: &str = "NoNodeAudited";
/// Warning Event on a PersistentVolume and its claim: the volume is missing on its node.
pub const REASON_VOLUME_MISSING: &str = "VolumeMissing";

/// The CSI socket inside the driver container, as `hpp-csi-driver call` is given it.
const CSI_ENDPOINT: &str = "unix:///csi/csi.sock";

fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The status of an audit at `at` of the nodes whose `reports` came back, with the nodes that
/// could not be asked or did not answer.
pub fn summarize(
    findings: &Findings,
    reports: &BTreeMap<String, Inventory>,
    mut not_audited: Vec<NodeNotAudited>,
    at: Timestamp,
) -> VolumeAuditReport {
    let mut pools: BTreeMap<String, PoolVolumeAudit> = reports
        .values()
        .flat_map(|r| &r.pools)
        .map(|p| (p.name.clone(), PoolVolumeAudit::default()))
        .collect();
    for o in &findings.orphans {
        let pool = pools.entry(o.pool.clone()).or_default();
        pool.orphaned_volumes = pool.orphaned_volumes.saturating_add(1);
        let bytes = o.used_bytes.map_or(0, |b| i64::try_from(b).unwrap_or(i64::MAX));
        pool.orphaned_bytes = pool.orphaned_bytes.saturating_add(bytes);
        if pool.orphans.len() < MAX_AUDIT_NAMES {
            pool.orphans.push(format!("{}/{}", o.node, o.id));
        }
    }
    for m in &findings.missing {
        let pool = pools.entry(m.pool.clone()).or_default();
        pool.missing_volumes = pool.missing_volumes.saturating_add(1);
        if pool.missing.len() < MAX_AUDIT_NAMES {
            pool.missing.push(m.pv.clone());
        }
    }
    not_audited.sort_by(|a, b| a.name.cmp(&b.name));
    let nodes_not_audited = count(not_audited.len());
    not_audited.truncate(MAX_AUDIT_NAMES);
    VolumeAuditReport {
        status: VolumeAuditStatus {
            last_audit_time: Some(crate::status::rfc3339(at)),
            nodes_audited: count(reports.len()),
            nodes_not_audited,
            not_audited,
        },
        pools,
    }
}

/// The last audit as the stored status has it (an operator that restarted goes on from there
/// instead of auditing at once): its time and report. `None` before the first audit.
pub fn from_status(status: &HostPathProvisionerStatus) -> Option<(Timestamp, VolumeAuditReport)> {
    let audit = status.volume_audit.clone()?;
    let at: Timestamp = audit.last_audit_time.as_deref()?.parse().ok()?;
    let pools = status
        .storage_pool_statuses
        .iter()
        .filter_map(|p| Some((p.name.clone(), p.volume_audit.clone()?)))
        .collect();
    Some((at, VolumeAuditReport { status: audit, pools }))
}

/// The label selector of the CSI driver's pods (the operator's pod shares the Prometheus label,
/// the legacy provisioner's the app label; only the driver's have both).
pub fn driver_pod_selector() -> String {
    use hpp_api::constants as c;
    format!("{}={},{}=true", c::LABEL_APP, c::LABEL_APP_VALUE, c::LABEL_PROMETHEUS)
}

/// The command that moves orphan `id` of `pool` on `node` into its pool's trash.
pub fn trash_command(namespace: &str, node: &str, pool: &str, id: &str) -> String {
    format!(
        "kubectl exec -n {namespace} \"$(kubectl get pod -n {namespace} -l {} --field-selector spec.nodeName={node} -o name)\" \
         -c {DRIVER_CONTAINER} -- hpp-csi-driver call --endpoint {CSI_ENDPOINT} trash move {id} --pool {pool}",
        driver_pod_selector()
    )
}

fn not_audited_text(status: &VolumeAuditStatus) -> String {
    let mut text = status
        .not_audited
        .iter()
        .map(|n| format!("{}: {}", n.name, n.reason))
        .collect::<Vec<_>>()
        .join("; ");
    let more = status.nodes_not_audited - count(status.not_audited.len());
    if more > 0 {
        text.push_str(&format!("; and {more} more"));
    }
    text
}

/// The `OrphanedVolumes` condition for the last audit (`None`: none ran yet).
pub fn condition(report: Option<&VolumeAuditReport>, namespace: &str) -> StepCondition {
    let make = |status: bool, reason: &str, message: String| StepCondition {
        type_: CONDITION_ORPHANED_VOLUMES.into(),
        status,
        reason: reason.into(),
        message,
    };
    let Some(report) = report.filter(|r| r.status.last_audit_time.is_some()) else {
        return make(
            false,
            REASON_AUDIT_PENDING,
            "The first volume audit (spec.volumeAudit) runs once the CSI driver pods run with the report token; \
             nothing is judged before it"
                .into(),
        );
    };
    let s = &report.status;
    if s.nodes_audited == 0 {
        return make(
            false,
            REASON_NO_NODE_AUDITED,
            format!(
                "No node's driver answered the last volume audit, so no volume was judged: {}",
                not_audited_text(s)
            ),
        );
    }
    let orphans: i64 = report.pools.values().map(|p| p.orphaned_volumes).sum();
    let missing: i64 = report.pools.values().map(|p| p.missing_volumes).sum();
    let mut tail = String::new();
    if missing > 0 {
        tail.push_str(&format!(
            " {missing} Bound PersistentVolume(s) have no volume on their node: see the {REASON_VOLUME_MISSING} \
             Warning Events on them and their claims."
        ));
    }
    if s.nodes_not_audited > 0 {
        tail.push_str(&format!(
            " {} node(s) not audited, their volumes not judged: {}.",
            s.nodes_not_audited,
            not_audited_text(s)
        ));
    }
    if orphans == 0 {
        return make(
            false,
            REASON_NO_ORPHANS,
            format!(
                "The last volume audit found no orphaned volume on {} node(s).{tail}",
                s.nodes_audited
            ),
        );
    }
    let bytes: i64 = report.pools.values().map(|p| p.orphaned_bytes).sum();
    let listed = report
        .pools
        .iter()
        .filter(|(_, p)| p.orphaned_volumes > 0)
        .map(|(name, p)| {
            let more = p.orphaned_volumes - count(p.orphans.len());
            let more = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            format!("pool {name}: {}{more}", p.orphans.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ");
    let first = report
        .pools
        .iter()
        .find_map(|(name, p)| Some((name, p.orphans.first()?)))
        .and_then(|(pool, entry)| {
            let (node, id) = entry.split_once('/')?;
            Some(trash_command(namespace, node, pool, id))
        })
        .unwrap_or_default();
    make(
        true,
        REASON_ORPHANS_FOUND,
        format!(
            "{orphans} orphaned volume(s), directories no PersistentVolume refers to, use {} ({listed}). Nothing \
             is deleted automatically. Move one into its pool's trash with: {first}{tail}",
            format_bytes(u64::try_from(bytes).unwrap_or_default())
        ),
    )
}

fn reference(kind: &str, namespace: Option<&str>, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some(kind.into()),
        namespace: namespace.map(str::to_owned),
        name: Some(name.into()),
        uid: Some(uid.to_owned()).filter(|u| !u.is_empty()),
        ..Default::default()
    }
}

/// A Warning on each missing volume's PersistentVolume and claim; the message does not change
/// from audit to audit, so each is published once while the problem lasts.
pub fn missing_warnings(missing: &[Missing]) -> Vec<ObjectWarning> {
    let mut out = Vec::new();
    for m in missing {
        let place = match &m.node {
            Some(node) => format!("pool {} on node {node}", m.pool),
            None => format!("shared pool {}", m.pool),
        };
        let claim = m
            .claim
            .as_ref()
            .map(|c| format!(" (claim {}/{})", c.namespace, c.name))
            .unwrap_or_default();
        let message = format!(
            "PersistentVolume {}{claim} is Bound, but its volume {} is missing from {place}: the node's driver \
             lists the pool and this volume is not in it. Pods using it cannot start or see no data; the driver \
             also reports it abnormal to kubelet. Nothing is changed automatically: restore the data from a \
             backup or the pool's trash (hpp-csi-driver call ... trash list), or delete the claim",
            m.pv, m.handle
        );
        out.push(ObjectWarning {
            regarding: reference("PersistentVolume", None, &m.pv, &m.pv_uid),
            reason: REASON_VOLUME_MISSING.into(),
            message: message.clone(),
        });
        if let Some(c) = &m.claim {
            out.push(ObjectWarning {
                regarding: reference("PersistentVolumeClaim", Some(&c.namespace), &c.name, &c.uid),
                reason: REASON_VOLUME_MISSING.into(),
                message,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::reconcilers::volume_audit::decide::{ClaimRef, Orphan};
    use hpp_api::inventory::PoolInventory;
    use hpp_api::v1beta1::StoragePoolStatus;

    fn at() -> Timestamp {
        "2025-06-01T10:00:00Z".parse().unwrap()
    }

    fn reports(pools: &[&str]) -> BTreeMap<String, Inventory> {
        let inv = Inventory {
            node: "node01".into(),
            pools: pools
                .iter()
                .map(|p| PoolInventory {
                    name: (*p).into(),
                    shared: false,
                    usable: true,
                    reason: None,
                    volumes: vec![],
                })
                .collect(),
        };
        BTreeMap::from([("node01".to_owned(), inv)])
    }

    fn orphan(node: &str, id: &str, bytes: Option<u64>) -> Orphan {
        Orphan {
            pool: "local".into(),
            node: node.into(),
            id: id.into(),
            used_bytes: bytes,
        }
    }

    fn missing(pv: &str, claim: bool) -> Missing {
        Missing {
            pv: pv.into(),
            pv_uid: format!("u-{pv}"),
            handle: pv.into(),
            pool: "local".into(),
            node: Some("node01".into()),
            claim: claim.then(|| ClaimRef {
                namespace: "apps".into(),
                name: "data".into(),
                uid: "c1".into(),
            }),
        }
    }

    #[test]
    fn the_summary_counts_everything_and_names_the_first() {
        let findings = Findings {
            orphans: (0..12)
                .map(|i| orphan("node01", &format!("v{i:02}"), Some(1024)))
                .collect(),
            missing: vec![missing("pv-a", true)],
        };
        let down = vec![NodeNotAudited {
            name: "node02".into(),
            reason: "connection refused".into(),
        }];
        let r = summarize(&findings, &reports(&["local", "empty"]), down, at());
        assert_eq!(r.status.last_audit_time.as_deref(), Some("2025-06-01T10:00:00Z"));
        assert_eq!((r.status.nodes_audited, r.status.nodes_not_audited), (1, 1));
        let local = &r.pools["local"];
        assert_eq!((local.orphaned_volumes, local.orphaned_bytes), (12, 12 * 1024));
        assert_eq!(local.orphans.len(), MAX_AUDIT_NAMES);
        assert_eq!(local.orphans[0], "node01/v00");
        assert_eq!(
            (local.missing_volumes, local.missing.clone()),
            (1, vec!["pv-a".to_owned()])
        );
        assert_eq!(r.pools["empty"], PoolVolumeAudit::default(), "an audited pool reads 0");
    }

    #[test]
    fn the_condition_says_what_was_found_and_how_to_trash_it() {
        let ns = "hostpath-provisioner";
        let pending = condition(None, ns);
        assert_eq!((pending.status, pending.reason.as_str()), (false, REASON_AUDIT_PENDING));
        let clean = summarize(&Findings::default(), &reports(&["local"]), vec![], at());
        let c = condition(Some(&clean), ns);
        assert_eq!((c.status, c.reason.as_str()), (false, REASON_NO_ORPHANS));
        assert_eq!(
            c.message,
            "The last volume audit found no orphaned volume on 1 node(s)."
        );
        let found = Findings {
            orphans: vec![orphan("node01", "pvc-x", Some(2048))],
            missing: vec![missing("pv-a", false)],
        };
        let down = vec![NodeNotAudited {
            name: "node02".into(),
            reason: "did not answer within 30s".into(),
        }];
        let r = summarize(&found, &reports(&["local"]), down, at());
        let c = condition(Some(&r), ns);
        assert_eq!((c.status, c.reason.as_str()), (true, REASON_ORPHANS_FOUND));
        assert!(c.message.starts_with("1 orphaned volume(s)"), "{}", c.message);
        assert!(
            c.message.contains("use 2Ki (pool local: node01/pvc-x)"),
            "{}",
            c.message
        );
        assert!(c.message.contains("Nothing is deleted automatically"), "{}", c.message);
        assert!(
            c.message.contains(&trash_command(ns, "node01", "local", "pvc-x")),
            "{}",
            c.message
        );
        assert!(
            c.message.contains("see the VolumeMissing Warning Events"),
            "{}",
            c.message
        );
        assert!(c.message.contains("node02: did not answer within 30s"), "{}", c.message);
        let nobody = summarize(&Findings::default(), &BTreeMap::new(), vec![], at());
        assert_eq!(condition(Some(&nobody), ns).reason, REASON_NO_NODE_AUDITED);
    }

    #[test]
    fn the_trash_command_is_exact() {
        assert_eq!(
            trash_command("hpp", "node01", "local", "pvc-1"),
            "kubectl exec -n hpp \"$(kubectl get pod -n hpp -l k8s-app=hostpath-provisioner,prometheus.hostpathprovisioner.kubevirt.io=true \
             --field-selector spec.nodeName=node01 -o name)\" -c hostpath-provisioner -- hpp-csi-driver call \
             --endpoint unix:///csi/csi.sock trash move pvc-1 --pool local"
        );
    }

    #[test]
    fn a_missing_volume_warns_on_its_pv_and_its_claim() {
        let w = missing_warnings(&[missing("pv-a", true), missing("pv-b", false)]);
        let on: Vec<(&str, &str)> = w
            .iter()
            .map(|w| {
                (
                    w.regarding.kind.as_deref().unwrap(),
                    w.regarding.name.as_deref().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            on,
            [
                ("PersistentVolume", "pv-a"),
                ("PersistentVolumeClaim", "data"),
                ("PersistentVolume", "pv-b")
            ]
        );
        assert_eq!(w[1].regarding.namespace.as_deref(), Some("apps"));
        assert!(w.iter().all(|w| w.reason == REASON_VOLUME_MISSING));
        assert!(
            w[0].message
                .contains("volume pv-a is missing from pool local on node node01")
        );
    }

    #[test]
    fn a_restarted_operator_reads_the_last_audit_back() {
        let found = Findings {
            orphans: vec![orphan("node01", "pvc-x", None)],
            missing: vec![],
        };
        let r = summarize(&found, &reports(&["local"]), vec![], at());
        let status = HostPathProvisionerStatus {
            volume_audit: Some(r.status.clone()),
            storage_pool_statuses: vec![StoragePoolStatus {
                name: "local".into(),
                volume_audit: r.pools.get("local").cloned(),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(from_status(&status), Some((at(), r)));
        assert_eq!(from_status(&HostPathProvisionerStatus::default()), None);
    }
}
