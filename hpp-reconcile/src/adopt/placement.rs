//! The node a directory volume lives on, from the PV's node affinity (evaluated against the
//! Nodes, as the scheduler does: a `kubernetes.io/hostname` label may differ from the node
//! name, and OpenEBS may pin to other labels) or, for PVs without one, the node the old
//! provisioner recorded in an annotation. Pure.

use hpp_api::constants::{ANNOTATION_PROVISION_ON_NODE, ANNOTATION_PROVISIONER_IDENTITY};
use k8s_openapi::api::core::v1::{Affinity, NodeAffinity, PersistentVolume};

use super::source::LOCAL_PATH_SELECTED_NODE;
use crate::facts::NodeFact;
use crate::reconcilers::node_affinity::required_affinity_matches;

/// Where a PV's directory is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// On this node (a Node name, which is also the CSI driver's node id).
    Node(String),
    /// Pinned to no node: no node affinity and no node annotation (a shared filesystem, or a
    /// hand-made PV).
    Unpinned,
    /// The node affinity admits several nodes.
    Several(Vec<String>),
    /// The PV names a node that does not exist: why, in words.
    Missing(String),
}

/// Where `pv` lives among `nodes`.
pub fn place(pv: &PersistentVolume, nodes: &[NodeFact]) -> Placement {
    let required = pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .filter(|r| !r.node_selector_terms.is_empty());
    if let Some(selector) = required {
        let affinity = Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(selector.clone()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let matching: Vec<String> = nodes
            .iter()
            .filter(|n| required_affinity_matches(Some(&affinity), n))
            .map(|n| n.name.clone())
            .collect();
        return match matching.as_slice() {
            [one] => Placement::Node(one.clone()),
            [] => Placement::Missing(format!("its node affinity ({}) matches no Node", describe(selector))),
            _ => Placement::Several(matching),
        };
    }
    let annotations = pv.metadata.annotations.clone().unwrap_or_default();
    for key in [ANNOTATION_PROVISION_ON_NODE, LOCAL_PATH_SELECTED_NODE] {
        if let Some(node) = annotations.get(key).filter(|n| !n.is_empty()) {
            return match nodes.iter().any(|n| &n.name == node) {
                true => Placement::Node(node.clone()),
                false => Placement::Missing(format!("its annotation {key} names node {node}, which does not exist")),
            };
        }
    }
    // The single-node provisioner's identity is its NODE_NAME; other identities name no node.
    match annotations.get(ANNOTATION_PROVISIONER_IDENTITY) {
        Some(node) if nodes.iter().any(|n| &n.name == node) => Placement::Node(node.clone()),
        _ => Placement::Unpinned,
    }
}

/// `key op [values]` of each requirement, terms separated by ` or `.
fn describe(selector: &k8s_openapi::api::core::v1::NodeSelector) -> String {
    selector
        .node_selector_terms
        .iter()
        .map(|t| {
            t.match_expressions
                .iter()
                .flatten()
                .chain(t.match_fields.iter().flatten())
                .map(|r| {
                    format!(
                        "{} {} [{}]",
                        r.key,
                        r.operator,
                        r.values.clone().unwrap_or_default().join(",")
                    )
                })
                .collect::<Vec<_>>()
                .join(", ")
        })
        .collect::<Vec<_>>()
        .join(" or ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn node(name: &str, hostname: &str) -> NodeFact {
        let mut n = NodeFact::ready(name);
        n.labels.insert("kubernetes.io/hostname".into(), hostname.into());
        n
    }

    fn pv(meta: serde_json::Value, affinity: Option<serde_json::Value>) -> PersistentVolume {
        let mut spec = json!({"hostPath": {"path": "/d/x"}});
        if let Some(a) = affinity {
            spec["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [a]}]}});
        }
        serde_json::from_value(json!({"metadata": meta, "spec": spec})).unwrap()
    }

    #[test]
    fn affinity_is_matched_against_labels_not_names() {
        let nodes = [node("node-a", "a.example.com"), node("node-b", "b.example.com")];
        let by_label = pv(
            json!({}),
            Some(json!({"key": "kubernetes.io/hostname", "operator": "In", "values": ["b.example.com"]})),
        );
        assert_eq!(place(&by_label, &nodes), Placement::Node("node-b".into()));
        let gone = pv(
            json!({}),
            Some(json!({"key": "kubernetes.io/hostname", "operator": "In", "values": ["c"]})),
        );
        assert!(
            matches!(place(&gone, &nodes), Placement::Missing(why) if why.contains("kubernetes.io/hostname In [c]"))
        );
        let wide = pv(
            json!({}),
            Some(json!({"key": "kubernetes.io/hostname", "operator": "Exists"})),
        );
        assert_eq!(
            place(&wide, &nodes),
            Placement::Several(vec!["node-a".into(), "node-b".into()])
        );
    }

    #[test]
    fn without_affinity_the_provisioners_annotations_name_the_node() {
        let nodes = [node("node-a", "node-a")];
        let legacy = pv(json!({"annotations": {"kubevirt.io/provisionOnNode": "node-a"}}), None);
        assert_eq!(place(&legacy, &nodes), Placement::Node("node-a".into()));
        let lpp = pv(
            json!({"annotations": {"local.path.provisioner/selected-node": "node-z"}}),
            None,
        );
        assert!(matches!(place(&lpp, &nodes), Placement::Missing(why) if why.contains("node-z")));
        // A shared local-path volume records an empty node.
        let shared = pv(
            json!({"annotations": {"local.path.provisioner/selected-node": ""}}),
            None,
        );
        assert_eq!(place(&shared, &nodes), Placement::Unpinned);
        let single = pv(json!({"annotations": {"hostPathProvisionerIdentity": "node-a"}}), None);
        assert_eq!(place(&single, &nodes), Placement::Node("node-a".into()));
        let torchbox = pv(
            json!({"annotations": {"hostPathProvisionerIdentity": "torchbox.com/hostpath"}}),
            None,
        );
        assert_eq!(place(&torchbox, &nodes), Placement::Unpinned);
    }
}
