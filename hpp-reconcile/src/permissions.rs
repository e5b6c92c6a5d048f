//! The RBAC an operator needs, derived from what it runs: the framework's own calls (its CRs,
//! Events, the facts of every pass), and per step what the controller does with its
//! [`kinds`](crate::SubReconciler::kinds) (watch, sweep, create), what it reads through
//! [`watches`](crate::SubReconciler::watches) and [`indexes`](crate::SubReconciler::indexes),
//! and what the step declares in [`permissions`](crate::SubReconciler::permissions) (its
//! writes, narrowed by name where it can be, and what `gather`, `apply` and `act` call).
//!
//! [`OperatorRules`] merges them into the rules of one ClusterRole and one Role (in the
//! operator's namespace), each rule commented with why it is there, and renders them as YAML
//! (`hpp-operator render --rbac`); [`OperatorRules::cluster_rules`] and
//! [`OperatorRules::namespace_rules`] give them as `PolicyRule`s, e.g. for
//! `hpp_testkit::RbacPolicy`, which makes the fake API server answer 403 to anything else.

use std::collections::BTreeSet;

use k8s_openapi::api::rbac::v1::PolicyRule;

use crate::facts::ClusterFacts;
use crate::gather;
use crate::object::Kind;
use crate::pipeline::Pipeline;

/// Reading: what a watch (list, watch) and a lookup (get) need.
pub const READ: [&str; 3] = ["get", "list", "watch"];
/// Writing an owned object: server-side apply (patch) and deletion (sweep, cleanup).
pub const WRITE: [&str; 2] = ["patch", "delete"];

/// Verbs in the order rules list them; others follow alphabetically.
const VERB_ORDER: [&str; 11] = [
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
    "escalate",
    "bind",
    "impersonate",
];

/// Where a rule applies: the ClusterRole (every namespace and cluster-scoped kinds) or the
/// Role in the operator's namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// The ClusterRole: cluster-scoped kinds, and namespaced kinds in every namespace.
    Cluster,
    /// The Role in the operator's namespace.
    Namespace,
}

/// One rule the operator's RBAC must grant, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Permission {
    /// ClusterRole or Role.
    pub scope: Scope,
    /// API group (`""` for core).
    pub group: String,
    /// Resources (plurals, or `plural/subresource`).
    pub resources: Vec<String>,
    /// Verbs, in the order get, list, watch, create, update, patch, delete, then the rest.
    pub verbs: Vec<String>,
    /// `resourceNames`; empty for any name.
    pub names: Vec<String>,
    /// Why the operator needs it; rendered as comments above the rule.
    pub reasons: Vec<String>,
}

impl Permission {
    /// `verbs` on objects of `kind`: in the operator's namespace for a namespaced kind (the
    /// Role), cluster-wide otherwise (the ClusterRole).
    pub fn on(kind: &Kind, verbs: &[&str]) -> Self {
        let scope = if kind.namespaced {
            Scope::Namespace
        } else {
            Scope::Cluster
        };
        Self::resource(&kind.group, &kind.plural, scope, verbs)
    }

    /// `verbs` on a resource named by hand (a subresource such as `hostpathprovisioners/status`,
    /// or a kind without a [`Kind`]).
    pub fn resource(group: &str, resource: &str, scope: Scope, verbs: &[&str]) -> Self {
        Permission {
            scope,
            group: group.to_owned(),
            resources: vec![resource.to_owned()],
            verbs: sorted_verbs(verbs.iter().map(|v| (*v).to_owned())),
            names: Vec::new(),
            reasons: Vec::new(),
        }
    }

    /// In every namespace (the ClusterRole), for a namespaced kind whose objects live anywhere
    /// (users' claims).
    pub fn cluster_wide(mut self) -> Self {
        self.scope = Scope::Cluster;
        self
    }

    /// Only on objects of these names (`resourceNames`). Kubernetes cannot narrow `create`,
    /// `list` or `watch` by name: put those in a rule of their own.
    pub fn named<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        push_unique(&mut self.names, names.into_iter().map(Into::into));
        self
    }

    /// Why the rule is needed (a comment above it in the rendered RBAC).
    pub fn because(mut self, reason: impl Into<String>) -> Self {
        push_unique(&mut self.reasons, [reason.into()]);
        self
    }

    /// The rule as a Kubernetes `PolicyRule`.
    pub fn to_policy_rule(&self) -> PolicyRule {
        PolicyRule {
            api_groups: Some(vec![self.group.clone()]),
            resources: Some(self.resources.clone()),
            verbs: self.verbs.clone(),
            resource_names: (!self.names.is_empty()).then(|| self.names.clone()),
            non_resource_urls: None,
        }
    }

    /// Whether every verb is a read or `create` (the rules derived from kinds and watches).
    fn reads_or_creates(&self) -> bool {
        self.verbs.iter().all(|v| READ.contains(&v.as_str()) || v == "create")
    }
}

fn sorted_verbs(verbs: impl IntoIterator<Item = String>) -> Vec<String> {
    let set: BTreeSet<String> = verbs.into_iter().collect();
    let mut out: Vec<String> = set.into_iter().collect();
    out.sort_by_key(|v| {
        (
            VERB_ORDER.iter().position(|o| o == v).unwrap_or(VERB_ORDER.len()),
            v.clone(),
        )
    });
    out
}

fn push_unique(to: &mut Vec<String>, items: impl IntoIterator<Item = String>) {
    for item in items {
        if !to.contains(&item) {
            to.push(item);
        }
    }
}

fn same_set(a: &[String], b: &[String]) -> bool {
    a.len() == b.len() && a.iter().all(|x| b.contains(x))
}

/// What every operator built on this framework calls, whatever its steps: its CRs (watched;
/// the finalizer, status and owner references), Events, and the facts gathered every pass.
pub fn framework() -> Vec<Permission> {
    const GROUP: &str = "hostpathprovisioner.kubevirt.io";
    let mut out = vec![
        Permission::resource(GROUP, "hostpathprovisioners", Scope::Cluster, &["get", "list", "watch", "patch", "update"])
            .because("The CR: watched; the finalizer (patch), and status written through the object where the CRD has no status subresource (update), as KubeVirt's operator writes it."),
        Permission::resource(GROUP, "hostpathprovisioners/status", Scope::Cluster, &["get", "patch", "update"])
            .because("The CR's status."),
        Permission::resource(GROUP, "hostpathprovisioners/finalizers", Scope::Cluster, &["update"])
            .because("Owner references to the CR with blockOwnerDeletion."),
    ];
    for group in ["", "events.k8s.io"] {
        out.push(
            Permission::resource(group, "events", Scope::Cluster, &["create", "patch"]).because(
                "Events: about the cluster-scoped CR in the default namespace, about owned objects in theirs \
                 (core/v1 is the fallback when events.k8s.io is forbidden, as with KubeVirt's RBAC).",
            ),
        );
    }
    for (kind, _selector) in gather::fact_sources() {
        out.push(Permission::on(&kind, &READ).because(
            "Facts every pass reads: nodes (placement), pool objects, and for the pool status \
             PersistentVolumes, StorageClasses and the capacity the driver publishes.",
        ));
    }
    out
}

impl Pipeline {
    /// What the steps need, for the cluster `facts` describes (pass facts with every optional
    /// API, e.g. `ClusterFacts::offline(&[], true, true)`, for RBAC that works on any cluster):
    /// per step, `get`, `list`, `watch` and `create` on every kind of
    /// [`kinds`](crate::SubReconciler::kinds) (the controller watches and sweeps them; `create`
    /// cannot be narrowed by name anyway), what the step declares in
    /// [`permissions`](crate::SubReconciler::permissions), and `get`, `list`, `watch` on what
    /// it [`watches`](crate::SubReconciler::watches) or [`indexes`](crate::SubReconciler::indexes).
    pub fn permissions(&self, facts: &ClusterFacts) -> Vec<Permission> {
        let mut out = Vec::new();
        for step in self.steps() {
            let name = step.name();
            for kind in step.kinds(facts) {
                out.push(
                    Permission::on(&kind, &["get", "list", "watch", "create"])
                        .because(format!("{name}: owns {} (watched, swept, created).", kind.plural)),
                );
            }
            out.extend(step.permissions(facts));
            let read = step
                .watches()
                .into_iter()
                .chain(step.indexes().into_iter().map(|(kind, selector, _)| (kind, selector)));
            for (kind, _selector) in read {
                out.push(Permission::on(&kind, &READ).because(format!("{name}: reads {} (watched).", kind.plural)));
            }
        }
        out
    }
}

/// The rules of an operator's ClusterRole and Role, merged: rules that only read or create
/// are folded together per resource, declared rules with the same verbs share a rule (their
/// names and resources united), and each keeps the reasons of what it was merged from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OperatorRules {
    rules: Vec<Permission>,
}

impl OperatorRules {
    /// Merges `permissions` (e.g. [`framework`] followed by [`Pipeline::permissions`] and
    /// whatever the executable itself calls, such as its leader election Lease).
    pub fn new(permissions: impl IntoIterator<Item = Permission>) -> Self {
        let mut rules: Vec<Permission> = permissions
            .into_iter()
            .filter(|p| !p.verbs.is_empty() && !p.resources.is_empty())
            .map(|mut p| {
                p.verbs = sorted_verbs(p.verbs);
                p
            })
            .collect();
        while merge_once(&mut rules) {}
        OperatorRules { rules }
    }

    /// The standard operator's rules: [`framework`] and `pipeline`'s, for a cluster with every
    /// optional API (OpenShift SCCs, the Prometheus Operator).
    pub fn for_pipeline(pipeline: &Pipeline) -> Self {
        let facts = ClusterFacts::offline(&[], true, true);
        Self::new(framework().into_iter().chain(pipeline.permissions(&facts)))
    }

    /// This set with more permissions (merged in).
    pub fn with(self, more: impl IntoIterator<Item = Permission>) -> Self {
        Self::new(self.rules.into_iter().chain(more))
    }

    /// Every rule, ClusterRole's first.
    pub fn rules(&self) -> impl Iterator<Item = &Permission> {
        self.of(Scope::Cluster).chain(self.of(Scope::Namespace))
    }

    fn of(&self, scope: Scope) -> impl Iterator<Item = &Permission> {
        self.rules.iter().filter(move |p| p.scope == scope)
    }

    /// The ClusterRole's rules.
    pub fn cluster_rules(&self) -> Vec<PolicyRule> {
        self.of(Scope::Cluster).map(Permission::to_policy_rule).collect()
    }

    /// The Role's rules (in the operator's namespace).
    pub fn namespace_rules(&self) -> Vec<PolicyRule> {
        self.of(Scope::Namespace).map(Permission::to_policy_rule).collect()
    }

    /// The operator's RBAC as a YAML stream: a ServiceAccount `name` in `namespace`, a
    /// ClusterRole and a Role `name` with these rules (each under comments saying why), and
    /// their bindings to the ServiceAccount; `header` (comment lines without `#`) goes first.
    pub fn to_yaml(&self, name: &str, namespace: &str, header: &str) -> String {
        let q = |s: &str| serde_json::Value::String(s.to_owned()).to_string();
        let (name_q, ns_q) = (q(name), q(namespace));
        let mut out = String::new();
        for line in header.lines() {
            out.push_str(if line.is_empty() { "#" } else { "# " });
            out.push_str(line);
            out.push('\n');
        }
        let meta = |namespaced: bool| {
            let ns = if namespaced {
                format!("  namespace: {ns_q}\n")
            } else {
                String::new()
            };
            format!("metadata:\n  name: {name_q}\n{ns}  labels:\n    name: {name_q}\n")
        };
        let binding = |role_kind: &str| {
            format!(
                "roleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: {role_kind}\n  name: {name_q}\n\
                 subjects:\n  - kind: ServiceAccount\n    name: {name_q}\n    namespace: {ns_q}\n",
            )
        };
        out.push_str(&format!("apiVersion: v1\nkind: ServiceAccount\n{}", meta(true)));
        out.push_str("---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\n");
        out.push_str(&meta(false));
        out.push_str(&rules_yaml(self.of(Scope::Cluster)));
        out.push_str("---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\n");
        out.push_str(&meta(false));
        out.push_str(&binding("ClusterRole"));
        out.push_str("---\napiVersion: rbac.authorization.k8s.io/v1\nkind: Role\n");
        out.push_str(&meta(true));
        out.push_str(&rules_yaml(self.of(Scope::Namespace)));
        out.push_str("---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\n");
        out.push_str(&meta(true));
        out.push_str(&binding("Role"));
        out
    }
}

/// `rules:` and one commented entry per rule.
fn rules_yaml<'a>(rules: impl Iterator<Item = &'a Permission>) -> String {
    let list = |items: &[String]| {
        let quoted: Vec<String> = items
            .iter()
            .map(|s| serde_json::Value::String(s.clone()).to_string())
            .collect();
        format!("[{}]", quoted.join(", "))
    };
    let mut out = String::from("rules:\n");
    let mut said: &[String] = &[];
    for rule in rules {
        // Consecutive rules for the same reasons share one comment.
        let reasons = if rule.reasons == said {
            &[][..]
        } else {
            &rule.reasons[..]
        };
        said = &rule.reasons;
        for reason in reasons {
            for line in wrap(reason, 96) {
                out.push_str("  # ");
                out.push_str(&line);
                out.push('\n');
            }
        }
        out.push_str(&format!("  - apiGroups: {}\n", list(std::slice::from_ref(&rule.group))));
        out.push_str(&format!("    resources: {}\n", list(&rule.resources)));
        out.push_str(&format!("    verbs: {}\n", list(&rule.verbs)));
        if !rule.names.is_empty() {
            out.push_str(&format!("    resourceNames: {}\n", list(&rule.names)));
        }
    }
    out
}

/// `text` in lines of at most `width` characters (longer words stay whole).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

/// Whether `a` grants everything `b` does (same scope and group checked by the caller).
fn covering(a: &Permission, b: &Permission) -> bool {
    let subset = |x: &[String], y: &[String]| x.iter().all(|v| y.contains(v));
    subset(&b.resources, &a.resources)
        && subset(&b.verbs, &a.verbs)
        && (a.names.is_empty() || (!b.names.is_empty() && subset(&b.names, &a.names)))
}

/// One merge of two rules, if any two can be merged; the later one is folded into the earlier.
fn merge_once(rules: &mut Vec<Permission>) -> bool {
    for i in 0..rules.len() {
        for j in i + 1..rules.len() {
            let (a, b) = (&rules[i], &rules[j]);
            if a.scope != b.scope || a.group != b.group {
                continue;
            }
            // A rule another grants entirely: gone, its reasons kept with the other.
            if let Some((keep, drop)) = covering(a, b).then_some((i, j)).or(covering(b, a).then_some((j, i))) {
                let dropped = rules.remove(drop);
                let keep = if drop < keep { keep - 1 } else { keep };
                push_unique(&mut rules[keep].reasons, dropped.reasons);
                return true;
            }
            let same_resources = same_set(&a.resources, &b.resources);
            let same_names = same_set(&a.names, &b.names);
            let same_verbs = same_set(&a.verbs, &b.verbs);
            // Reads and creates of one resource: one rule with every such verb.
            let verbs = same_resources && same_names && a.reads_or_creates() && b.reads_or_creates();
            // The same writes on the same resources for different names: one rule, names united.
            let names = same_resources && same_verbs && !a.names.is_empty() && !b.names.is_empty();
            // The same verbs on the same names: one rule, resources united.
            let resources = same_verbs && same_names;
            if !(verbs || names || resources) {
                continue;
            }
            let b = rules.remove(j);
            let a = &mut rules[i];
            if verbs {
                a.verbs = sorted_verbs(a.verbs.drain(..).chain(b.verbs));
            }
            if names {
                push_unique(&mut a.names, b.names);
            }
            if resources {
                push_unique(&mut a.resources, b.resources);
            }
            push_unique(&mut a.reasons, b.reasons);
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
    use k8s_openapi::api::core::v1::{ConfigMap, Node};

    fn strs(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }

    fn rule(p: &Permission) -> (Scope, &str, Vec<&str>, Vec<&str>, Vec<&str>) {
        (
            p.scope,
            p.group.as_str(),
            strs(&p.resources),
            strs(&p.verbs),
            strs(&p.names),
        )
    }

    #[test]
    fn reads_fold_together_declared_writes_share_rules_and_keep_their_reasons() {
        let ds = Kind::of::<DaemonSet>();
        let dep = Kind::of::<Deployment>();
        let rules = OperatorRules::new([
            Permission::on(&ds, &["get", "list", "watch", "create"]).because("a owns daemonsets"),
            Permission::on(&ds, &["watch", "get"]).because("b reads daemonsets"),
            Permission::on(&dep, &["create", "get", "list", "watch"]).because("c owns deployments"),
            Permission::on(&ds, &WRITE)
                .named(["a"])
                .because("a writes its DaemonSet"),
            Permission::on(&ds, &WRITE)
                .named(["b"])
                .because("b writes its DaemonSet"),
            Permission::on(&dep, &WRITE).because("c writes deployments of any name"),
            Permission::on(&Kind::of::<Node>(), &READ).because("facts"),
        ]);
        let all: Vec<_> = rules.rules().map(rule).collect();
        assert_eq!(
            all,
            [
                (Scope::Cluster, "", vec!["nodes"], vec!["get", "list", "watch"], vec![]),
                (
                    Scope::Namespace,
                    "apps",
                    vec!["daemonsets", "deployments"],
                    vec!["get", "list", "watch", "create"],
                    vec![]
                ),
                (
                    Scope::Namespace,
                    "apps",
                    vec!["daemonsets"],
                    vec!["patch", "delete"],
                    vec!["a", "b"]
                ),
                (
                    Scope::Namespace,
                    "apps",
                    vec!["deployments"],
                    vec!["patch", "delete"],
                    vec![]
                ),
            ]
        );
        let reasons: Vec<&Vec<String>> = rules.rules().map(|p| &p.reasons).collect();
        assert_eq!(
            reasons[1],
            &["a owns daemonsets", "b reads daemonsets", "c owns deployments"]
        );
        assert_eq!(reasons[2], &["a writes its DaemonSet", "b writes its DaemonSet"]);
    }

    #[test]
    fn a_rule_another_grants_entirely_goes_and_leaves_its_reason() {
        let cm = Kind::of::<ConfigMap>();
        let rules = OperatorRules::new([
            Permission::on(&cm, &["get", "list", "watch", "patch"]).because("owner"),
            Permission::on(&cm, &["list"]).because("lister"),
            Permission::on(&cm, &["patch"]).named(["x"]).because("named patch"),
        ]);
        let all: Vec<_> = rules.rules().map(rule).collect();
        assert_eq!(
            all,
            [(
                Scope::Namespace,
                "",
                vec!["configmaps"],
                vec!["get", "list", "watch", "patch"],
                vec![]
            )]
        );
        assert_eq!(
            rules.rules().next().unwrap().reasons,
            ["owner", "lister", "named patch"]
        );
        // A named rule does not cover an unnamed one.
        let rules = OperatorRules::new([
            Permission::on(&cm, &["patch"]).named(["x"]),
            Permission::on(&cm, &["patch"]),
        ]);
        assert_eq!(rules.rules().count(), 1);
        assert!(rules.rules().next().unwrap().names.is_empty());
    }

    #[test]
    fn a_write_never_merges_into_a_read_rule() {
        let cm = Kind::of::<ConfigMap>();
        let rules = OperatorRules::new([
            Permission::on(&cm, &READ).because("read"),
            Permission::on(&cm, &["delete"]).cluster_wide().because("act"),
            Permission::on(&cm, &["delete"]).because("sweep"),
        ]);
        let all: Vec<_> = rules.rules().map(rule).collect();
        assert_eq!(
            all,
            [
                (Scope::Cluster, "", vec!["configmaps"], vec!["delete"], vec![]),
                (
                    Scope::Namespace,
                    "",
                    vec!["configmaps"],
                    vec!["get", "list", "watch"],
                    vec![]
                ),
                (Scope::Namespace, "", vec!["configmaps"], vec!["delete"], vec![]),
            ]
        );
    }

    #[test]
    fn the_yaml_is_five_objects_with_commented_rules() {
        let rules = OperatorRules::new([
            Permission::on(&Kind::of::<Node>(), &READ).because("Pools follow nodes."),
            Permission::on(&Kind::of::<ConfigMap>(), &WRITE)
                .named(["settings"])
                .because("x ".repeat(60)),
        ]);
        let yaml = rules.to_yaml("my-operator", "my-ns", "My operator's RBAC.\n\nGenerated.");
        assert!(
            yaml.starts_with("# My operator's RBAC.\n#\n# Generated.\napiVersion: v1\n"),
            "{yaml}"
        );
        assert!(yaml.contains("  # Pools follow nodes.\n  - apiGroups: [\"\"]\n    resources: [\"nodes\"]\n"));
        assert!(yaml.contains("    resourceNames: [\"settings\"]\n"));
        assert!(yaml.lines().all(|l| l.len() <= 100), "comments are wrapped");
        let docs: Vec<serde_json::Value> = serde_saphyr::from_str_multiple(&yaml).unwrap();
        let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "ServiceAccount",
                "ClusterRole",
                "ClusterRoleBinding",
                "Role",
                "RoleBinding"
            ]
        );
        let role: k8s_openapi::api::rbac::v1::Role = serde_json::from_value(docs[3].clone()).unwrap();
        assert_eq!(role.metadata.namespace.as_deref(), Some("my-ns"));
        assert_eq!(role.rules.unwrap(), rules.namespace_rules());
        let binding: k8s_openapi::api::rbac::v1::ClusterRoleBinding = serde_json::from_value(docs[2].clone()).unwrap();
        assert_eq!(binding.role_ref.name, "my-operator");
        assert_eq!(binding.subjects.unwrap()[0].namespace.as_deref(), Some("my-ns"));
    }
}
