//! Required node affinity, evaluated the way the scheduler does, so the operator prepares pool
//! PVCs and mounters on exactly the nodes where the CSI DaemonSet (placed by the CR's
//! `workload.affinity`) runs. Preferred terms only rank nodes and are ignored here.

use k8s_openapi::api::core::v1::{Affinity, NodeSelectorRequirement, NodeSelectorTerm};

use crate::facts::NodeFact;

/// Whether `node` satisfies the required node affinity of `affinity` (true when there is none).
pub fn required_affinity_matches(affinity: Option<&Affinity>, node: &NodeFact) -> bool {
    let Some(selector) = affinity
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| na.required_during_scheduling_ignored_during_execution.as_ref())
    else {
        return true;
    };
    // Terms are ORed; an empty list matches no node, as in the scheduler.
    selector.node_selector_terms.iter().any(|term| term_matches(term, node))
}

/// A term matches when all its requirements do; a term with no requirements matches nothing.
fn term_matches(term: &NodeSelectorTerm, node: &NodeFact) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    expressions
        .iter()
        .all(|r| requirement_matches(r, node.labels.get(&r.key).map(String::as_str)))
        && fields.iter().all(|r| {
            // metadata.name is the only field the scheduler supports.
            r.key == "metadata.name" && requirement_matches(r, Some(node.name.as_str()))
        })
}

/// Labels that make a node satisfy the first required term of `affinity` (as far as labels can):
/// `render` uses them so the nodes a user names are treated as nodes the DaemonSet runs on.
pub fn labels_satisfying(affinity: Option<&Affinity>) -> Vec<(String, String)> {
    let term = affinity
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| na.required_during_scheduling_ignored_during_execution.as_ref())
        .and_then(|s| s.node_selector_terms.first());
    let first = |r: &NodeSelectorRequirement| r.values.as_deref().unwrap_or_default().first().cloned();
    let shifted = |r: &NodeSelectorRequirement, by: i64| {
        first(r)
            .and_then(|b| b.parse::<i64>().ok())
            .map(|b| (b + by).to_string())
    };
    term.and_then(|t| t.match_expressions.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|r| {
            let value = match r.operator.as_str() {
                "In" => first(r),
                "Exists" => Some("true".to_owned()),
                "Gt" => shifted(r, 1),
                "Lt" => shifted(r, -1),
                // NotIn and DoesNotExist hold for a label that is absent.
                _ => None,
            };
            value.map(|v| (r.key.clone(), v))
        })
        .collect()
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let number = |v: &str| v.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(actual), Some(bound)) = (value.and_then(number), values.first().and_then(|b| number(b))) else {
                return false;
            };
            if r.operator == "Gt" {
                actual > bound
            } else {
                actual < bound
            }
        }
        // An operator the scheduler does not know never matches.
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeAffinity, NodeSelector};

    fn node(name: &str, labels: &[(&str, &str)]) -> NodeFact {
        let mut n = NodeFact::ready(name);
        n.labels = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        n
    }

    fn req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: Some(values.iter().map(|v| v.to_string()).collect()),
        }
    }

    fn affinity(terms: Vec<NodeSelectorTerm>) -> Affinity {
        Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: terms,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn exprs(list: Vec<NodeSelectorRequirement>) -> NodeSelectorTerm {
        NodeSelectorTerm {
            match_expressions: Some(list),
            match_fields: None,
        }
    }

    #[test]
    fn no_affinity_matches_every_node() {
        assert!(required_affinity_matches(None, &node("a", &[])));
        assert!(required_affinity_matches(Some(&Affinity::default()), &node("a", &[])));
    }

    #[test]
    fn operators() {
        let n = node("a", &[("disk", "ssd"), ("cores", "8")]);
        let check = |r| required_affinity_matches(Some(&affinity(vec![exprs(vec![r])])), &n);
        assert!(check(req("disk", "In", &["ssd", "nvme"])));
        assert!(!check(req("disk", "In", &["hdd"])));
        assert!(check(req("disk", "NotIn", &["hdd"])));
        assert!(check(req("zone", "NotIn", &["x"])), "NotIn matches a missing label");
        assert!(check(req("disk", "Exists", &[])));
        assert!(!check(req("zone", "Exists", &[])));
        assert!(check(req("zone", "DoesNotExist", &[])));
        assert!(check(req("cores", "Gt", &["4"])));
        assert!(!check(req("cores", "Lt", &["4"])));
        assert!(!check(req("disk", "Gt", &["4"])), "non-numeric values never match Gt");
        assert!(!check(req("disk", "Sideways", &["ssd"])));
    }

    #[test]
    fn terms_are_ored_and_requirements_anded() {
        let n = node("a", &[("disk", "ssd")]);
        let both = exprs(vec![req("disk", "In", &["ssd"]), req("zone", "Exists", &[])]);
        assert!(!required_affinity_matches(Some(&affinity(vec![both.clone()])), &n));
        let either = vec![both, exprs(vec![req("disk", "Exists", &[])])];
        assert!(required_affinity_matches(Some(&affinity(either)), &n));
        assert!(
            !required_affinity_matches(Some(&affinity(vec![])), &n),
            "no terms, no node"
        );
        assert!(
            !required_affinity_matches(Some(&affinity(vec![exprs(vec![])])), &n),
            "empty term"
        );
    }

    #[test]
    fn labels_satisfying_the_first_term_make_a_node_match() {
        let a = affinity(vec![exprs(vec![
            req("disk", "In", &["ssd"]),
            req("gpu", "Exists", &[]),
            req("cores", "Gt", &["4"]),
            req("mem", "Lt", &["64"]),
            req("zone", "NotIn", &["bad"]),
        ])]);
        let mut n = node("a", &[]);
        assert!(!required_affinity_matches(Some(&a), &n));
        n.labels.extend(labels_satisfying(Some(&a)));
        assert!(required_affinity_matches(Some(&a), &n), "{:?}", n.labels);
        assert!(labels_satisfying(None).is_empty());
    }

    #[test]
    fn match_fields_on_the_node_name() {
        let term = NodeSelectorTerm {
            match_expressions: None,
            match_fields: Some(vec![req("metadata.name", "In", &["node01"])]),
        };
        let a = affinity(vec![term]);
        assert!(required_affinity_matches(Some(&a), &node("node01", &[])));
        assert!(!required_affinity_matches(Some(&a), &node("node02", &[])));
    }
}
