//! Offline rendering: every object the operator would own for a CR, as a YAML stream (for
//! GitOps review and diffs). Pure: no API calls.

use hpp_api::HostPathProvisioner;

use crate::config::OperatorConfig;
use crate::error::{Error, Result};
use crate::facts::ClusterFacts;
use crate::object::DesiredObject;
use crate::pipeline::Pipeline;

/// Every desired object, in pipeline order.
pub fn render_objects(
    pipeline: &Pipeline,
    hpp: &HostPathProvisioner,
    cfg: &OperatorConfig,
    facts: &ClusterFacts,
) -> Result<Vec<DesiredObject>> {
    Ok(pipeline
        .desired(hpp, cfg, facts)?
        .into_iter()
        .flat_map(|(_, objs)| objs)
        .collect())
}

/// The desired objects as a multi-document YAML stream.
pub fn render_yaml(
    pipeline: &Pipeline,
    hpp: &HostPathProvisioner,
    cfg: &OperatorConfig,
    facts: &ClusterFacts,
) -> Result<String> {
    let mut out = String::new();
    for obj in render_objects(pipeline, hpp, cfg, facts)? {
        let doc = serde_saphyr::to_string(&obj.to_value()?)
            .map_err(|e| Error::InvalidSpec(format!("cannot render {}: {e}", obj.key())))?;
        out.push_str("---\n");
        out.push_str(&doc);
        if !doc.ends_with('\n') {
            out.push('\n');
        }
    }
    Ok(out)
}

/// Facts for rendering offline: the named nodes are Ready and match the CR's `workload`
/// nodeSelector and required node affinity (they are the nodes the operator would prepare).
pub fn offline_facts(hpp: &HostPathProvisioner, nodes: &[String], has_scc: bool, has_prometheus: bool) -> ClusterFacts {
    let mut facts = ClusterFacts::offline(nodes, has_scc, has_prometheus);
    let selector = hpp
        .spec
        .workload
        .as_ref()
        .and_then(|w| w.node_selector.clone())
        .unwrap_or_default();
    let affinity = hpp.spec.workload.as_ref().and_then(|w| w.affinity.as_ref());
    let affinity_labels = crate::reconcilers::node_affinity::labels_satisfying(affinity);
    for node in &mut facts.nodes {
        node.labels.extend(selector.clone());
        node.labels.extend(affinity_labels.iter().cloned());
    }
    facts
}
