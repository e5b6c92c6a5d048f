//! Whether a DaemonSet or Deployment rollout is done, judged as `kubectl rollout status` does:
//! the controller has seen the latest spec, every pod runs it, and those pods are available.
//! A pod count alone (numberReady ≥ desired) is not enough: right after an image swap the old
//! pods are still ready.

use kube::api::DynamicObject;
use serde_json::Value;

use crate::subreconciler::Readiness;

/// Where a workload stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rollout {
    /// Latest spec observed, every pod updated and available.
    Done,
    /// The controller has not caught up with the spec, or old pods still run: a rollout is
    /// under way. The message says how far it got.
    InProgress(String),
    /// Every pod runs the latest spec, but not all of them are available.
    NotReady(String),
}

fn int(o: &DynamicObject, pointer: &str) -> i64 {
    o.data.pointer(pointer).and_then(Value::as_i64).unwrap_or(0)
}

fn generation_observed(o: &DynamicObject) -> bool {
    let generation = o.metadata.generation.unwrap_or(0);
    int(o, "/status/observedGeneration") >= generation
}

/// Judges a live DaemonSet.
pub fn daemonset(o: &DynamicObject) -> Rollout {
    let name = o.metadata.name.as_deref().unwrap_or_default();
    let desired = int(o, "/status/desiredNumberScheduled");
    let updated = int(o, "/status/updatedNumberScheduled");
    let available = int(o, "/status/numberAvailable");
    let ready = int(o, "/status/numberReady");
    if !generation_observed(o) {
        return Rollout::InProgress(format!("DaemonSet {name}: waiting for the spec update to be observed"));
    }
    if updated < desired {
        return Rollout::InProgress(format!("DaemonSet {name}: {updated} of {desired} pods updated"));
    }
    if desired == 0 || available < desired || ready < desired {
        return Rollout::NotReady(format!("DaemonSet {name} has {ready} of {desired} pods ready"));
    }
    Rollout::Done
}

/// Judges a live Deployment (`spec.replicas`, default 1).
pub fn deployment(o: &DynamicObject) -> Rollout {
    let name = o.metadata.name.as_deref().unwrap_or_default();
    let replicas = o.data.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1);
    let updated = int(o, "/status/updatedReplicas");
    let total = int(o, "/status/replicas");
    let available = int(o, "/status/availableReplicas");
    if !generation_observed(o) {
        return Rollout::InProgress(format!("Deployment {name}: waiting for the spec update to be observed"));
    }
    if updated < replicas || total > updated {
        return Rollout::InProgress(format!("Deployment {name}: {updated} of {replicas} replicas updated"));
    }
    if available < updated {
        return Rollout::NotReady(format!(
            "Deployment {name} has {available} of {replicas} replicas available"
        ));
    }
    Rollout::Done
}

/// Readiness of a set of live DaemonSets: rollouts under way and pods not ready, each listed.
pub fn daemonsets_readiness(live: &[DynamicObject]) -> Readiness {
    let mut r = Readiness::ready();
    for ds in live {
        match daemonset(ds) {
            Rollout::Done => {}
            Rollout::InProgress(m) => r.workloads_rolling_out.push(m),
            Rollout::NotReady(m) => r.workloads_not_ready.push(m),
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(kind: &str, generation: i64, spec: Value, status: Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": kind,
            "metadata": { "name": "x", "generation": generation },
            "spec": spec, "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn daemonset_after_image_swap_is_in_progress_until_updated_pods_are_available() {
        let full = json!({ "observedGeneration": 2, "desiredNumberScheduled": 2, "numberReady": 2,
                           "numberAvailable": 2, "updatedNumberScheduled": 2 });
        assert_eq!(daemonset(&obj("DaemonSet", 2, json!({}), full.clone())), Rollout::Done);
        // The spec changed; old pods are all ready, none updated.
        let swapped = json!({ "observedGeneration": 2, "desiredNumberScheduled": 2, "numberReady": 2,
                              "numberAvailable": 2, "updatedNumberScheduled": 0 });
        assert!(matches!(
            daemonset(&obj("DaemonSet", 2, json!({}), swapped)),
            Rollout::InProgress(_)
        ));
        assert!(matches!(
            daemonset(&obj("DaemonSet", 3, json!({}), full)),
            Rollout::InProgress(_)
        ));
        let crashing = json!({ "observedGeneration": 2, "desiredNumberScheduled": 2, "numberReady": 1,
                               "numberAvailable": 1, "updatedNumberScheduled": 2 });
        assert!(matches!(
            daemonset(&obj("DaemonSet", 2, json!({}), crashing)),
            Rollout::NotReady(_)
        ));
    }

    #[test]
    fn deployment_counts_updated_and_available_replicas() {
        let spec = json!({ "replicas": 1 });
        let done = json!({ "observedGeneration": 1, "replicas": 1, "updatedReplicas": 1, "availableReplicas": 1 });
        assert_eq!(deployment(&obj("Deployment", 1, spec.clone(), done)), Rollout::Done);
        let surge = json!({ "observedGeneration": 1, "replicas": 2, "updatedReplicas": 1, "availableReplicas": 1 });
        assert!(matches!(
            deployment(&obj("Deployment", 1, spec.clone(), surge)),
            Rollout::InProgress(_)
        ));
        let fresh = json!({ "observedGeneration": 1, "replicas": 1, "updatedReplicas": 1 });
        assert!(matches!(
            deployment(&obj("Deployment", 1, spec, fresh)),
            Rollout::NotReady(_)
        ));
    }
}
