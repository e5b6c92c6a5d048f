//! The node-loss decision, a pure function: (nodes, PVs, StorageClasses, the stored
//! `status.nodeLoss`, now) → [`Plan`]. Everything the step does comes from here; the step
//! only reads its inputs and carries the plan out.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use hpp_api::constants as c;
use hpp_api::v1beta1::{LostNode, NodeLossReason, NodeLossStatus};
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::policy::{self, Policy};
use crate::facts::NodeFact;
use crate::status::rfc3339;
use crate::subreconciler::ObjectWarning;

/// Warning reason on a StorageClass (or, once the class is gone, a PV) whose node-loss
/// parameters are not understood; it is treated as `Retain`.
pub const REASON_INVALID_NODE_LOSS_POLICY: &str = "InvalidNodeLossPolicy";

/// What the decision reads.
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    /// Every Node (an empty list means the nodes are unknown, never that all are gone).
    pub nodes: &'a [NodeFact],
    /// PersistentVolumes to consider (any driver, any node; others are ignored).
    pub volumes: &'a [PersistentVolume],
    /// Every StorageClass.
    pub classes: &'a [StorageClass],
    /// `status.nodeLoss` as stored.
    pub previous: &'a NodeLossStatus,
    /// The pass's clock reading.
    pub now: Timestamp,
}

/// A PVC as a PV's `claimRef` names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The uid the PV is bound to (the delete's precondition).
    pub uid: String,
}

/// Where a volume's policy was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicySource {
    /// Its StorageClass's parameters.
    Class,
    /// Its volume attributes (the class no longer exists).
    VolumeAttributes,
}

/// A claim to release: delete the PVC, then the PV, then the external provisioner's finalizer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Release {
    /// The lost node.
    pub node: String,
    /// Why it counts as lost.
    pub reason: NodeLossReason,
    /// When the loss was first seen (RFC 3339).
    pub since: String,
    /// PV name.
    pub pv: String,
    /// PV uid (the delete's precondition).
    pub pv_uid: String,
    /// The claim bound to it.
    pub claim: ClaimRef,
    /// The PV's StorageClass name (empty without one).
    pub storage_class: String,
    /// Where `Recreate` was read.
    pub source: PolicySource,
    /// The grace period that ran out.
    pub grace: Duration,
    /// Position of [`c::FINALIZER_EXTERNAL_PROVISIONER`] in the PV's finalizers.
    pub finalizer_at: Option<usize>,
}

/// A PV of a lost node, already being deleted, whose external-provisioner finalizer nobody
/// else will remove.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FinalizerRemoval {
    /// PV name.
    pub pv: String,
    /// PV uid (tested by the patch).
    pub pv_uid: String,
    /// Position of the finalizer (tested by the patch).
    pub at: usize,
}

/// A loss seen for the first time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewLoss {
    /// The node.
    pub node: String,
    /// Why it counts as lost.
    pub reason: NodeLossReason,
    /// The claims that will be released (`namespace/name`), sorted.
    pub claims: Vec<String>,
    /// When the first of them is due.
    pub first_due: Timestamp,
}

/// A loss that ended before all its claims were released: the node is back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cancelled {
    /// The node.
    pub node: String,
    /// Claims released before it came back.
    pub released: i64,
}

/// What to do in this pass.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// The next `status.nodeLoss`, before this pass's releases are counted.
    pub status: NodeLossStatus,
    /// Claims whose grace period is over.
    pub releases: Vec<Release>,
    /// Finalizers of PVs already being deleted.
    pub finalizers: Vec<FinalizerRemoval>,
    /// Losses seen for the first time.
    pub new_losses: Vec<NewLoss>,
    /// Losses that ended.
    pub cancelled: Vec<Cancelled>,
    /// Parameters not understood (treated as `Retain`).
    pub invalid: Vec<ObjectWarning>,
    /// The earliest grace period still running (pass again then).
    pub next_due: Option<Timestamp>,
}

/// The node a PV is pinned to: a required node-affinity term `topology.hostpath.csi/node In
/// [node]` naming exactly one node (the driver's volumes carry one).
pub fn pinned_node(pv: &PersistentVolume) -> Option<&str> {
    let terms = &pv
        .spec
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required
        .as_ref()?
        .node_selector_terms;
    let mut nodes = terms
        .iter()
        .flat_map(|t| t.match_expressions.iter().flatten())
        .filter(|e| e.key == c::TOPOLOGY_KEY && e.operator == "In")
        .flat_map(|e| e.values.iter().flatten());
    let first = nodes.next()?;
    nodes.all(|n| n == first).then_some(first.as_str())
}

/// Whether a PV belongs to the hpp CSI driver.
pub fn is_ours(pv: &PersistentVolume) -> bool {
    pv.spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .is_some_and(|csi| csi.driver == c::DRIVER_NAME)
}

/// Why a node counts as lost, or `None` while it is there.
pub fn loss_reason(node: Option<&NodeFact>) -> Option<NodeLossReason> {
    match node {
        None => Some(NodeLossReason::NodeDeleted),
        Some(n) if n.taints.iter().any(|t| t.key == c::TAINT_OUT_OF_SERVICE) => Some(NodeLossReason::OutOfService),
        Some(_) => None,
    }
}

/// Whether a class belongs to the hpp CSI driver.
pub fn is_our_class(class: &StorageClass) -> bool {
    class.provisioner == c::DRIVER_NAME
}

/// The policies of the driver's classes that mention node loss, by name, with a warning for
/// each one not understood. Other classes are `Retain` and never reported.
pub fn class_policies(classes: &[StorageClass]) -> (HashMap<&str, Policy>, Vec<ObjectWarning>) {
    let mut policies = HashMap::new();
    let mut warnings = Vec::new();
    for class in classes.iter().filter(|cl| is_our_class(cl)) {
        let params = class.parameters.as_ref();
        let policy = match policy::read(params) {
            Ok(p) => p,
            Err(problem) => {
                warnings.push(ObjectWarning {
                    regarding: ObjectReference {
                        api_version: Some("storage.k8s.io/v1".into()),
                        kind: Some("StorageClass".into()),
                        name: Some(class.name_any()),
                        uid: class.metadata.uid.clone(),
                        ..Default::default()
                    },
                    reason: REASON_INVALID_NODE_LOSS_POLICY.into(),
                    message: format!(
                        "StorageClass {}: {problem}. Until it is fixed the class is treated as nodeLossPolicy {}: \
                         claims pinned to a lost node are kept. Parameters are immutable: delete and re-create the class",
                        class.name_any(),
                        c::NODE_LOSS_POLICY_RETAIN
                    ),
                });
                Policy::Retain
            }
        };
        policies.insert(class.metadata.name.as_deref().unwrap_or_default(), policy);
    }
    (policies, warnings)
}

/// A PV of a lost node whose policy is `Recreate`.
struct Tracked<'a> {
    pv: &'a PersistentVolume,
    grace: Duration,
    source: PolicySource,
}

/// A PV's policy: its class's when the class exists (a class of another provisioner, or one
/// that does not mention node loss, is `Retain`), else its volume attributes'.
fn volume_policy(
    pv: &PersistentVolume,
    policies: &HashMap<&str, Policy>,
    existing: &HashMap<&str, &StorageClass>,
    warnings: &mut Vec<ObjectWarning>,
) -> (Policy, PolicySource) {
    let class = pv
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .unwrap_or_default();
    if !class.is_empty() && existing.contains_key(class) {
        return (
            policies.get(class).copied().unwrap_or(Policy::Retain),
            PolicySource::Class,
        );
    }
    let attributes = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .and_then(|csi| csi.volume_attributes.as_ref());
    match policy::read(attributes) {
        Ok(p) => (p, PolicySource::VolumeAttributes),
        Err(problem) => {
            warnings.push(ObjectWarning {
                regarding: ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("PersistentVolume".into()),
                    name: Some(pv.name_any()),
                    uid: pv.metadata.uid.clone(),
                    ..Default::default()
                },
                reason: REASON_INVALID_NODE_LOSS_POLICY.into(),
                message: format!(
                    "PersistentVolume {}: its StorageClass {class:?} no longer exists and its volume attribute {problem}; \
                     it is treated as nodeLossPolicy {}",
                    pv.name_any(),
                    c::NODE_LOSS_POLICY_RETAIN
                ),
            });
            (Policy::Retain, PolicySource::VolumeAttributes)
        }
    }
}

fn claim_ref(pv: &PersistentVolume) -> Option<ClaimRef> {
    let r = pv.spec.as_ref()?.claim_ref.as_ref()?;
    Some(ClaimRef {
        namespace: r.namespace.clone().filter(|s| !s.is_empty())?,
        name: r.name.clone().filter(|s| !s.is_empty())?,
        uid: r.uid.clone().filter(|s| !s.is_empty())?,
    })
}

/// `since + grace`, saturating at the end of time (a grace period is at most ten years).
fn due(since: Timestamp, grace: Duration) -> Timestamp {
    since.saturating_add(grace).unwrap_or(Timestamp::MAX)
}

/// Decides what to release, what to report and what to record.
pub fn decide(inp: Inputs<'_>) -> Plan {
    let (policies, mut invalid) = class_policies(inp.classes);
    // No Node at all means the node list could not be read, not that every node is gone.
    if inp.nodes.is_empty() {
        return Plan {
            status: inp.previous.clone(),
            invalid,
            ..Plan::default()
        };
    }
    let nodes: HashMap<&str, &NodeFact> = inp.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    let existing: HashMap<&str, &StorageClass> = inp
        .classes
        .iter()
        .map(|cl| (cl.metadata.name.as_deref().unwrap_or_default(), cl))
        .collect();
    // The PVs of Recreate classes pinned to each lost node.
    let mut lost: BTreeMap<&str, (NodeLossReason, Vec<Tracked<'_>>)> = BTreeMap::new();
    for pv in inp.volumes.iter().filter(|pv| is_ours(pv)) {
        let Some(node) = pinned_node(pv) else { continue };
        let Some(reason) = loss_reason(nodes.get(node).copied()) else {
            continue;
        };
        let (policy, source) = volume_policy(pv, &policies, &existing, &mut invalid);
        let Policy::Recreate { grace } = policy else { continue };
        let deleting = pv.metadata.deletion_timestamp.is_some();
        if !deleting && claim_ref(pv).is_none() {
            continue; // not bound to a claim: nothing to release
        }
        lost.entry(node)
            .or_insert_with(|| (reason, Vec::new()))
            .1
            .push(Tracked { pv, grace, source });
    }
    let previous: HashMap<&str, &LostNode> = inp.previous.lost_nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    // Seconds, as stored: a loss first seen in this pass counts from the same instant now as
    // in every later pass.
    let now_text = rfc3339(inp.now);
    let mut plan = Plan {
        invalid,
        ..Plan::default()
    };
    for (node, (reason, tracked)) in &lost {
        let stored = previous
            .get(node)
            .and_then(|p| Some((p, p.since.parse::<Timestamp>().ok()?)));
        let (since_text, since, released) = match stored {
            Some((p, since)) => (p.since.clone(), since, p.claims_released),
            None => (now_text.clone(), now_text.parse().unwrap_or(inp.now), 0),
        };
        let mut waiting = Vec::new();
        let mut first_due: Option<Timestamp> = None;
        for t in tracked {
            let at = due(since, t.grace);
            let finalizer_at =
                t.pv.finalizers()
                    .iter()
                    .position(|f| f == c::FINALIZER_EXTERNAL_PROVISIONER);
            let deleting = t.pv.metadata.deletion_timestamp.is_some();
            if !deleting {
                waiting.push(
                    claim_ref(t.pv)
                        .map(|r| format!("{}/{}", r.namespace, r.name))
                        .unwrap_or_default(),
                );
                first_due = Some(first_due.map_or(at, |d| d.min(at)));
            }
            if at > inp.now {
                plan.next_due = Some(plan.next_due.map_or(at, |d| d.min(at)));
                continue;
            }
            let uid = t.pv.metadata.uid.clone().unwrap_or_default();
            match (deleting, claim_ref(t.pv)) {
                (false, Some(claim)) => plan.releases.push(Release {
                    node: (*node).to_owned(),
                    reason: *reason,
                    since: since_text.clone(),
                    pv: t.pv.name_any(),
                    pv_uid: uid,
                    claim,
                    storage_class: t
                        .pv
                        .spec
                        .as_ref()
                        .and_then(|s| s.storage_class_name.clone())
                        .unwrap_or_default(),
                    source: t.source.clone(),
                    grace: t.grace,
                    finalizer_at,
                }),
                (true, _) => {
                    if let Some(at) = finalizer_at {
                        plan.finalizers.push(FinalizerRemoval {
                            pv: t.pv.name_any(),
                            pv_uid: uid,
                            at,
                        });
                    }
                }
                (false, None) => {}
            }
        }
        // Announced once, when first seen with claims still to release.
        if stored.is_none() && !waiting.is_empty() {
            waiting.sort();
            plan.new_losses.push(NewLoss {
                node: (*node).to_owned(),
                reason: *reason,
                claims: waiting,
                first_due: first_due.unwrap_or(inp.now),
            });
        }
        plan.status.lost_nodes.push(LostNode {
            name: (*node).to_owned(),
            reason: *reason,
            since: since_text,
            claims_released: released,
        });
    }
    // Stored losses with nothing left to release: the node came back (cancelled), or every
    // claim is gone (resolved, dropped quietly).
    for p in &inp.previous.lost_nodes {
        if !lost.contains_key(p.name.as_str()) && loss_reason(nodes.get(p.name.as_str()).copied()).is_none() {
            plan.cancelled.push(Cancelled {
                node: p.name.clone(),
                released: p.claims_released,
            });
        }
    }
    plan.status.claims_released = inp.previous.claims_released;
    plan
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    const T0: &str = "2025-06-01T10:00:00Z";

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    fn plus(text: &str, secs: i64) -> Timestamp {
        at(text)
            .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(secs))
            .unwrap()
    }

    fn node(name: &str) -> NodeFact {
        NodeFact::ready(name)
    }

    fn tainted(name: &str, effect: &str) -> NodeFact {
        let mut n = NodeFact::ready(name);
        n.ready = false;
        n.taints = vec![
            serde_json::from_value(json!({"key": c::TAINT_OUT_OF_SERVICE, "value": "nodeshutdown", "effect": effect}))
                .unwrap(),
        ];
        n
    }

    fn class(name: &str, params: serde_json::Value) -> StorageClass {
        serde_json::from_value(json!({
            "metadata": {"name": name, "uid": format!("uid-{name}")},
            "provisioner": c::DRIVER_NAME,
            "parameters": params,
        }))
        .unwrap()
    }

    fn recreate(name: &str, grace: &str) -> StorageClass {
        class(
            name,
            json!({"storagePool": "local", "nodeLossPolicy": "Recreate", "nodeLossGracePeriod": grace}),
        )
    }

    fn pv_with(name: &str, node: &str, class: &str, driver: &str, attributes: serde_json::Value) -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {"name": name, "uid": format!("uid-{name}"),
                         "finalizers": ["kubernetes.io/pv-protection", c::FINALIZER_EXTERNAL_PROVISIONER]},
            "spec": {
                "storageClassName": class,
                "csi": {"driver": driver, "volumeHandle": name, "volumeAttributes": attributes},
                "claimRef": {"namespace": "apps", "name": format!("data-{name}"), "uid": format!("claim-{name}")},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": c::TOPOLOGY_KEY, "operator": "In", "values": [node]}]}]}},
            },
            "status": {"phase": "Bound"},
        }))
        .unwrap()
    }

    fn pv(name: &str, node: &str, class: &str) -> PersistentVolume {
        pv_with(name, node, class, c::DRIVER_NAME, json!({"storagePool": "local"}))
    }

    fn run(
        nodes: &[NodeFact],
        volumes: &[PersistentVolume],
        classes: &[StorageClass],
        previous: &NodeLossStatus,
        now: Timestamp,
    ) -> Plan {
        decide(Inputs {
            nodes,
            volumes,
            classes,
            previous,
            now,
        })
    }

    fn released(plan: &Plan) -> Vec<&str> {
        plan.releases.iter().map(|r| r.pv.as_str()).collect()
    }

    fn stored(name: &str, reason: NodeLossReason, since: &str) -> NodeLossStatus {
        NodeLossStatus {
            claims_released: 0,
            lost_nodes: vec![LostNode {
                name: name.into(),
                reason,
                since: since.into(),
                claims_released: 0,
            }],
        }
    }

    #[test]
    fn a_deleted_node_is_lost_from_the_first_pass_and_released_after_the_grace_period() {
        let classes = [recreate("fast", "5m")];
        let volumes = [pv("pv-a", "node02", "fast")];
        let nodes = [node("node01")];
        let first = run(&nodes, &volumes, &classes, &NodeLossStatus::default(), at(T0));
        assert!(first.releases.is_empty(), "grace not over: {first:?}");
        assert_eq!(
            first.status.lost_nodes,
            [LostNode {
                name: "node02".into(),
                reason: NodeLossReason::NodeDeleted,
                since: T0.into(),
                claims_released: 0
            }]
        );
        assert_eq!(first.new_losses.len(), 1);
        assert_eq!(first.new_losses[0].claims, ["apps/data-pv-a"]);
        assert_eq!(first.new_losses[0].first_due, plus(T0, 300));
        assert_eq!(first.next_due, Some(plus(T0, 300)));
        // One second before the deadline: still waiting, no new-loss event again.
        let before = run(&nodes, &volumes, &classes, &first.status, plus(T0, 299));
        assert!(before.releases.is_empty() && before.new_losses.is_empty());
        assert_eq!(before.status, first.status, "since is kept, not moved");
        // At the deadline: released, with everything the deletes need.
        let due = run(&nodes, &volumes, &classes, &first.status, plus(T0, 300));
        assert_eq!(
            due.releases,
            [Release {
                node: "node02".into(),
                reason: NodeLossReason::NodeDeleted,
                since: T0.into(),
                pv: "pv-a".into(),
                pv_uid: "uid-pv-a".into(),
                claim: ClaimRef {
                    namespace: "apps".into(),
                    name: "data-pv-a".into(),
                    uid: "claim-pv-a".into()
                },
                storage_class: "fast".into(),
                source: PolicySource::Class,
                grace: Duration::from_secs(300),
                finalizer_at: Some(1),
            }]
        );
        assert_eq!(due.next_due, None);
    }

    #[test]
    fn an_out_of_service_taint_of_any_effect_is_a_loss() {
        let classes = [recreate("fast", "0")];
        for effect in ["NoExecute", "NoSchedule"] {
            let nodes = [node("node01"), tainted("node02", effect)];
            let plan = run(
                &nodes,
                &[pv("pv-a", "node02", "fast")],
                &classes,
                &NodeLossStatus::default(),
                at(T0),
            );
            assert_eq!(plan.status.lost_nodes[0].reason, NodeLossReason::OutOfService);
            assert_eq!(released(&plan), ["pv-a"], "grace 0 releases at once ({effect})");
        }
        // Other taints (a node merely NotReady) are not a loss.
        let mut unreachable = node("node02");
        unreachable.taints = vec![
            serde_json::from_value(json!({"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"})).unwrap(),
        ];
        let plan = run(
            &[unreachable],
            &[pv("pv-a", "node02", "fast")],
            &classes,
            &NodeLossStatus::default(),
            at(T0),
        );
        assert!(plan.status.lost_nodes.is_empty() && plan.releases.is_empty());
    }

    #[test]
    fn a_node_back_in_time_cancels_the_loss() {
        let classes = [recreate("fast", "5m")];
        let volumes = [pv("pv-a", "node02", "fast")];
        let previous = stored("node02", NodeLossReason::OutOfService, T0);
        let plan = run(
            &[node("node01"), node("node02")],
            &volumes,
            &classes,
            &previous,
            plus(T0, 60),
        );
        assert!(plan.releases.is_empty());
        assert!(plan.status.lost_nodes.is_empty());
        assert_eq!(
            plan.cancelled,
            [Cancelled {
                node: "node02".into(),
                released: 0
            }]
        );
        // Lost again later: a fresh grace period, not the old one.
        let again = run(&[node("node01")], &volumes, &classes, &plan.status, plus(T0, 3600));
        assert_eq!(again.status.lost_nodes[0].since, "2025-06-01T11:00:00Z");
        assert!(again.releases.is_empty());
    }

    #[test]
    fn every_claim_released_resolves_the_loss_quietly() {
        let previous = NodeLossStatus {
            claims_released: 3,
            lost_nodes: vec![LostNode {
                name: "node02".into(),
                reason: NodeLossReason::NodeDeleted,
                since: T0.into(),
                claims_released: 3,
            }],
        };
        let plan = run(
            &[node("node01")],
            &[],
            &[recreate("fast", "5m")],
            &previous,
            plus(T0, 900),
        );
        assert!(plan.status.lost_nodes.is_empty() && plan.cancelled.is_empty());
        assert_eq!(plan.status.claims_released, 3, "the total stays");
    }

    #[test]
    fn retain_classes_are_never_touched() {
        let classes = [
            class("keep", json!({"storagePool": "local", "nodeLossPolicy": "Retain"})),
            class("plain", json!({"storagePool": "local"})),
        ];
        let volumes = [pv("pv-a", "node02", "keep"), pv("pv-b", "node02", "plain")];
        let plan = run(
            &[node("node01")],
            &volumes,
            &classes,
            &NodeLossStatus::default(),
            plus(T0, 86400),
        );
        assert_eq!(plan, Plan::default(), "nothing tracked, nothing reported");
    }

    #[test]
    fn another_drivers_volume_is_never_touched() {
        let classes = [recreate("fast", "0")];
        // Even in a Recreate class and with the attribute: not the hpp driver's.
        let foreign = pv_with(
            "pv-x",
            "node02",
            "fast",
            "other.csi.example.com",
            json!({"nodeLossPolicy": "Recreate"}),
        );
        let plan = run(
            &[node("node01")],
            &[foreign],
            &classes,
            &NodeLossStatus::default(),
            at(T0),
        );
        assert_eq!(plan, Plan::default());
    }

    #[test]
    fn only_the_lost_nodes_volumes_are_released() {
        let classes = [recreate("fast", "0")];
        let volumes = [pv("pv-a", "node02", "fast"), pv("pv-b", "node01", "fast")];
        let plan = run(
            &[node("node01")],
            &volumes,
            &classes,
            &NodeLossStatus::default(),
            at(T0),
        );
        assert_eq!(released(&plan), ["pv-a"]);
        assert_eq!(plan.status.lost_nodes.len(), 1);
    }

    #[test]
    fn a_deleted_class_falls_back_to_the_volume_attributes() {
        let with_attribute = pv_with(
            "pv-a",
            "node02",
            "gone",
            c::DRIVER_NAME,
            json!({"storagePool": "local", "nodeLossPolicy": "Recreate", "nodeLossGracePeriod": "1m"}),
        );
        let without = pv("pv-b", "node02", "gone");
        let plan = run(
            &[node("node01")],
            &[with_attribute.clone(), without],
            &[],
            &NodeLossStatus::default(),
            at(T0),
        );
        assert!(plan.releases.is_empty());
        let later = run(&[node("node01")], &[with_attribute], &[], &plan.status, plus(T0, 60));
        assert_eq!(released(&later), ["pv-a"]);
        assert_eq!(later.releases[0].source, PolicySource::VolumeAttributes);
        // While the class exists, the class decides, whatever the attributes say.
        let keep = [class("gone", json!({"nodeLossPolicy": "Retain"}))];
        let volumes = [pv_with(
            "pv-a",
            "node02",
            "gone",
            c::DRIVER_NAME,
            json!({"nodeLossPolicy": "Recreate", "nodeLossGracePeriod": "0"}),
        )];
        let kept = run(&[node("node01")], &volumes, &keep, &NodeLossStatus::default(), at(T0));
        assert!(kept.releases.is_empty() && kept.status.lost_nodes.is_empty());
    }

    #[test]
    fn invalid_parameters_are_reported_and_treated_as_retain() {
        let classes = [
            class("typo", json!({"nodeLossPolicy": "recreate"})),
            class(
                "bad-grace",
                json!({"nodeLossPolicy": "Recreate", "nodeLossGracePeriod": "soon"}),
            ),
        ];
        let volumes = [pv("pv-a", "node02", "typo"), pv("pv-b", "node02", "bad-grace")];
        let plan = run(
            &[node("node01")],
            &volumes,
            &classes,
            &NodeLossStatus::default(),
            plus(T0, 86400),
        );
        assert!(plan.releases.is_empty() && plan.status.lost_nodes.is_empty());
        let on: Vec<_> = plan
            .invalid
            .iter()
            .map(|w| {
                (
                    w.regarding.kind.as_deref().unwrap(),
                    w.regarding.name.as_deref().unwrap(),
                )
            })
            .collect();
        assert_eq!(on, [("StorageClass", "typo"), ("StorageClass", "bad-grace")]);
        assert!(
            plan.invalid[1].message.contains("nodeLossGracePeriod"),
            "{:?}",
            plan.invalid[1]
        );
        // A volume whose class is gone and whose attribute is not understood: reported on the PV.
        let orphan = pv_with(
            "pv-c",
            "node02",
            "gone",
            c::DRIVER_NAME,
            json!({"nodeLossPolicy": "Sometimes"}),
        );
        let plan = run(&[node("node01")], &[orphan], &[], &NodeLossStatus::default(), at(T0));
        assert_eq!(plan.invalid.len(), 1);
        assert_eq!(plan.invalid[0].regarding.kind.as_deref(), Some("PersistentVolume"));
        assert!(plan.releases.is_empty());
    }

    #[test]
    fn a_pv_already_being_deleted_only_loses_the_provisioner_finalizer() {
        let mut deleting = pv("pv-a", "node02", "fast");
        deleting.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(T0)));
        let previous = stored("node02", NodeLossReason::NodeDeleted, T0);
        let classes = [recreate("fast", "5m")];
        let plan = run(
            &[node("node01")],
            &[deleting.clone()],
            &classes,
            &previous,
            plus(T0, 300),
        );
        assert!(plan.releases.is_empty());
        assert_eq!(
            plan.finalizers,
            [FinalizerRemoval {
                pv: "pv-a".into(),
                pv_uid: "uid-pv-a".into(),
                at: 1
            }]
        );
        assert_eq!(plan.status.lost_nodes.len(), 1, "still listed until the PV is gone");
        // Before its grace period ends (someone else deleted it), the finalizer stays.
        let early = run(&[node("node01")], &[deleting], &classes, &previous, plus(T0, 10));
        assert!(early.finalizers.is_empty());
    }

    #[test]
    fn no_nodes_at_all_means_unknown_not_lost() {
        let previous = stored("node02", NodeLossReason::NodeDeleted, T0);
        let plan = run(
            &[],
            &[pv("pv-a", "node02", "fast")],
            &[recreate("fast", "0")],
            &previous,
            plus(T0, 86400),
        );
        assert!(plan.releases.is_empty() && plan.cancelled.is_empty());
        assert_eq!(plan.status, previous);
    }

    #[test]
    fn unbound_and_foreign_pinned_volumes_are_skipped() {
        let mut unbound = pv("pv-a", "node02", "fast");
        unbound.spec.as_mut().unwrap().claim_ref = None;
        let mut two_nodes = pv("pv-b", "node02", "fast");
        two_nodes
            .spec
            .as_mut()
            .unwrap()
            .node_affinity
            .as_mut()
            .unwrap()
            .required
            .as_mut()
            .unwrap()
            .node_selector_terms[0]
            .match_expressions
            .as_mut()
            .unwrap()[0]
            .values = Some(vec!["node02".into(), "node03".into()]);
        assert_eq!(pinned_node(&two_nodes), None);
        let plan = run(
            &[node("node01")],
            &[unbound, two_nodes],
            &[recreate("fast", "0")],
            &NodeLossStatus::default(),
            at(T0),
        );
        assert_eq!(plan, Plan::default());
    }

    #[test]
    fn each_class_keeps_its_own_grace_period_from_the_same_start() {
        let classes = [recreate("quick", "1m"), recreate("slow", "1h")];
        let volumes = [pv("pv-q", "node02", "quick"), pv("pv-s", "node02", "slow")];
        let previous = stored("node02", NodeLossReason::NodeDeleted, T0);
        let plan = run(&[node("node01")], &volumes, &classes, &previous, plus(T0, 120));
        assert_eq!(released(&plan), ["pv-q"]);
        assert_eq!(plan.next_due, Some(plus(T0, 3600)));
    }
}
