//! An in-process fake Kubernetes API server behind a real [`kube::Client`], for testing
//! controllers, admission webhooks and provisioners without a cluster.
//!
//! A dev-dependency of its own (it does not depend on any other hpp crate), so a team that
//! only writes a controller, or tests code that merely holds a `kube::Client`, can use it
//! without pulling in the operator. `hpp_reconcile::testkit` (feature `testkit`) re-exports
//! this crate for code written against that path.
//!
//! [`FakeApiServer::client`] returns a `kube::Client` whose tower service is the fake, so
//! typed `Api<K>` calls, `kube::runtime::watcher`, `Controller` and `finalizer` run unchanged.
//! The fake implements the parts of the API server's behaviour reconcilers depend on:
//!
//! - get / list (label selectors `=`, `==`, `!=`, `in`, `notin`, `key`, `!key`; field selectors
//!   on any dotted path; `limit`/`continue` pagination) and watch (`resourceVersion`,
//!   `timeoutSeconds`, selectors, `sendInitialEvents`, `allowWatchBookmarks` (a bookmark every
//!   minute and 2 s before the timeout); 410 Gone for a compacted version);
//! - create (409 AlreadyExists, `generateName`), update (409 Conflict on a stale
//!   `resourceVersion`), merge / strategic merge / JSON patch, server-side apply (creates when
//!   absent, removes fields a manager stops applying, conflicts between managers unless
//!   `force`), `dryRun=All`;
//! - the `/status` split for kinds with a status subresource, `metadata.generation` bumped on
//!   spec changes only, no-op writes that keep the `resourceVersion` and emit no event;
//!   immutable fields refused with 422 (workload selectors, Job templates, StorageClass
//!   parameters, CSIDriver `attachRequired`, binding `roleRef`, PVC spec, a PV's volume source,
//!   immutable ConfigMaps);
//! - delete with finalizers (`deletionTimestamp`, removal when the last finalizer goes),
//!   delete-collection, preconditions, and synchronous owner-reference garbage collection
//!   (Background deletes dependents whose owners are all gone, Foreground deletes dependents
//!   first and holds the owner with `foregroundDeletion` while `blockOwnerDeletion` dependents
//!   remain, Orphan strips the reference); deleting a Namespace deletes its contents;
//! - opt-in claim in-use protection ([`FakeApiServer::protect_claims_in_use`]): the
//!   `kubernetes.io/pvc-protection` finalizer holds a deleted claim while a pod uses it;
//! - metadata-only requests (`get_metadata`, `list_metadata`, `metadata_watcher`);
//! - discovery (`/api`, `/apis`, aggregated discovery) listing exactly the served kinds,
//!   `/version`; creating a CustomResourceDefinition serves its kinds, deleting it stops them;
//! - RBAC ([`FakeApiServer::enforce_rbac`] with an [`RbacPolicy`]): requests the given rules
//!   do not allow are answered 403 Forbidden, worded as the API server words it;
//! - fault injection ([`FailureRule`]), an outage switch ([`FakeApiServer::set_unavailable`]),
//!   a server that stops answering ([`FakeApiServer::set_unresponsive`]) and a log of every
//!   request ([`RecordedRequest`]).
//!
//! Known simplifications: server-side apply keeps no `managedFields` (they are kept, for their
//! size only, after [`FakeApiServer::track_managed_fields`]) and only tracks apply
//! managers (a non-apply write takes ownership away from the applier but does not itself cause
//! apply conflicts); it merges the common associative lists of built-in kinds by key (see the
//! `ssa` module) and treats custom resources' lists as atomic; strategic merge knows the merge
//! keys of the common lists (containers, env, volumes, volumeMounts, ports, conditions,
//! ownerReferences) and the `$patch` directive only; pods are deleted at once (no kubelet);
//! garbage collection runs when an owner is removed, not for objects created with an absent
//! owner; no scale/eviction/log subresources; objects of every version of a kind are served
//! as-is (no conversion).
//!
//! ```
//! use hpp_testkit::FakeApiServer;
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::api::{Api, ListParams, PostParams};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), kube::Error> {
//! let fake = FakeApiServer::new();
//! let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
//! let mut cm = ConfigMap::default();
//! cm.metadata.name = Some("cfg".into());
//! cm.metadata.labels = Some([("app".to_string(), "hpp".to_string())].into());
//! api.create(&PostParams::default(), &cm).await?;
//!
//! let found = api.list(&ListParams::default().labels("app=hpp")).await?;
//! assert_eq!(found.items.len(), 1);
//! assert!(fake.get::<ConfigMap>(Some("ns"), "cfg").is_some());
//! assert_eq!(fake.write_requests().len(), 1);
//! let err = api.create(&PostParams::default(), &cm).await.unwrap_err();
//! assert!(matches!(err, kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists"));
//! # Ok(())
//! # }
//! ```

mod body;
mod discovery;
mod error;
mod faults;
mod gc;
pub mod grpc_client;
mod handler;
mod immutable;
mod kinds;
pub mod loopfs;
mod managed;
mod ops;
mod patch;
mod path;
mod protection;
mod rbac;
mod record;
mod selectors;
mod ssa;
mod store;
mod watch;

use std::sync::{Arc, Mutex};

use kube::Resource;
use kube::core::ApiResource;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

pub use body::FakeBody;
pub use faults::FailureRule;
pub use rbac::{Access, PolicyError, RbacPolicy};
pub use record::RecordedRequest;

use handler::lock;
use kinds::KindInfo;
use ops::{Part, present};
use store::{ObjKey, Propagation, State};

/// The fake API server. Cheap to clone; clones share the same objects, history and request log.
#[derive(Clone)]
pub struct FakeApiServer {
    inner: Arc<Mutex<State>>,
}

impl std::fmt::Debug for FakeApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = lock(&self.inner);
        f.debug_struct("FakeApiServer")
            .field("resource_version", &state.rv)
            .field("objects", &state.objects.len())
            .field("requests", &state.requests.len())
            .field("down", &state.down)
            .finish()
    }
}

impl Default for FakeApiServer {
    fn default() -> Self {
        Self::new()
    }
}

fn kind_of<K: Resource<DynamicType = ()>>(namespaced: bool, status: bool) -> KindInfo {
    KindInfo {
        ar: ApiResource::erase::<K>(&()),
        namespaced,
        status,
        custom: true,
    }
}

fn to_value<K: Serialize>(obj: &K) -> Value {
    serde_json::to_value(obj).unwrap_or_else(|e| {
        tracing::error!(error = %e, "testkit: object does not serialise to JSON");
        Value::Null
    })
}

fn from_value<K: DeserializeOwned>(value: Value) -> Option<K> {
    serde_json::from_value(value)
        .map_err(|e| tracing::error!(error = %e, "testkit: stored object does not deserialise into the requested type"))
        .ok()
}

impl FakeApiServer {
    /// An empty server serving the built-in kinds the hpp components use (core/v1 Pod, Node,
    /// Namespace, Service, ServiceAccount, ConfigMap, Secret, Event, PersistentVolume(Claim),
    /// Endpoints; apps/v1 DaemonSet, Deployment, ReplicaSet, StatefulSet; rbac/v1 roles and
    /// bindings; storage.k8s.io/v1 StorageClass, CSIDriver, CSINode, CSIStorageCapacity,
    /// VolumeAttachment; batch/v1 Job; coordination.k8s.io/v1 Lease; events.k8s.io/v1 Event;
    /// apiextensions.k8s.io/v1 CustomResourceDefinition), each with its real scope.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Mutex::new(State::new())),
        }
    }

    /// A `kube::Client` talking to this server (default namespace `default`).
    ///
    /// Must be called inside a tokio runtime: the client spawns its request buffer there.
    pub fn client(&self) -> kube::Client {
        self.client_in("default")
    }

    /// Like [`client`](Self::client) with another default namespace (what
    /// `Api::default_namespaced` uses), e.g. the operator's own namespace.
    pub fn client_in(&self, default_namespace: &str) -> kube::Client {
        let inner = self.inner.clone();
        let service = tower::service_fn(move |req| handler::handle(inner.clone(), req));
        kube::Client::new(service, default_namespace)
    }

    /// Serves a typed kind, such as a custom resource (`HostPathProvisioner`: cluster-scoped,
    /// with a status subresource). Register every served version of a multi-version CRD.
    pub fn register<K: Resource<DynamicType = ()>>(&self, namespaced: bool, status_subresource: bool) {
        lock(&self.inner)
            .kinds
            .insert(kind_of::<K>(namespaced, status_subresource));
    }

    /// Serves a kind known only by its `ApiResource` (SecurityContextConstraints,
    /// PrometheusRule, ServiceMonitor, ...), making it visible to discovery.
    pub fn register_api(&self, ar: ApiResource, namespaced: bool, status_subresource: bool) {
        lock(&self.inner).kinds.insert(KindInfo {
            ar,
            namespaced,
            status: status_subresource,
            custom: true,
        });
    }

    /// Stops serving a kind registered with [`register_api`](Self::register_api) or
    /// [`register`](Self::register) (its objects stay stored but unreachable), e.g. to test
    /// an optional API disappearing.
    pub fn unregister_api(&self, ar: &ApiResource) {
        lock(&self.inner).kinds.remove(&ar.group, &ar.version, &ar.plural);
    }

    fn typed_kind<K: Resource<DynamicType = ()>>(state: &State) -> Option<KindInfo> {
        state
            .kinds
            .for_type::<K>()
            .or_else(|| state.kinds.any_version(&K::group(&()), &K::plural(&())))
            .cloned()
    }

    /// Inserts or overwrites an object as if it had always been there: uid, resourceVersion and
    /// creationTimestamp are assigned, `.status` is kept, watches see ADDED/MODIFIED. Returns the
    /// stored object (with its uid, for owner references).
    ///
    /// An unregistered kind is registered on the fly, namespaced if the object has a namespace,
    /// with a status subresource.
    pub fn seed<K>(&self, obj: &K) -> K
    where
        K: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Clone,
    {
        let kind = {
            let mut state = lock(&self.inner);
            match Self::typed_kind::<K>(&state) {
                Some(kind) => kind,
                None => {
                    let kind = kind_of::<K>(obj.meta().namespace.is_some(), true);
                    state.kinds.insert(kind.clone());
                    kind
                }
            }
        };
        self.seed_as(&kind, to_value(obj))
            .and_then(from_value)
            .unwrap_or_else(|| obj.clone())
    }

    /// [`seed`](Self::seed) for a kind registered with [`register_api`](Self::register_api).
    pub fn seed_dynamic(&self, ar: &ApiResource, obj: Value) -> Option<Value> {
        let kind = lock(&self.inner)
            .kinds
            .get(&ar.group, &ar.version, &ar.plural)
            .cloned()?;
        self.seed_as(&kind, obj)
    }

    fn seed_as(&self, kind: &KindInfo, obj: Value) -> Option<Value> {
        let mut state = lock(&self.inner);
        let ns = store::meta_str(&obj, "namespace").map(str::to_string);
        let name = store::meta_str(&obj, "name")?.to_string();
        let key = ObjKey::new(kind, ns.as_deref(), &name);
        let result = if state.objects.contains_key(&key) {
            state.update(kind, ns.as_deref(), &name, Part::All, false, |o| {
                let rv = o.pointer("/metadata/resourceVersion").cloned();
                *o = obj;
                if let Some(rv) = rv {
                    store::set_meta(o, "resourceVersion", rv);
                }
                Ok(())
            })
        } else {
            state.create(kind, ns.as_deref(), obj, Part::All, false)
        };
        result
            .map_err(|e| tracing::error!(error = e.message, "testkit: seed failed"))
            .ok()
    }

    /// The stored object, if it exists.
    pub fn get<K>(&self, namespace: Option<&str>, name: &str) -> Option<K>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned,
    {
        let state = lock(&self.inner);
        let kind = Self::typed_kind::<K>(&state)?;
        state.get(&kind, namespace, name).ok().and_then(from_value)
    }

    /// Every stored object of the kind, across namespaces, sorted by namespace and name.
    pub fn list<K>(&self) -> Vec<K>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned,
    {
        let state = lock(&self.inner);
        let Some(kind) = Self::typed_kind::<K>(&state) else {
            return Vec::new();
        };
        state
            .objects_of(&kind.ar.group, &kind.ar.plural, None)
            .filter_map(|(_, o)| from_value(present(&kind, o)))
            .collect()
    }

    /// [`get`](Self::get) for any kind, as JSON.
    pub fn get_dynamic(&self, ar: &ApiResource, namespace: Option<&str>, name: &str) -> Option<Value> {
        let state = lock(&self.inner);
        let kind = state.kinds.get(&ar.group, &ar.version, &ar.plural).cloned()?;
        state.get(&kind, namespace, name).ok()
    }

    /// [`list`](Self::list) for any kind, as JSON.
    pub fn list_dynamic(&self, ar: &ApiResource) -> Vec<Value> {
        let state = lock(&self.inner);
        let Some(kind) = state.kinds.get(&ar.group, &ar.version, &ar.plural).cloned() else {
            return Vec::new();
        };
        state
            .objects_of(&kind.ar.group, &kind.ar.plural, None)
            .map(|(_, o)| present(&kind, o))
            .collect()
    }

    /// Replaces `.status` as another controller would (e.g. mark a DaemonSet ready); bumps the
    /// resourceVersion and notifies watches. Returns false when the object does not exist.
    pub fn set_status<K: Resource<DynamicType = ()>>(
        &self,
        namespace: Option<&str>,
        name: &str,
        status: Value,
    ) -> bool {
        let mut state = lock(&self.inner);
        let Some(kind) = Self::typed_kind::<K>(&state) else {
            return false;
        };
        state.writer = managed::Writer {
            status: true,
            ..Default::default()
        };
        let updated = state
            .update(&kind, namespace, name, Part::Status, false, |o| {
                o["status"] = status;
                Ok(())
            })
            .is_ok();
        state.writer = managed::Writer::default();
        updated
    }

    /// Deletes an object as another actor would: finalizers hold it (deletionTimestamp is
    /// set), otherwise it is removed and its dependents garbage-collected. Returns false when
    /// the object does not exist.
    pub fn remove<K: Resource<DynamicType = ()>>(&self, namespace: Option<&str>, name: &str) -> bool {
        let mut state = lock(&self.inner);
        let Some(kind) = Self::typed_kind::<K>(&state) else {
            return false;
        };
        let key = ObjKey::new(&kind, namespace, name);
        state.begin_delete(&key, Propagation::Background).is_some()
    }

    /// Turns on claim in-use protection, as a real cluster has it: every claim created from
    /// now on (seeded ones too) gets the `kubernetes.io/pvc-protection` finalizer, and a claim
    /// being deleted keeps it, and so stays (with a `deletionTimestamp`), while a pod that is
    /// not `Succeeded` or `Failed` uses it. Deleting or finishing the last such pod lets it go.
    pub fn protect_claims_in_use(&self) {
        lock(&self.inner).protect_claims = true;
    }

    /// Turns on `metadata.managedFields`, as a real API server keeps them: every write from
    /// now on records an entry for its field manager (`testkit` for [`seed`](Self::seed) and
    /// [`set_status`](Self::set_status)) naming the fields it wrote, so objects and watch events
    /// have about the size they have on a cluster (where the entries are often as large as the
    /// rest of the object). Off by default: the entries are bookkeeping only (ownership is not
    /// split between managers; server-side apply conflicts are decided without them).
    pub fn track_managed_fields(&self) {
        lock(&self.inner).track_managed_fields = true;
    }

    /// Every request received so far, in order (including failed ones).
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.inner).requests.clone()
    }

    /// Forgets the request log, e.g. before asserting that a steady-state pass writes nothing.
    pub fn clear_requests(&self) {
        lock(&self.inner).requests.clear();
    }

    /// The non-GET requests (POST/PUT/PATCH/DELETE) received so far.
    pub fn write_requests(&self) -> Vec<RecordedRequest> {
        lock(&self.inner)
            .requests
            .iter()
            .filter(|r| r.is_write())
            .cloned()
            .collect()
    }

    /// Enforces `policy` from now on: a request it does not allow is answered 403 Forbidden,
    /// worded as the API server words it, so a test fails where a cluster with that RBAC
    /// would refuse the call. Objects seeded and read through the test's own methods
    /// ([`seed`](Self::seed), [`get`](Self::get), ...) are not requests and always pass.
    ///
    /// ```
    /// use hpp_testkit::{FakeApiServer, RbacPolicy};
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube::api::{Api, ListParams};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let fake = FakeApiServer::new();
    /// fake.enforce_rbac(RbacPolicy::from_yaml(
    ///     "kind: Role\nmetadata: {name: reader, namespace: ns}\n\
    ///      rules: [{apiGroups: [''], resources: [configmaps], verbs: [list]}]",
    /// ).unwrap());
    /// let lp = ListParams::default();
    /// assert!(Api::<ConfigMap>::namespaced(fake.client(), "ns").list(&lp).await.is_ok());
    /// let err = Api::<ConfigMap>::namespaced(fake.client(), "other").list(&lp).await.unwrap_err();
    /// assert!(matches!(err, kube::Error::Api(s) if s.code == 403 && s.reason == "Forbidden"));
    /// assert_eq!(fake.denied_requests().len(), 1);
    /// # }
    /// ```
    pub fn enforce_rbac(&self, policy: RbacPolicy) {
        lock(&self.inner).rbac = Some(policy);
    }

    /// Stops enforcing RBAC: every request is allowed again (the default).
    pub fn allow_all(&self) {
        lock(&self.inner).rbac = None;
    }

    /// The requests answered 403 Forbidden so far (by [`enforce_rbac`](Self::enforce_rbac),
    /// or by a [`FailureRule`] with that status).
    pub fn denied_requests(&self) -> Vec<RecordedRequest> {
        lock(&self.inner)
            .requests
            .iter()
            .filter(|r| r.status == 403)
            .cloned()
            .collect()
    }

    /// Makes matching requests fail; rules are checked in the order added.
    pub fn fail_requests(&self, rule: FailureRule) {
        lock(&self.inner).failures.push(rule.into());
    }

    /// Removes every failure rule.
    pub fn clear_failures(&self) {
        lock(&self.inner).failures.clear();
    }

    /// Takes the server away (`true`): every request fails at the connection level (the
    /// client sees `kube::Error::Service`) and open watches end. `false` brings it back with
    /// all objects intact.
    pub fn set_unavailable(&self, down: bool) {
        let mut state = lock(&self.inner);
        state.down = down;
        if down {
            state.down_tx.send_modify(|generation| *generation += 1);
        }
    }

    /// Stops answering (`true`): requests are taken and held, neither answered nor failed, as
    /// an API server behind a network partition or a hung one looks to a client (which sees
    /// no error until its own timeout). Open watches stay open and go on delivering what
    /// changes through other clients' requests, of which there are none while every request
    /// is held. `false` answers the held requests, in no particular order.
    pub fn set_unresponsive(&self, silent: bool) {
        lock(&self.inner).unresponsive.send_replace(silent);
    }

    /// Keeps the watch history for `window` only, as an API server's watch cache keeps a
    /// sliding window of events: a watch that resumes from a version older than the events of
    /// the window gets 410 Gone and its client must list again, unless bookmarks (sent every
    /// minute and 2 s before its timeout to a watch that allows them, as the API server's
    /// watch cache sends them) kept its version recent. By default the history keeps the last 10,000 events, however old.
    pub fn keep_history_for(&self, window: std::time::Duration) {
        lock(&self.inner).history_window = Some(window);
    }

    /// The current (latest) resourceVersion.
    pub fn resource_version(&self) -> String {
        lock(&self.inner).rv.to_string()
    }

    /// Drops the watch history, as etcd compaction does: a watch from any older
    /// resourceVersion gets a 410 Gone ERROR event and the client must re-list.
    pub fn compact_history(&self) {
        lock(&self.inner).compact();
    }

    /// A one-line-per-object listing of the store (`group/plural ns/name rv=N`, plus
    /// `deleting` and finalizers when set), for failure messages.
    pub fn dump(&self) -> String {
        let state = lock(&self.inner);
        state
            .objects
            .iter()
            .map(|(k, o)| {
                let plural = if k.group.is_empty() {
                    k.plural.clone()
                } else {
                    format!("{}/{}", k.group, k.plural)
                };
                let mut line = format!(
                    "{plural} {}/{} rv={}",
                    k.namespace,
                    k.name,
                    store::meta_str(o, "resourceVersion").unwrap_or_default()
                );
                if store::meta_str(o, "deletionTimestamp").is_some() {
                    line.push_str(" deleting");
                }
                if let Some(f) = o
                    .pointer("/metadata/finalizers")
                    .filter(|f| f.as_array().is_some_and(|a| !a.is_empty()))
                {
                    line.push_str(&format!(" finalizers={f}"));
                }
                line
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Resolves once `condition` holds, re-checking after every change to the store.
    /// Wrap it in `tokio::time::timeout` so a test fails instead of hanging.
    pub async fn wait_until(&self, mut condition: impl FnMut(&FakeApiServer) -> bool) {
        loop {
            let mut changes = lock(&self.inner).events_tx.subscribe();
            if condition(self) {
                return;
            }
            // Any event (or lag) means "something changed": re-check.
            let _ = changes.recv().await;
        }
    }
}
