//! Type-erased desired objects: every sub-reconciler returns a list of these, so the pipeline can
//! apply, compare, sweep and render any kind (including discovered ones such as SCCs) uniformly.

use kube::api::{ApiResource, DynamicObject};
use kube::core::{ClusterResourceScope, GroupVersionKind, NamespaceResourceScope};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::names::ANNOTATION_DESIRED_HASH;

/// How an object is kept in line with its desired form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApplyStrategy {
    /// Server-side apply (force) whenever the live object differs from the desired one.
    ServerSideApply,
    /// Created when missing, never changed afterwards (pool PVCs, cleanup Jobs, overlay StorageClass).
    CreateOnly,
}

/// Whether a typed resource lives in a namespace, read from its `Scope` type so it cannot be
/// stated wrongly at a call site.
pub trait StaticScope: sealed::Sealed {
    /// `true` for namespaced kinds.
    const NAMESPACED: bool;
}

impl StaticScope for NamespaceResourceScope {
    const NAMESPACED: bool = true;
}

impl StaticScope for ClusterResourceScope {
    const NAMESPACED: bool = false;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::NamespaceResourceScope {}
    impl Sealed for super::ClusterResourceScope {}
}

/// A kind the operator manages: its API resource and whether it is namespaced.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Kind {
    /// API group (empty for core).
    pub group: String,
    /// API version.
    pub version: String,
    /// Kind name.
    pub kind: String,
    /// Plural resource name.
    pub plural: String,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
}

impl Kind {
    /// The kind of a typed resource (k8s-openapi or `#[derive(CustomResource)]`); its scope
    /// comes from `K::Scope`.
    pub fn of<K>() -> Self
    where
        K: Resource<DynamicType = ()>,
        K::Scope: StaticScope,
    {
        Kind {
            group: K::group(&()).into_owned(),
            version: K::version(&()).into_owned(),
            kind: K::kind(&()).into_owned(),
            plural: K::plural(&()).into_owned(),
            namespaced: K::Scope::NAMESPACED,
        }
    }

    /// A kind known only by name (CRD-backed APIs such as SCCs and Prometheus objects).
    pub fn dynamic(group: &str, version: &str, kind: &str, plural: &str, namespaced: bool) -> Self {
        Kind {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            plural: plural.into(),
            namespaced,
        }
    }

    /// The kube `ApiResource` for dynamic API calls.
    pub fn api_resource(&self) -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(&self.group, &self.version, &self.kind),
            &self.plural,
        )
    }

    /// `apiVersion` string.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

/// Identity of an object: kind, namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// `group/Kind`.
    pub kind: String,
    /// Namespace, `None` for cluster-scoped objects.
    pub namespace: Option<String>,
    /// Object name.
    pub name: String,
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {ns}/{}", self.kind, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// One object a sub-reconciler wants to exist.
#[derive(Clone, Debug, PartialEq)]
pub struct DesiredObject {
    /// Its kind.
    pub kind: Kind,
    /// The full object (apiVersion, kind, metadata, and the rest).
    pub object: DynamicObject,
    /// How it is kept in line.
    pub strategy: ApplyStrategy,
}

impl DesiredObject {
    /// Wraps a typed object, filling in `apiVersion`/`kind`.
    pub fn typed<K>(obj: &K, strategy: ApplyStrategy) -> Result<Self>
    where
        K: Resource<DynamicType = ()> + Serialize,
        K::Scope: StaticScope,
    {
        let kind = Kind::of::<K>();
        let mut value = serde_json::to_value(obj).map_err(|source| Error::Serialize {
            what: kind.kind.clone(),
            source,
        })?;
        if let Value::Object(map) = &mut value {
            map.insert("apiVersion".into(), Value::String(kind.api_version()));
            map.insert("kind".into(), Value::String(kind.kind.clone()));
        }
        Self::from_value(kind, value, strategy)
    }

    /// Wraps a JSON object of a kind known only at runtime.
    pub fn from_value(kind: Kind, mut value: Value, strategy: ApplyStrategy) -> Result<Self> {
        if let Value::Object(map) = &mut value {
            map.insert("apiVersion".into(), Value::String(kind.api_version()));
            map.insert("kind".into(), Value::String(kind.kind.clone()));
        }
        let object = dynamic_from_value(value).map_err(|source| Error::Serialize {
            what: kind.kind.clone(),
            source,
        })?;
        Ok(DesiredObject { kind, object, strategy })
    }

    /// Whether the object is of the typed kind `K` (same group, version and kind), e.g. to
    /// pick the objects to [`edit`](Self::edit) as `K` out of a step's list.
    pub fn is<K: Resource<DynamicType = ()>>(&self) -> bool {
        self.kind.group == K::group(&()) && self.kind.version == K::version(&()) && self.kind.kind == K::kind(&())
    }

    /// Edits the object as the typed `K`: it is converted to `K`, passed to `edit`, and
    /// converted back (`apiVersion` and `kind` kept); returns what `edit` returns. A misspelt
    /// field does not compile, unlike an edit of the JSON. Fails with
    /// [`Error::KindMismatch`] when the object is not a `K` (check with [`is`](Self::is)),
    /// and with [`Error::Serialize`] naming the object when it does not convert.
    ///
    /// ```
    /// # use hpp_reconcile::{ApplyStrategy, DesiredObject};
    /// # use k8s_openapi::api::core::v1::ConfigMap;
    /// # let mut cm = ConfigMap::default();
    /// # cm.metadata.name = Some("settings".into());
    /// # cm.metadata.namespace = Some("hpp".into());
    /// let mut obj = DesiredObject::typed(&cm, ApplyStrategy::ServerSideApply)?;
    /// obj.edit(|cm: &mut ConfigMap| {
    ///     cm.data.get_or_insert_with(Default::default).insert("tier".into(), "gold".into());
    /// })?;
    /// assert_eq!(obj.object.data["data"]["tier"], "gold");
    /// # Ok::<(), hpp_reconcile::Error>(())
    /// ```
    pub fn edit<K, R>(&mut self, edit: impl FnOnce(&mut K) -> R) -> Result<R>
    where
        K: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
        K::Scope: StaticScope,
    {
        if !self.is::<K>() {
            let expected = Kind::of::<K>();
            return Err(Error::KindMismatch {
                object: self.key().to_string(),
                expected: format!("{}/{}", expected.api_version(), expected.kind),
                actual: format!("{}/{}", self.kind.api_version(), self.kind.kind),
            });
        }
        let what = || format!("{} as {}", self.key(), K::kind(&()));
        let value = self.to_value()?;
        let mut typed: K = serde_json::from_value(value).map_err(|source| Error::Serialize { what: what(), source })?;
        let result = edit(&mut typed);
        let edited = Self::typed(&typed, self.strategy).map_err(|e| match e {
            Error::Serialize { source, .. } => Error::Serialize { what: what(), source },
            other => other,
        })?;
        self.object = edited.object;
        Ok(result)
    }

    /// Kind, namespace and name.
    pub fn key(&self) -> ObjectKey {
        key_of(&self.kind, &self.object)
    }

    /// The object as JSON without the hash annotation (what the hash is computed over).
    pub fn to_value(&self) -> Result<Value> {
        serde_json::to_value(&self.object).map_err(|source| Error::Serialize {
            what: self.key().to_string(),
            source,
        })
    }

    /// The desired-hash annotation [`stamped`](Self::stamped) sets, worked out without
    /// converting the object.
    pub fn content_hash(&self) -> Result<String> {
        match object_hash(&self.object) {
            Some(hash) => Ok(hash),
            None => Ok(content_hash(&self.to_value()?)),
        }
    }

    /// The object with its desired-hash annotation set: what gets applied and compared.
    pub fn stamped(&self) -> Result<Value> {
        let mut value = self.to_value()?;
        let hash = content_hash(&value);
        if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
            let annotations = meta
                .entry("annotations")
                .or_insert_with(|| Value::Object(Default::default()));
            if let Value::Object(a) = annotations {
                a.insert(ANNOTATION_DESIRED_HASH.into(), Value::String(hash));
            }
        }
        Ok(value)
    }
}

/// Key of a live or desired object of a given kind.
/// `value` as a `DynamicObject`, as `serde_json::from_value` makes it, without serde's
/// buffering of flattened fields: `DynamicObject` flattens its type and its data, so serde first
/// copies the whole object into an intermediate tree and then deserializes that again. A pass
/// over 1,000 nodes converts a few thousand objects; taking the map apart by hand halves what
/// each costs.
pub(crate) fn dynamic_from_value(value: Value) -> serde_json::Result<DynamicObject> {
    let Value::Object(mut map) = value else {
        return serde_json::from_value(value);
    };
    let types = match (map.get("apiVersion"), map.get("kind")) {
        (Some(Value::String(_)), Some(Value::String(_))) => match (map.remove("apiVersion"), map.remove("kind")) {
            (Some(Value::String(api_version)), Some(Value::String(kind))) => {
                Some(kube::api::TypeMeta { api_version, kind })
            }
            _ => None,
        },
        // Anything else (a missing or non-string field) is left to serde's own rules.
        _ => return serde_json::from_value(Value::Object(map)),
    };
    let metadata = match map.remove("metadata") {
        Some(meta) => serde_json::from_value(meta)?,
        None => Default::default(),
    };
    Ok(DynamicObject {
        types,
        metadata,
        data: Value::Object(map),
    })
}

/// [`dynamic_from_value`] from JSON text.
pub(crate) fn dynamic_from_str(text: &str) -> serde_json::Result<DynamicObject> {
    dynamic_from_value(serde_json::from_str(text)?)
}

pub(crate) fn key_of(kind: &Kind, obj: &DynamicObject) -> ObjectKey {
    ObjectKey {
        kind: format!("{}/{}", kind.group, kind.kind),
        namespace: if kind.namespaced { obj.namespace() } else { None },
        name: obj.name_any(),
    }
}

/// Stable hash of a JSON value (object keys sorted), as 16 hex digits (FNV-1a 64).
pub(crate) fn content_hash(value: &Value) -> String {
    let mut hasher = hpp_api::names::Fnv1a64::default();
    canonicalize(value, &mut hasher);
    hasher.hex()
}

/// [`content_hash`] of `obj` as JSON, without turning the whole object into a `Value` first:
/// only its metadata is converted, its body is hashed where it is. `None` when the body is not
/// a JSON object (the caller converts the object instead).
pub(crate) fn object_hash(obj: &DynamicObject) -> Option<String> {
    let Value::Object(body) = &obj.data else {
        return None;
    };
    let mut top: Vec<(&str, std::borrow::Cow<'_, Value>)> = Vec::with_capacity(body.len() + 3);
    if let Some(types) = &obj.types {
        top.push((
            "apiVersion",
            std::borrow::Cow::Owned(Value::String(types.api_version.clone())),
        ));
        top.push(("kind", std::borrow::Cow::Owned(Value::String(types.kind.clone()))));
    }
    top.push((
        "metadata",
        std::borrow::Cow::Owned(serde_json::to_value(&obj.metadata).ok()?),
    ));
    for (k, v) in body {
        if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            // Serialized, the flattened body would repeat these keys: let the caller convert.
            return None;
        }
        top.push((k.as_str(), std::borrow::Cow::Borrowed(v)));
    }
    top.sort_by(|a, b| a.0.cmp(b.0));
    let mut hasher = hpp_api::names::Fnv1a64::default();
    hasher.update(b"{");
    for (k, v) in top {
        let _ = serde_json::to_writer(&mut hasher, k);
        hasher.update(b":");
        canonicalize(&v, &mut hasher);
        hasher.update(b",");
    }
    hasher.update(b"}");
    Some(hasher.hex())
}

/// Feeds `value` to the hasher as canonical JSON: object keys sorted, every member and element
/// followed by a comma. Written piece by piece, so hashing a mounter Deployment allocates
/// nothing (it ran for every desired object of every pass).
fn canonicalize(value: &Value, out: &mut hpp_api::names::Fnv1a64) {
    // Writing into the hasher cannot fail, and a JSON string or scalar always serializes.
    match value {
        Value::Object(map) => {
            out.update(b"{");
            let member = |k: &String, v: &Value, out: &mut hpp_api::names::Fnv1a64| {
                let _ = serde_json::to_writer(&mut *out, k);
                out.update(b":");
                canonicalize(v, out);
                out.update(b",");
            };
            if map.keys().is_sorted() {
                for (k, v) in map {
                    member(k, v, out);
                }
            } else {
                let mut members: Vec<(&String, &Value)> = map.iter().collect();
                members.sort_by(|a, b| a.0.cmp(b.0));
                for (k, v) in members {
                    member(k, v, out);
                }
            }
            out.update(b"}");
        }
        Value::Array(items) => {
            out.update(b"[");
            for v in items {
                canonicalize(v, out);
                out.update(b",");
            }
            out.update(b"]");
        }
        other => {
            let _ = serde_json::to_writer(&mut *out, other);
        }
    }
}

/// Whether every field of `desired` is present with the same value in `live`. Server defaults
/// and fields other managers own are ignored; lists must have the same length.
pub(crate) fn is_subset(desired: &Value, live: &Value) -> bool {
    match (desired, live) {
        (Value::Null, _) => true,
        (Value::Object(d), Value::Object(l)) => d.iter().all(|(k, dv)| match l.get(k) {
            Some(lv) => is_subset(dv, lv),
            None => dv.is_null() || dv.as_object().is_some_and(|o| o.is_empty()),
        }),
        (Value::Array(d), Value::Array(l)) => d.len() == l.len() && d.iter().zip(l).all(|(a, b)| is_subset(a, b)),
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (a, b) => a == b,
    }
}

/// Whether a live object already matches the stamped desired object, so applying it would
/// change nothing the operator owns.
pub(crate) fn live_matches(stamped: &Value, live: &DynamicObject) -> bool {
    match serde_json::to_value(live) {
        Ok(live) => is_subset(stamped, &live),
        Err(_) => false,
    }
}

#[cfg(test)]
mod dynamic_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn taking_the_map_apart_gives_what_serde_gives() {
        for value in [
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                   "metadata": {"name": "m", "namespace": "hpp", "labels": {"a": "b"}, "generation": 3},
                   "spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "c"}]}}},
                   "status": {"availableReplicas": 1}}),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "v"}}),
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}}),
            json!({"metadata": {"name": "untyped"}, "spec": {}}),
            json!({"kind": "OnlyKind", "metadata": {"name": "half"}}),
            json!({"apiVersion": "v1", "kind": "Secret", "data": {"k": "djE="}}),
        ] {
            let ours = dynamic_from_value(value.clone()).unwrap();
            let serdes: DynamicObject = serde_json::from_value(value.clone()).unwrap();
            assert_eq!(ours, serdes, "{value}");
            assert_eq!(dynamic_from_str(&value.to_string()).unwrap(), serdes);
        }
        assert!(dynamic_from_value(json!({"metadata": {"name": 7}})).is_err());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Live clusters compare against fingerprints computed before the hash moved to
    /// `hpp_api::names`: the value must not change.
    #[test]
    fn desired_object_fingerprint_is_unchanged() {
        assert_eq!(
            content_hash(&serde_json::json!({"a": 1, "b": [true, null]})),
            "39fec673a60c0b54"
        );
        // Key order does not matter.
        assert_eq!(
            content_hash(&serde_json::json!({"b": [true, null], "a": 1})),
            "39fec673a60c0b54"
        );
    }
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;
    use serde_json::json;

    #[test]
    fn subset_ignores_server_defaults_but_not_edits() {
        let desired = json!({"spec": {"a": 1, "list": [{"x": "y"}]}});
        let live = json!({"spec": {"a": 1, "b": "default", "list": [{"x": "y", "z": 0}]}, "status": {}});
        assert!(is_subset(&desired, &live));
        let edited = json!({"spec": {"a": 2, "list": [{"x": "y"}]}});
        assert!(!is_subset(&desired, &edited));
        let longer = json!({"spec": {"a": 1, "list": [{"x": "y"}, {"x": "z"}]}});
        assert!(!is_subset(&desired, &longer), "an extra list element is drift");
        assert!(is_subset(&json!({"emptyDir": {}}), &json!({})));
    }

    fn config_map() -> DesiredObject {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some("settings".into()),
                namespace: Some("hpp".into()),
                labels: Some([("app".to_owned(), "hpp".to_owned())].into()),
                ..Default::default()
            },
            data: Some([("k".to_owned(), "v".to_owned())].into()),
            ..Default::default()
        };
        DesiredObject::typed(&cm, ApplyStrategy::CreateOnly).unwrap()
    }

    #[test]
    fn a_typed_edit_changes_only_what_it_sets() {
        let mut obj = config_map();
        let before = obj.to_value().unwrap();
        let seen = obj
            .edit(|cm: &mut ConfigMap| {
                cm.data.as_mut().unwrap().insert("tier".into(), "gold".into());
                cm.data.as_ref().unwrap().len()
            })
            .unwrap();
        assert_eq!(seen, 2, "the closure's result is returned");
        let mut expected = before;
        expected["data"]["tier"] = json!("gold");
        assert_eq!(obj.to_value().unwrap(), expected);
        assert_eq!(obj.strategy, ApplyStrategy::CreateOnly);
        // An edit that changes nothing leaves the object byte for byte as it was.
        let unchanged = config_map();
        let mut edited = config_map();
        edited.edit(|_: &mut ConfigMap| {}).unwrap();
        assert_eq!(edited, unchanged);
        assert_eq!(edited.stamped().unwrap(), unchanged.stamped().unwrap());
    }

    #[test]
    fn an_edit_as_another_kind_names_the_object_and_both_kinds() {
        use k8s_openapi::api::apps::v1::DaemonSet;
        let mut obj = config_map();
        assert!(obj.is::<ConfigMap>() && !obj.is::<DaemonSet>());
        let err = obj.edit(|_: &mut DaemonSet| ()).unwrap_err();
        assert!(matches!(err, Error::KindMismatch { .. }));
        assert_eq!(
            err.to_string(),
            "cannot edit /ConfigMap hpp/settings as apps/v1/DaemonSet: its kind is v1/ConfigMap"
        );
        assert_eq!(obj, config_map(), "nothing changed");
        // An object whose JSON is not a valid K: the error names it.
        obj.object.data["data"] = json!(["not", "a", "map"]);
        let err = obj.edit(|_: &mut ConfigMap| ()).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("serialize /ConfigMap hpp/settings as ConfigMap: "),
            "{err}"
        );
    }

    #[test]
    fn an_object_hashed_in_place_hashes_as_its_json() {
        use k8s_openapi::api::apps::v1::Deployment;
        let deployment: Deployment = serde_json::from_value(json!({
            "metadata": {"name": "hpp-pool-local-node01", "namespace": "hpp",
                         "labels": {"b": "2", "a": "1"}, "annotations": {"x": "y\"z"}},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"hpp-pool": "local-hpp"}},
                     "template": {"spec": {"containers": [{"name": "mounter", "image": "m:v1",
                                                           "args": ["--a", "é"]}]}}},
        }))
        .unwrap();
        for strategy in [ApplyStrategy::ServerSideApply, ApplyStrategy::CreateOnly] {
            for d in [DesiredObject::typed(&deployment, strategy).unwrap(), config_map()] {
                let whole = content_hash(&d.to_value().unwrap());
                assert_eq!(d.content_hash().unwrap(), whole);
                assert_eq!(
                    d.stamped().unwrap()["metadata"]["annotations"][ANNOTATION_DESIRED_HASH],
                    whole.as_str()
                );
            }
        }
        // A body repeating a top-level key is hashed through the converted object.
        let mut odd = config_map();
        odd.object.data["kind"] = json!("Shadow");
        assert_eq!(object_hash(&odd.object), None);
        assert!(odd.content_hash().is_ok());
    }

    #[test]
    fn stamped_object_carries_a_stable_hash() {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some("x".into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            data: Some([("k".to_owned(), "v".to_owned())].into()),
            ..Default::default()
        };
        let d = DesiredObject::typed(&cm, ApplyStrategy::ServerSideApply).unwrap();
        assert_eq!(d.key().to_string(), "/ConfigMap ns/x");
        let a = d.stamped().unwrap();
        let b = d.stamped().unwrap();
        assert_eq!(a, b);
        assert_eq!(a["apiVersion"], "v1");
        assert_eq!(a["kind"], "ConfigMap");
        let hash = a["metadata"]["annotations"][ANNOTATION_DESIRED_HASH]
            .as_str()
            .unwrap()
            .to_owned();
        assert_eq!(hash.len(), 16);
        let mut cm2 = cm.clone();
        cm2.data = Some([("k".to_owned(), "w".to_owned())].into());
        let d2 = DesiredObject::typed(&cm2, ApplyStrategy::ServerSideApply).unwrap();
        assert_ne!(
            d2.stamped().unwrap()["metadata"]["annotations"][ANNOTATION_DESIRED_HASH],
            hash.as_str()
        );
        let live: DynamicObject = serde_json::from_value(a.clone()).unwrap();
        assert!(live_matches(&a, &live));
        assert!(!live_matches(&d2.stamped().unwrap(), &live));
    }
}
