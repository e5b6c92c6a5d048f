//! The only place owned objects are written: server-side apply with a per-sub-reconciler field
//! manager, skipped when the live object already matches, plus create-only and delete helpers.

use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use tracing::{debug, info, warn};

use crate::cache::Cache;
use crate::error::{Error, Result};
use crate::names::managed_selector;
use crate::object::{ApplyStrategy, DesiredObject, Kind, ObjectKey, key_of, live_matches};
use crate::subreconciler::ObjectWarning;

/// Writes [`Applier::apply_all`] has in flight at once: a first install writes one claim and
/// one mounter per node, and one at a time that is a round trip per object (1,000 nodes, 2,000
/// round trips). Objects up to date cost no request, so a steady pass is not affected.
pub const APPLY_CONCURRENCY: usize = 8;

/// A write's answer as the watch caches keep it ([`trim`](crate::cache::trim): no
/// `managedFields`, which the server sends back with every write and which can be as large
/// as the rest of the object), since a step holds its live objects until its readiness is read.
fn trimmed(kind: &Kind, mut obj: DynamicObject) -> DynamicObject {
    crate::cache::trim(kind, &mut obj);
    obj
}

/// The desired-hash annotation of a stamped object.
fn stamped_hash(stamped: &serde_json::Value) -> String {
    stamped["metadata"]["annotations"][crate::names::ANNOTATION_DESIRED_HASH]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Deletes with a uid precondition; `Ok(true)` deleted, `Ok(false)` already gone or replaced
/// by an object of the same name (the precondition failed).
pub(crate) async fn delete_exact<K>(api: &Api<K>, name: &str, uid: &str) -> std::result::Result<bool, kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// What [`Applier::delete`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deleted {
    /// The API server accepted the delete of an existing object.
    Requested,
    /// The object was already gone.
    Missing,
    /// RBAC forbids the delete and the kind may stay behind (see
    /// [`may_stay_when_delete_is_forbidden`]): logged, recorded for
    /// [`Applier::take_left_behind`], and left in place.
    LeftForbidden,
}

/// Whether a 403 on deleting an object of this kind leaves the object in place instead of
/// failing: only StorageClasses. The shipped RBAC grants delete on the default overlay class
/// `hpp-overlay` alone, so a pool's custom `overlayClassName` class cannot be deleted unless the
/// admin granted it; failing would fail every pass (the sweep) and hold the CR's finalizer
/// forever (cleanup). Everything else the operator creates it may delete, so a 403 there is a
/// real misconfiguration and stays an error.
pub fn may_stay_when_delete_is_forbidden(kind: &Kind) -> bool {
    *kind == Kind::of::<StorageClass>()
}

/// Warning Event reason: RBAC forbids the operator to delete an object it created (a
/// StorageClass of a custom `overlayClassName`), so it is left in place.
pub const REASON_DELETE_FORBIDDEN: &str = "DeleteForbidden";

/// The warning about an object the operator had to leave because RBAC forbids deleting it.
pub fn left_behind_warning(regarding: ObjectReference) -> ObjectWarning {
    let what = format!(
        "{} {}",
        regarding.kind.as_deref().unwrap_or_default(),
        regarding.name.as_deref().unwrap_or_default()
    );
    ObjectWarning {
        message: format!(
            "{what} is no longer needed, but the operator's RBAC does not allow deleting it, so it \
             is left in place: delete it yourself, or add its name to the resourceNames of the \
             operator ClusterRole's delete rule for it"
        ),
        reason: REASON_DELETE_FORBIDDEN.into(),
        regarding,
    }
}

/// Whether a 403 on applying an object of this kind that already exists keeps the live object
/// instead of failing: only RBAC objects. The API server lets a subject grant only permissions
/// it holds itself, and KubeVirt's operator ClusterRole and Role (which an image-only swap keeps)
/// lack a few that hpp's roles grant (the csi-resizer's `persistentvolumeclaims/status`,
/// `volumeattributesclasses`, `leases` patch, `events.k8s.io`). The role KubeVirt's operator
/// made still serves everything KubeVirt's driver and sidecars did; failing the pass would stop
/// the whole swap (nothing after the RBAC step would be applied). A role that does not exist yet
/// is still an error: nothing would grant the sidecars anything.
pub fn may_stay_when_apply_is_forbidden(kind: &Kind) -> bool {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    [
        Kind::of::<ClusterRole>(),
        Kind::of::<Role>(),
        Kind::of::<ClusterRoleBinding>(),
        Kind::of::<RoleBinding>(),
    ]
    .contains(kind)
}

/// Warning Event reason: RBAC forbids the operator to update an existing object (a role granting
/// permissions the operator does not hold), so it keeps its current form.
pub const REASON_APPLY_FORBIDDEN: &str = "ApplyForbidden";

/// The warning about an existing object the operator may not update.
pub fn kept_stale_warning(regarding: ObjectReference, answer: &str) -> ObjectWarning {
    let what = format!(
        "{} {}",
        regarding.kind.as_deref().unwrap_or_default(),
        regarding.name.as_deref().unwrap_or_default()
    );
    ObjectWarning {
        message: format!(
            "{what} keeps its current rules: the operator's RBAC does not allow it to write hpp's ({answer}). \
             This is expected after swapping KubeVirt's operator image for hpp's, which keeps KubeVirt's operator \
             RBAC: what KubeVirt's driver did still works, what needs the missing permissions (volume expansion \
             and modification by csi-resizer) fails until you apply hpp's: kubectl apply -f deploy/operator/rbac.yaml"
        ),
        reason: REASON_APPLY_FORBIDDEN.into(),
        regarding,
    }
}

/// `patch` merged onto `target` as a JSON merge patch without deletions (RFC 7386): objects merge
/// key by key, anything else (lists included) is replaced by the patch's value.
pub fn merge_onto(target: &mut serde_json::Value, patch: &serde_json::Value) {
    match (target, patch) {
        (serde_json::Value::Object(t), serde_json::Value::Object(p)) => {
            for (k, v) in p {
                match t.get_mut(k) {
                    Some(existing) if existing.is_object() && v.is_object() => merge_onto(existing, v),
                    _ => {
                        t.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

/// An Event's reference to an object of `kind`.
fn reference(kind: &Kind, namespace: Option<&str>, name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some(kind.api_version()),
        kind: Some(kind.kind.clone()),
        namespace: namespace.filter(|_| kind.namespaced).map(str::to_owned),
        name: Some(name.to_owned()),
        ..Default::default()
    }
}

/// Writes desired objects to the cluster. Cheap to clone (clones share the watch caches and
/// the record of objects left behind).
#[derive(Clone)]
pub struct Applier {
    client: Client,
    cache: Cache,
    left_behind: Arc<Mutex<Vec<ObjectReference>>>,
    kept_stale: Arc<Mutex<Vec<ObjectWarning>>>,
}

impl Applier {
    /// An applier over this client that reads live objects from the API.
    pub fn new(client: Client) -> Self {
        Applier {
            client,
            cache: Cache::new(),
            left_behind: Arc::default(),
            kept_stale: Arc::default(),
        }
    }

    /// Reads live objects from these watch caches where they are synced.
    pub fn with_cache(mut self, cache: Cache) -> Self {
        self.cache = cache;
        self
    }

    /// The watch caches reads go through first.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// The live object, from the watch cache when it is synced, else from the API.
    pub async fn get(&self, kind: &Kind, namespace: Option<&str>, name: &str) -> Result<Option<DynamicObject>> {
        if let Some(cached) = self.cache.get(kind, &managed_selector(), namespace, name) {
            return Ok(cached.map(Arc::unwrap_or_clone));
        }
        self.api(kind, namespace)
            .get_opt(name)
            .await
            .map_err(|e| Error::kube("get", format!("{}/{} {name}", kind.group, kind.kind), e))
    }

    /// The client, for sub-reconcilers that need extra reads.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// A dynamic API handle for a kind, namespaced when the kind is.
    pub fn api(&self, kind: &Kind, namespace: Option<&str>) -> Api<DynamicObject> {
        let ar = kind.api_resource();
        match (kind.namespaced, namespace) {
            (true, Some(ns)) => Api::namespaced_with(self.client.clone(), ns, &ar),
            _ => Api::all_with(self.client.clone(), &ar),
        }
    }

    /// Makes one object match its desired form; returns the live object afterwards.
    /// Issues no write when nothing the operator owns differs.
    pub async fn apply(&self, field_manager: &str, desired: &DesiredObject) -> Result<DynamicObject> {
        let key = desired.key();
        let api = self.api(&desired.kind, key.namespace.as_deref());
        let cached = self
            .cache
            .get(&desired.kind, &managed_selector(), key.namespace.as_deref(), &key.name);
        let live = match (cached, desired.strategy) {
            // Parsed for this read: unwrapping takes it without a copy.
            (Some(Some(live)), _) => Some(Arc::unwrap_or_clone(live)),
            // Not in the cache: applying creates or adopts it either way.
            (Some(None), ApplyStrategy::ServerSideApply) => None,
            // The cache holds only labelled objects: an unlabelled object an older operator
            // created is found by the create's 409 (then remembered and read each pass), so
            // creating a new object costs one request, not two.
            (Some(None), ApplyStrategy::CreateOnly) if !self.cache.is_unlabelled(&key) => None,
            // Without a synced cache the API is the only source.
            (_, _) => {
                let live = api
                    .get_opt(&key.name)
                    .await
                    .map_err(|e| Error::kube("get", key.to_string(), e))?;
                if self.cache.is_unlabelled(&key) {
                    self.cache.remember_unlabelled(&key, live.is_some());
                }
                live
            }
        };
        // A live version already found to match this desired form is not compared again.
        let (verified_hash, unchanged) = match (&live, desired.strategy) {
            (Some(live), ApplyStrategy::ServerSideApply) => {
                let hash = desired.content_hash()?;
                let unchanged = live
                    .metadata
                    .resource_version
                    .as_deref()
                    .is_some_and(|rv| self.cache.is_verified(&key, &hash, rv));
                (Some(hash), unchanged)
            }
            _ => (None, false),
        };
        let live = match (unchanged, live) {
            (true, Some(live)) => {
                debug!(object = %key, "up to date (this version matched before)");
                return Ok(live);
            }
            (_, live) => live,
        };
        let stamped = desired.stamped()?;
        let record = |written: &DynamicObject| {
            if let Some(rv) = written.metadata.resource_version.as_deref() {
                let hash = verified_hash.clone().unwrap_or_else(|| stamped_hash(&stamped));
                self.cache.record_verified(&key, &hash, rv);
            }
        };
        match (desired.strategy, live) {
            (ApplyStrategy::CreateOnly, Some(live)) => Ok(live),
            (ApplyStrategy::CreateOnly, None) => {
                let obj: DynamicObject = serde_json::from_value(stamped).map_err(|source| Error::Serialize {
                    what: key.to_string(),
                    source,
                })?;
                let pp = PostParams {
                    field_manager: Some(field_manager.to_owned()),
                    ..Default::default()
                };
                info!(object = %key, "creating");
                match api.create(&pp, &obj).await {
                    Ok(created) => Ok(trimmed(&desired.kind, created)),
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        let live = api
                            .get(&key.name)
                            .await
                            .map_err(|e| Error::kube("get", key.to_string(), e))?;
                        if !crate::names::is_managed(&live) {
                            self.cache.remember_unlabelled(&key, true);
                        }
                        Ok(live)
                    }
                    Err(e) => Err(Error::kube("create", key.to_string(), e)),
                }
            }
            (ApplyStrategy::ServerSideApply, Some(live)) if live_matches(&stamped, &live) => {
                debug!(object = %key, "up to date");
                record(&live);
                Ok(live)
            }
            (ApplyStrategy::ServerSideApply, live) => {
                info!(object = %key, adopt = live.is_some(), "applying");
                let pp = PatchParams::apply(field_manager).force();
                let refused = match api.patch(&key.name, &pp, &Patch::Apply(&stamped)).await {
                    Ok(applied) => {
                        // Only an answer that matches: one an admission webhook changed is
                        // compared (and applied) again next pass, as before.
                        if live_matches(&stamped, &applied) {
                            record(&applied);
                        }
                        return Ok(trimmed(&desired.kind, applied));
                    }
                    Err(kube::Error::Api(s)) if s.code == 403 => s,
                    Err(e) => return Err(Error::kube("apply", key.to_string(), e)),
                };
                // KubeVirt's operator RBAC (kept by an image-only swap) grants create and
                // update, not patch: write the way KubeVirt's operator does.
                debug!(object = %key, answer = %refused.message, "server-side apply forbidden; creating or updating instead");
                match self
                    .create_or_update(&api, field_manager, &stamped, live.as_ref())
                    .await
                {
                    Ok(written) => Ok(trimmed(&desired.kind, written)),
                    Err(kube::Error::Api(s)) if s.code == 403 && may_stay_when_apply_is_forbidden(&desired.kind) => {
                        let Some(live) = live else {
                            return Err(Error::kube("apply, then create", key.to_string(), kube::Error::Api(s)));
                        };
                        warn!(object = %key, "updating is forbidden by the operator's RBAC; keeping the live object ({})", s.message);
                        if let Ok(mut kept) = self.kept_stale.lock() {
                            kept.push(kept_stale_warning(
                                reference(&desired.kind, key.namespace.as_deref(), &key.name),
                                &s.message,
                            ));
                        }
                        Ok(live)
                    }
                    Err(e) => Err(Error::kube(
                        if live.is_some() {
                            "apply, then update"
                        } else {
                            "apply, then create"
                        },
                        key.to_string(),
                        e,
                    )),
                }
            }
        }
    }

    /// Writes `stamped` without PATCH: creates it when there is no live object, else replaces
    /// the live object with `stamped` merged onto it (desired fields win, fields others set are
    /// kept; the live `resourceVersion` makes a concurrent change a 409).
    async fn create_or_update(
        &self,
        api: &Api<DynamicObject>,
        field_manager: &str,
        stamped: &serde_json::Value,
        live: Option<&DynamicObject>,
    ) -> std::result::Result<DynamicObject, kube::Error> {
        let pp = PostParams {
            field_manager: Some(field_manager.to_owned()),
            ..Default::default()
        };
        let Some(live) = live else {
            let obj: DynamicObject = serde_json::from_value(stamped.clone()).map_err(kube::Error::SerdeError)?;
            return api.create(&pp, &obj).await;
        };
        let mut merged = serde_json::to_value(live).map_err(kube::Error::SerdeError)?;
        merge_onto(&mut merged, stamped);
        if let Some(meta) = merged.get_mut("metadata").and_then(serde_json::Value::as_object_mut) {
            // Left out, the server keeps tracking field owners as before.
            meta.remove("managedFields");
        }
        let name = live.metadata.name.clone().unwrap_or_default();
        let obj: DynamicObject = serde_json::from_value(merged).map_err(kube::Error::SerdeError)?;
        api.replace(&name, &pp, &obj).await
    }

    /// Applies objects, at most [`APPLY_CONCURRENCY`] at a time, in order, stopping at the
    /// first failure; returns the live objects in the order given.
    pub async fn apply_all(&self, field_manager: &str, desired: &[DesiredObject]) -> Result<Vec<DynamicObject>> {
        self.apply_all_keeping(field_manager, desired, |_| ()).await
    }

    /// [`apply_all`](Self::apply_all), passing each live object through `keep` as it comes:
    /// a step with one object per node keeps of each only what its readiness reads, so a
    /// thousand pod templates are not all held at once.
    pub async fn apply_all_keeping(
        &self,
        field_manager: &str,
        desired: &[DesiredObject],
        keep: impl Fn(&mut DynamicObject) + Send + Sync,
    ) -> Result<Vec<DynamicObject>> {
        use futures::{StreamExt, TryStreamExt};
        // The futures are made first: a closure inside the stream would not be `Send` for
        // every lifetime, which `async_trait` callers need.
        let writes: Vec<_> = desired.iter().map(|d| self.apply(field_manager, d)).collect();
        let keep = &keep;
        futures::stream::iter(writes)
            .buffered(APPLY_CONCURRENCY)
            .map_ok(|mut live| {
                keep(&mut live);
                live
            })
            .try_collect()
            .await
    }

    /// Deletes an object (background propagation); an already missing object is success, and
    /// so is a forbidden delete of a kind that may stay behind
    /// ([`may_stay_when_delete_is_forbidden`]), which is logged and recorded for
    /// [`take_left_behind`](Self::take_left_behind).
    pub async fn delete(&self, kind: &Kind, namespace: Option<&str>, name: &str) -> Result<Deleted> {
        let api = self.api(kind, namespace);
        let what = || format!("{}/{} {name}", kind.group, kind.kind);
        self.cache.forget_verified(&ObjectKey {
            kind: format!("{}/{}", kind.group, kind.kind),
            namespace: namespace.filter(|_| kind.namespaced).map(str::to_owned),
            name: name.to_owned(),
        });
        match api.delete(name, &DeleteParams::background()).await {
            Ok(_) => {
                info!(object = %what(), "deleted");
                Ok(Deleted::Requested)
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(Deleted::Missing),
            Err(kube::Error::Api(s)) if s.code == 403 && may_stay_when_delete_is_forbidden(kind) => {
                warn!(
                    object = %what(),
                    "deleting is forbidden by the operator's RBAC; leaving it in place ({})",
                    s.message
                );
                if let Ok(mut left) = self.left_behind.lock() {
                    left.push(reference(kind, namespace, name));
                }
                Ok(Deleted::LeftForbidden)
            }
            Err(e) => Err(Error::kube("delete", what(), e)),
        }
    }

    /// The objects [`delete`](Self::delete) left in place because RBAC forbids deleting them,
    /// since the last call; the operator reports each as a Warning Event.
    pub fn take_left_behind(&self) -> Vec<ObjectReference> {
        self.left_behind
            .lock()
            .map(|mut l| std::mem::take(&mut *l))
            .unwrap_or_default()
    }

    /// Warnings about existing objects [`apply`](Self::apply) kept as they are because RBAC
    /// forbids updating them, since the last call.
    pub fn take_kept_stale(&self) -> Vec<ObjectWarning> {
        self.kept_stale
            .lock()
            .map(|mut k| std::mem::take(&mut *k))
            .unwrap_or_default()
    }

    /// Deletes every desired object that exists, in reverse order.
    pub async fn delete_all(&self, desired: &[DesiredObject]) -> Result<()> {
        for d in desired.iter().rev() {
            let key = d.key();
            self.delete(&d.kind, key.namespace.as_deref(), &key.name).await?;
        }
        Ok(())
    }

    /// Every object of a kind carrying the managed-by label, in `namespace` for namespaced kinds.
    pub async fn list_managed(&self, kind: &Kind, namespace: &str) -> Result<Vec<(ObjectKey, DynamicObject)>> {
        Ok(self
            .list(kind, &managed_selector(), namespace)
            .await?
            .into_iter()
            .filter(|o| o.metadata.deletion_timestamp.is_none())
            .map(|o| (key_of(kind, &o), o))
            .collect())
    }

    /// The keys of every object of a kind carrying the managed-by label and not being deleted,
    /// in `namespace` for namespaced kinds: what the sweep compares with the claimed objects.
    /// From the watch cache without parsing an object when it is synced, else from the API.
    pub async fn managed_keys(&self, kind: &Kind, namespace: &str) -> Result<Vec<ObjectKey>> {
        let Some(cached) = self.cache.keys(kind, &managed_selector(), Some(namespace)) else {
            return Ok(self
                .list_managed(kind, namespace)
                .await?
                .into_iter()
                .map(|(key, _)| key)
                .collect());
        };
        let kind_name = format!("{}/{}", kind.group, kind.kind);
        Ok(cached
            .into_iter()
            .map(|(ns, name)| ObjectKey {
                kind: kind_name.clone(),
                namespace: kind.namespaced.then_some(ns),
                name,
            })
            .collect())
    }

    /// Objects of a kind matching a label selector (in `namespace` for namespaced kinds), from
    /// the watch cache when it is synced, else from the API.
    pub async fn list(&self, kind: &Kind, selector: &str, namespace: &str) -> Result<Vec<DynamicObject>> {
        if let Some(cached) = self.cache.list_typed(kind, selector, Some(namespace)) {
            return Ok(cached);
        }
        self.list_from_api(kind, selector, namespace).await
    }

    /// [`list`](Self::list), each object parsed into `K` and made into an `F` by `each` as
    /// soon as it is read from the cache, so a reader of every PersistentVolume holds what it
    /// keeps of each, not 10,000 parsed objects. An object that is not a `K` is an error
    /// ([`Error::Serialize`]), not left out: a reader judging what is missing must not take
    /// it for absent.
    pub async fn list_map<K: DeserializeOwned, F>(
        &self,
        kind: &Kind,
        selector: &str,
        namespace: &str,
        mut each: impl FnMut(K) -> Option<F>,
    ) -> Result<Vec<F>> {
        if let Some(cached) = self.cache.list_map(kind, selector, Some(namespace), &mut each) {
            return cached.map_err(|e| Error::Serialize {
                what: format!("{} {}/{}", kind.kind, e.namespace, e.name),
                source: e.source,
            });
        }
        let mut out = Vec::new();
        for obj in self.list_from_api(kind, selector, namespace).await? {
            out.extend(each(crate::gather::typed(obj)?));
        }
        Ok(out)
    }

    async fn list_from_api(&self, kind: &Kind, selector: &str, namespace: &str) -> Result<Vec<DynamicObject>> {
        let lp = ListParams::default().labels(selector);
        let list = self
            .api(kind, Some(namespace))
            .list(&lp)
            .await
            .map_err(|e| Error::kube("list", format!("{}/{}", kind.group, kind.plural), e))?;
        Ok(list.items)
    }
}

#[cfg(test)]
mod tests {
    use super::merge_onto;
    use serde_json::json;

    #[test]
    fn desired_fields_win_others_stay_and_lists_are_replaced() {
        let mut live = json!({
            "metadata": { "labels": { "k8s-app": "hostpath-provisioner", "extra": "kept" }, "resourceVersion": "7" },
            "spec": { "template": { "spec": { "containers": [{ "name": "a", "image": "old" }, { "name": "b" }] } } },
            "status": { "numberReady": 2 },
        });
        merge_onto(
            &mut live,
            &json!({
                "metadata": { "labels": { "k8s-app": "hostpath-provisioner", "new": "x" } },
                "spec": { "template": { "spec": { "containers": [{ "name": "a", "image": "new" }] } } },
            }),
        );
        assert_eq!(
            live,
            json!({
                "metadata": { "labels": { "k8s-app": "hostpath-provisioner", "extra": "kept", "new": "x" }, "resourceVersion": "7" },
                "spec": { "template": { "spec": { "containers": [{ "name": "a", "image": "new" }] } } },
                "status": { "numberReady": 2 },
            })
        );
    }
}
