//! RBAC enforcement: with a policy set ([`FakeApiServer::enforce_rbac`](crate::FakeApiServer::enforce_rbac)),
//! a request the policy does not allow is answered 403 Forbidden, with the real API server's
//! message, so a test fails where the cluster would refuse the call.

use std::collections::BTreeMap;

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use serde_json::Value;

use super::error::ApiError;
use super::path::{Route, parse_query, route};

/// What a request asks to do, as the API server's authorizer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete` or `deletecollection`.
    pub verb: String,
    /// API group (`""` for core).
    pub group: String,
    /// Resource plural, with `/subresource` when there is one (`hostpathprovisioners/status`).
    pub resource: String,
    /// Namespace of the request; `None` for cluster-scoped kinds and requests across
    /// namespaces.
    pub namespace: Option<String>,
    /// Object name; `None` for collections (list, watch, create, deletecollection).
    pub name: Option<String>,
}

impl Access {
    /// `verb` on `group`/`resource`, cluster-wide and of no particular name; narrow it with
    /// [`in_namespace`](Self::in_namespace) and [`named`](Self::named).
    pub fn new(verb: &str, group: &str, resource: &str) -> Self {
        Self {
            verb: verb.to_owned(),
            group: group.to_owned(),
            resource: resource.to_owned(),
            namespace: None,
            name: None,
        }
    }

    /// In this namespace.
    pub fn in_namespace(mut self, namespace: &str) -> Self {
        self.namespace = Some(namespace.to_owned());
        self
    }

    /// Of the object with this name.
    pub fn named(mut self, name: &str) -> Self {
        self.name = Some(name.to_owned());
        self
    }
}

/// A policy read from RBAC YAML was not usable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError(String);

impl std::fmt::Display for PolicyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PolicyError {}

/// The RBAC rules the fake's clients hold, as if bound to them: a ClusterRole's rules (every
/// namespace and cluster-scoped kinds) and Roles' rules (one namespace each). Rules match as
/// the API server's RBAC authorizer matches them: `*` in verbs, groups and resources,
/// `*/subresource`, and `resourceNames` (which never match a request without a name: list,
/// watch, create). Discovery (`/api`, `/apis`, `/version`) is always allowed, as the
/// `system:discovery` role allows it on a real cluster.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RbacPolicy {
    user: Option<String>,
    cluster: Vec<PolicyRule>,
    namespaced: BTreeMap<String, Vec<PolicyRule>>,
}

impl RbacPolicy {
    /// A policy that allows nothing but discovery.
    pub fn new() -> Self {
        Self::default()
    }

    /// The user named in 403 messages (default `system:serviceaccount:default:default`).
    pub fn user(mut self, user: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self
    }

    /// Adds rules of a ClusterRole bound with a ClusterRoleBinding: they apply everywhere.
    pub fn cluster_rules(mut self, rules: impl IntoIterator<Item = PolicyRule>) -> Self {
        self.cluster.extend(rules);
        self
    }

    /// Adds rules of a Role bound in `namespace`: they apply to requests in it.
    pub fn namespace_rules(mut self, namespace: &str, rules: impl IntoIterator<Item = PolicyRule>) -> Self {
        self.namespaced.entry(namespace.to_owned()).or_default().extend(rules);
        self
    }

    /// The rules of every ClusterRole and Role in a YAML stream (other documents, bindings
    /// included, are skipped: every role is taken as bound to the client), e.g. the RBAC a
    /// project ships for its operator.
    pub fn from_yaml(text: &str) -> Result<Self, PolicyError> {
        let docs: Vec<Value> =
            serde_saphyr::from_str_multiple(text).map_err(|e| PolicyError(format!("RBAC YAML does not parse: {e}")))?;
        let mut policy = Self::new();
        for doc in docs {
            match doc.get("kind").and_then(Value::as_str) {
                Some("ClusterRole") => {
                    let role: ClusterRole = serde_json::from_value(doc)
                        .map_err(|e| PolicyError(format!("a ClusterRole does not parse: {e}")))?;
                    policy = policy.cluster_rules(role.rules.unwrap_or_default());
                }
                Some("Role") => {
                    let role: Role =
                        serde_json::from_value(doc).map_err(|e| PolicyError(format!("a Role does not parse: {e}")))?;
                    let namespace = role.metadata.namespace.clone().ok_or_else(|| {
                        PolicyError(format!(
                            "Role {} has no namespace",
                            role.metadata.name.as_deref().unwrap_or_default()
                        ))
                    })?;
                    policy = policy.namespace_rules(&namespace, role.rules.unwrap_or_default());
                }
                _ => {}
            }
        }
        Ok(policy)
    }

    /// Whether the policy allows `access`.
    pub fn allows(&self, access: &Access) -> bool {
        let namespaced = access
            .namespace
            .as_ref()
            .and_then(|ns| self.namespaced.get(ns))
            .into_iter()
            .flatten();
        self.cluster
            .iter()
            .chain(namespaced)
            .any(|rule| rule_allows(rule, access))
    }

    /// The 403 answer to `access`, worded as the API server words it.
    pub(crate) fn forbidden(&self, access: &Access) -> ApiError {
        let user = self.user.as_deref().unwrap_or("system:serviceaccount:default:default");
        let (plural, _) = access
            .resource
            .split_once('/')
            .unwrap_or((access.resource.as_str(), ""));
        let group_resource = if access.group.is_empty() {
            plural.to_owned()
        } else {
            format!("{plural}.{}", access.group)
        };
        let subject = match &access.name {
            Some(name) => format!("{group_resource} \"{name}\""),
            None => group_resource,
        };
        let scope = match &access.namespace {
            Some(ns) => format!("in the namespace \"{ns}\""),
            None => "at the cluster scope".to_owned(),
        };
        ApiError::forbidden(
            format!(
                "{subject} is forbidden: User \"{user}\" cannot {} resource \"{}\" in API group \"{}\" {scope}",
                access.verb, access.resource, access.group
            ),
            (
                access.group.clone(),
                plural.to_owned(),
                access.name.clone().unwrap_or_default(),
            ),
        )
    }
}

/// What a request to `path` asks, or `None` for discovery and paths that name no resource.
pub(crate) fn access_of(
    method: &http::Method,
    path: &str,
    query: &str,
    namespaced: impl Fn(&str, &str, &str) -> bool,
) -> Option<Access> {
    let Route::Object(p) = route(path, namespaced) else {
        return None;
    };
    let watch = parse_query(query).get("watch").is_some_and(|w| w == "true" || w == "1");
    let verb = match (method, p.name.is_some()) {
        (&http::Method::GET, true) => "get",
        (&http::Method::GET, false) if watch => "watch",
        (&http::Method::GET, false) => "list",
        (&http::Method::POST, _) => "create",
        (&http::Method::PUT, _) => "update",
        (&http::Method::PATCH, _) => "patch",
        (&http::Method::DELETE, true) => "delete",
        (&http::Method::DELETE, false) => "deletecollection",
        _ => return None,
    };
    let resource = match &p.subresource {
        Some(sub) => format!("{}/{sub}", p.plural),
        None => p.plural.clone(),
    };
    // A Namespace object is authorized in its own namespace, as the API server does.
    let namespace = match (&p.namespace, p.group.is_empty() && p.plural == "namespaces") {
        (None, true) => p.name.clone(),
        (ns, _) => ns.clone(),
    };
    Some(Access {
        verb: verb.to_owned(),
        group: p.group,
        resource,
        namespace,
        name: p.name,
    })
}

/// Whether one rule allows the access (Kubernetes' `RuleAllows`).
fn rule_allows(rule: &PolicyRule, access: &Access) -> bool {
    let has =
        |items: Option<&Vec<String>>, wanted: &str| items.is_some_and(|i| i.iter().any(|x| x == "*" || x == wanted));
    let resource_matches = rule.resources.as_ref().is_some_and(|resources| {
        resources.iter().any(|r| {
            r == "*"
                || *r == access.resource
                || access
                    .resource
                    .split_once('/')
                    .is_some_and(|(_, sub)| *r == format!("*/{sub}"))
        })
    });
    let name_matches = match rule.resource_names.as_deref() {
        None | Some([]) => true,
        Some(names) => access.name.as_ref().is_some_and(|n| names.contains(n)),
    };
    has(Some(&rule.verbs), &access.verb)
        && has(rule.api_groups.as_ref(), &access.group)
        && resource_matches
        && name_matches
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(groups: &[&str], resources: &[&str], verbs: &[&str], names: &[&str]) -> PolicyRule {
        let v = |x: &[&str]| x.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        PolicyRule {
            api_groups: Some(v(groups)),
            resources: Some(v(resources)),
            verbs: v(verbs),
            resource_names: (!names.is_empty()).then(|| v(names)),
            non_resource_urls: None,
        }
    }

    #[test]
    fn rules_match_as_the_rbac_authorizer_matches_them() {
        let policy = RbacPolicy::new()
            .cluster_rules([
                rule(&[""], &["nodes"], &["get", "list", "watch"], &[]),
                rule(&["apps"], &["daemonsets"], &["patch"], &["mine"]),
                rule(&["x.io"], &["*/status"], &["update"], &[]),
            ])
            .namespace_rules("ns", [rule(&[""], &["configmaps"], &["*"], &[])]);
        let allowed = |a: Access| policy.allows(&a);
        assert!(allowed(Access::new("list", "", "nodes")));
        assert!(!allowed(Access::new("delete", "", "nodes").named("n1")));
        assert!(allowed(
            Access::new("patch", "apps", "daemonsets")
                .in_namespace("a")
                .named("mine")
        ));
        assert!(!allowed(
            Access::new("patch", "apps", "daemonsets")
                .in_namespace("a")
                .named("theirs")
        ));
        assert!(
            !allowed(Access::new("patch", "apps", "daemonsets").in_namespace("a")),
            "no name, no match"
        );
        assert!(allowed(Access::new("update", "x.io", "things/status").named("t")));
        assert!(!allowed(Access::new("update", "x.io", "things").named("t")));
        assert!(allowed(
            Access::new("delete", "", "configmaps").in_namespace("ns").named("c")
        ));
        assert!(!allowed(
            Access::new("delete", "", "configmaps").in_namespace("other").named("c")
        ));
        assert!(
            !allowed(Access::new("list", "", "configmaps")),
            "a Role's rules never apply across namespaces"
        );
    }

    #[test]
    fn roles_come_from_yaml_by_kind_and_namespace() {
        let policy = RbacPolicy::from_yaml(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: c}\n\
             rules: [{apiGroups: [''], resources: [nodes], verbs: [get]}]\n---\n\
             apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: r, namespace: ns}\n\
             rules: [{apiGroups: [''], resources: [secrets], verbs: [get], resourceNames: [token]}]\n---\n\
             apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: sa, namespace: ns}\n",
        )
        .unwrap();
        assert!(policy.allows(&Access::new("get", "", "nodes").named("n")));
        assert!(policy.allows(&Access::new("get", "", "secrets").in_namespace("ns").named("token")));
        assert!(!policy.allows(&Access::new("get", "", "secrets").in_namespace("ns").named("other")));
        let err = RbacPolicy::from_yaml("kind: Role\nmetadata: {name: r}\n").unwrap_err();
        assert_eq!(err.to_string(), "Role r has no namespace");
    }

    #[test]
    fn the_answer_is_worded_as_the_api_servers() {
        let policy = RbacPolicy::new().user("system:serviceaccount:hpp:operator");
        let e = policy.forbidden(&Access::new("patch", "x.io", "things/status").named("t"));
        assert_eq!(e.code, 403);
        assert_eq!(
            e.message,
            "things.x.io \"t\" is forbidden: User \"system:serviceaccount:hpp:operator\" cannot patch resource \
             \"things/status\" in API group \"x.io\" at the cluster scope"
        );
        let e = policy.forbidden(&Access::new("list", "", "configmaps").in_namespace("ns"));
        assert_eq!(
            e.message,
            "configmaps is forbidden: User \"system:serviceaccount:hpp:operator\" cannot list resource \
             \"configmaps\" in API group \"\" in the namespace \"ns\""
        );
    }
}
