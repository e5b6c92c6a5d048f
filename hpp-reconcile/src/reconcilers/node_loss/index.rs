//! The node-loss step's index of the driver's PersistentVolumes by the node they are pinned to,
//! fed by the controller's PV watch (a [`WatchIndex`]).
//!
//! Per PV it keeps the name, the node, the StorageClass name and the `nodeLossPolicy` volume
//! attribute, the last two interned (a cluster has few distinct values), so it costs a small
//! fixed amount per PV and nothing per pass: a pass asks which PVs of the lost nodes may have
//! to be released, in O(nodes with PVs + PVs on lost nodes), and reads only those PVs in full
//! (from the watch cache). Without it, a pass would scan every PV to find the nodes they are
//! pinned to, O(PVs) each time.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use hpp_api::constants as c;
use kube::ResourceExt;
use kube::api::DynamicObject;
use kube::runtime::watcher::Event;
use serde_json::Value;

use crate::index::WatchIndex;

/// What the index keeps of one PV besides its name and node.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Pin {
    class: Option<Arc<str>>,
    policy_attribute: Option<Arc<str>>,
}

/// PVs by node, and the node of each PV (to move or drop a PV on update or delete).
#[derive(Default)]
struct Pins {
    by_node: HashMap<Arc<str>, HashMap<Arc<str>, Pin>>,
    node_of: HashMap<Arc<str>, Arc<str>>,
}

impl Pins {
    /// Drops a PV; whether it was there.
    fn remove(&mut self, pv: &str) -> bool {
        let Some(node) = self.node_of.remove(pv) else {
            return false;
        };
        if let Some(pvs) = self.by_node.get_mut(&node) {
            pvs.remove(pv);
            if pvs.is_empty() {
                self.by_node.remove(&node);
            }
        }
        true
    }

    /// Records a PV on a node; whether anything changed.
    fn upsert(&mut self, pv: &str, node: &str, pin: Pin) -> bool {
        if self.node_of.get(pv).is_some_and(|n| &**n == node)
            && self.by_node.get(node).and_then(|pvs| pvs.get(pv)) == Some(&pin)
        {
            return false;
        }
        self.remove(pv);
        let node: Arc<str> = match self.by_node.get_key_value(node) {
            Some((k, _)) => k.clone(),
            None => Arc::from(node),
        };
        let pv: Arc<str> = Arc::from(pv);
        self.node_of.insert(pv.clone(), node.clone());
        self.by_node.entry(node).or_default().insert(pv, pin);
        true
    }
}

#[derive(Default)]
struct State {
    ready: bool,
    live: Pins,
    /// The listing under way after an `Init`, swapped in at `InitDone`.
    building: Option<Pins>,
    /// Interned class names and attribute values.
    strings: HashSet<Arc<str>>,
}

impl State {
    fn intern(&mut self, s: &str) -> Arc<str> {
        if let Some(found) = self.strings.get(s) {
            return found.clone();
        }
        let new: Arc<str> = Arc::from(s);
        self.strings.insert(new.clone());
        new
    }

    fn pins(&mut self) -> &mut Pins {
        match &mut self.building {
            Some(b) => b,
            None => &mut self.live,
        }
    }

    /// Records `obj` (or drops it when it is not a pinned PV of the driver).
    fn upsert(&mut self, obj: &DynamicObject) -> bool {
        let name = obj.name_any();
        match pinned(obj) {
            Some((node, class, policy)) => {
                let pin = Pin {
                    class: class.map(|s| self.intern(s)),
                    policy_attribute: policy.map(|s| self.intern(s)),
                };
                self.pins().upsert(&name, node, pin)
            }
            None => self.pins().remove(&name),
        }
    }
}

/// The node a driver PV (as watched, JSON) is pinned to, its class and its `nodeLossPolicy`
/// attribute; `None` for other PVs.
fn pinned(obj: &DynamicObject) -> Option<(&str, Option<&str>, Option<&str>)> {
    let spec = obj.data.get("spec")?;
    let csi = spec.get("csi")?;
    if csi.get("driver").and_then(Value::as_str) != Some(c::DRIVER_NAME) {
        return None;
    }
    let terms = spec.pointer("/nodeAffinity/required/nodeSelectorTerms")?.as_array()?;
    let mut nodes = terms
        .iter()
        .filter_map(|t| t.get("matchExpressions")?.as_array())
        .flatten()
        .filter(|e| {
            e.get("key").and_then(Value::as_str) == Some(c::TOPOLOGY_KEY)
                && e.get("operator").and_then(Value::as_str) == Some("In")
        })
        .filter_map(|e| e.get("values")?.as_array())
        .flatten()
        .filter_map(Value::as_str);
    let node = nodes.next()?;
    if !nodes.all(|n| n == node) {
        return None;
    }
    let class = spec
        .get("storageClassName")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty());
    let policy = csi
        .pointer(&format!("/volumeAttributes/{}", c::PARAM_NODE_LOSS_POLICY))
        .and_then(Value::as_str);
    Some((node, class, policy))
}

/// The driver's PVs by node; see the module docs.
#[derive(Default)]
pub struct VolumeIndex {
    state: RwLock<State>,
}

impl std::fmt::Debug for VolumeIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (ready, volumes) = self
            .state
            .read()
            .map(|s| (s.ready, s.live.node_of.len()))
            .unwrap_or_default();
        f.debug_struct("VolumeIndex")
            .field("ready", &ready)
            .field("volumes", &volumes)
            .finish()
    }
}

impl VolumeIndex {
    /// The PVs pinned to nodes `lost` calls lost whose class (or, without one, `nodeLossPolicy`
    /// attribute) `wanted` accepts; `None` until the index holds a complete listing.
    pub fn candidates(
        &self,
        lost: impl Fn(&str) -> bool,
        wanted: impl Fn(Option<&str>, Option<&str>) -> bool,
    ) -> Option<Vec<String>> {
        let state = self.state.read().ok()?;
        if !state.ready {
            return None;
        }
        let mut out = Vec::new();
        for (node, pvs) in &state.live.by_node {
            if !lost(node) {
                continue;
            }
            for (pv, pin) in pvs {
                if wanted(pin.class.as_deref(), pin.policy_attribute.as_deref()) {
                    out.push(pv.to_string());
                }
            }
        }
        out.sort();
        Some(out)
    }

    /// How many PVs are indexed.
    pub fn len(&self) -> usize {
        self.state.read().map(|s| s.live.node_of.len()).unwrap_or_default()
    }

    /// Whether no PV is indexed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl WatchIndex for VolumeIndex {
    fn apply(&self, event: &Event<DynamicObject>) -> bool {
        let Ok(mut state) = self.state.write() else {
            return false;
        };
        match event {
            Event::Apply(obj) => state.upsert(obj),
            Event::Delete(obj) => state.pins().remove(&obj.name_any()),
            Event::Init => {
                state.building = Some(Pins::default());
                false
            }
            Event::InitApply(obj) => {
                state.upsert(obj);
                false
            }
            Event::InitDone => {
                if let Some(done) = state.building.take() {
                    state.live = done;
                }
                state.ready = true;
                // A pass once complete: deadlines that ran out before the listing are acted on.
                true
            }
        }
    }

    fn is_ready(&self) -> bool {
        self.state.read().is_ok_and(|s| s.ready)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn pv(name: &str, node: &str, class: &str, driver: &str) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": name},
            "spec": {
                "storageClassName": class,
                "csi": {"driver": driver, "volumeHandle": name,
                        "volumeAttributes": {"nodeLossPolicy": "Recreate"}},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": c::TOPOLOGY_KEY, "operator": "In", "values": [node]}]}]}},
            },
        }))
        .unwrap()
    }

    fn ours(name: &str, node: &str, class: &str) -> DynamicObject {
        pv(name, node, class, c::DRIVER_NAME)
    }

    fn on(index: &VolumeIndex, node: &str) -> Vec<String> {
        index.candidates(|n| n == node, |_, _| true).unwrap()
    }

    #[test]
    fn answers_only_once_listed_and_keeps_up_with_changes() {
        let index = VolumeIndex::default();
        assert!(!index.apply(&Event::Init));
        assert!(!index.apply(&Event::InitApply(ours("pv-a", "node02", "fast"))));
        assert!(!index.apply(&Event::InitApply(pv("pv-x", "node02", "fast", "other.example.com"))));
        assert_eq!(index.candidates(|_| true, |_, _| true), None, "not listed yet");
        assert!(index.apply(&Event::InitDone), "a complete listing triggers a pass");
        assert!(index.is_ready());
        assert_eq!(on(&index, "node02"), ["pv-a"], "other drivers' PVs are not indexed");
        // A new PV, the same PV again (no change), a move, a delete.
        assert!(index.apply(&Event::Apply(ours("pv-b", "node02", "fast"))));
        assert!(!index.apply(&Event::Apply(ours("pv-b", "node02", "fast"))));
        assert_eq!(on(&index, "node02"), ["pv-a", "pv-b"]);
        assert!(index.apply(&Event::Apply(ours("pv-b", "node03", "fast"))));
        assert_eq!(on(&index, "node02"), ["pv-a"]);
        assert_eq!(on(&index, "node03"), ["pv-b"]);
        assert!(index.apply(&Event::Delete(ours("pv-a", "node02", "fast"))));
        assert!(on(&index, "node02").is_empty());
        assert!(
            !index.apply(&Event::Delete(ours("pv-a", "node02", "fast"))),
            "already gone"
        );
        assert_eq!(index.len(), 1);
    }

    #[test]
    fn a_relist_drops_what_was_deleted_meanwhile() {
        let index = VolumeIndex::default();
        for e in [
            Event::Init,
            Event::InitApply(ours("pv-a", "node02", "fast")),
            Event::InitApply(ours("pv-b", "node02", "fast")),
            Event::InitDone,
        ] {
            index.apply(&e);
        }
        // The watch restarts; pv-b was deleted while it was down.
        index.apply(&Event::Init);
        index.apply(&Event::InitApply(ours("pv-a", "node02", "fast")));
        assert_eq!(
            on(&index, "node02"),
            ["pv-a", "pv-b"],
            "the old listing answers meanwhile"
        );
        index.apply(&Event::InitDone);
        assert_eq!(on(&index, "node02"), ["pv-a"]);
    }

    #[test]
    fn candidates_are_filtered_by_node_and_by_class_or_attribute() {
        let index = VolumeIndex::default();
        index.apply(&Event::Init);
        index.apply(&Event::InitApply(ours("pv-a", "node02", "fast")));
        index.apply(&Event::InitApply(ours("pv-b", "node02", "keep")));
        index.apply(&Event::InitApply(ours("pv-c", "node01", "fast")));
        index.apply(&Event::InitDone);
        let found = index
            .candidates(
                |n| n == "node02",
                |class, attribute| class == Some("fast") && attribute == Some("Recreate"),
            )
            .unwrap();
        assert_eq!(found, ["pv-a"]);
    }

    #[test]
    fn the_json_reading_agrees_with_the_typed_one() {
        let obj = ours("pv-a", "node02", "fast");
        let typed: k8s_openapi::api::core::v1::PersistentVolume =
            serde_json::from_value(serde_json::to_value(&obj).unwrap()).unwrap();
        assert_eq!(pinned(&obj).map(|p| p.0), super::super::decide::pinned_node(&typed));
        assert!(super::super::decide::is_ours(&typed));
    }
}
