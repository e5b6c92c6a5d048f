//! The controller's watch caches: one store per watched kind and label selector, so a pass
//! reads live objects from memory instead of a GET per object and a LIST per kind. The stores
//! keep objects as JSON text ([`CompactStore`]), parsed when read.
//!
//! A store answers only once its first LIST completed; until then (and always when no
//! controller runs, as in a test calling `reconcile` directly) readers fall back to the API.
//! A cache may lag behind a write the operator just made: the next pass then applies once more,
//! which server-side apply makes a no-op, and the watch event that follows brings it in line.
//!
//! Cached objects are [trimmed](trim) of what a real API server sends in bulk and no reader
//! uses (field-ownership records, `kubectl apply`'s copy, most of a node's status, all but a
//! few fields of a PersistentVolume): on a cluster these are most of the bytes of a node, and
//! the stores are most of the operator's heap.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures::FutureExt;
use kube::api::DynamicObject;
use kube::runtime::reflector::Store;
use serde::de::DeserializeOwned;

use hpp_api::HostPathProvisioner;

use crate::compact_store::Interner;
pub use crate::compact_store::{Changes, CompactStore, Unparsed};
use crate::object::{Kind, ObjectKey};

/// The annotation in which `kubectl apply` keeps a whole copy of the object it last applied.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops from a watched object of `kind` what no reader of the cache uses and the API server
/// sends in bulk: `metadata.managedFields` (field ownership, often larger than the object
/// itself; the operator applies server-side and never reads it), the last-applied annotation of
/// `kubectl apply`, of a Node's status all but its conditions (without the heartbeat time) and
/// `nodeInfo` (the images on the node alone are tens of kilobytes; placement and node loss read
/// labels, taints and conditions), and of a PersistentVolume all but the fields the pool
/// status and node loss read (`trim_volume`). Everything else is kept as the server sent it.
pub fn trim(kind: &Kind, obj: &mut DynamicObject) {
    obj.metadata.managed_fields = None;
    if let Some(annotations) = obj.metadata.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
    if kind.kind == "Node"
        && kind.group.is_empty()
        && let Some(status) = obj.data.get_mut("status").and_then(serde_json::Value::as_object_mut)
    {
        // Placement and node loss read the conditions; nodeInfo is small and says what the
        // node runs. Images, addresses, capacity and attached volumes are most of the rest.
        status.retain(|k, _| k == "conditions" || k == "nodeInfo");
        if let Some(conditions) = status.get_mut("conditions").and_then(serde_json::Value::as_array_mut) {
            for c in conditions.iter_mut().filter_map(serde_json::Value::as_object_mut) {
                c.remove("lastHeartbeatTime");
            }
        }
    }
    if kind.kind == "PersistentVolume" && kind.group.is_empty() {
        trim_volume(obj);
    }
}

/// Keeps of a PersistentVolume what the operator reads, since every PV of the cluster is
/// watched (the pool status, node loss) and a watched PV costs about 9 KB of heap as a
/// `DynamicObject` (90 MB at 10,000 PVs): of the driver's PVs the capacity, class, claim
/// (namespace, name, uid), CSI source (driver, handle, attributes), node affinity and phase;
/// of every other PV only its CSI driver and handle (so it still reads as a typed PV and is
/// told apart). Metadata keeps everything but annotations.
fn trim_volume(obj: &mut DynamicObject) {
    use serde_json::Value;
    obj.metadata.annotations = None;
    let ours = obj.data.pointer("/spec/csi/driver").and_then(Value::as_str) == Some(hpp_api::constants::DRIVER_NAME);
    if let Some(spec) = obj.data.get_mut("spec").and_then(Value::as_object_mut) {
        let keep: &[&str] = if ours {
            &["capacity", "storageClassName", "claimRef", "csi", "nodeAffinity"]
        } else {
            &["csi"]
        };
        spec.retain(|k, _| keep.contains(&k.as_str()));
        if let Some(claim) = spec.get_mut("claimRef").and_then(Value::as_object_mut) {
            claim.retain(|k, _| matches!(k.as_str(), "namespace" | "name" | "uid"));
        }
        if let Some(csi) = spec.get_mut("csi").and_then(Value::as_object_mut) {
            let keep: &[&str] = if ours {
                &["driver", "volumeHandle", "volumeAttributes"]
            } else {
                &["driver", "volumeHandle"]
            };
            csi.retain(|k, _| keep.contains(&k.as_str()));
        }
    }
    if let Some(status) = obj.data.get_mut("status").and_then(Value::as_object_mut) {
        status.retain(|k, _| k == "phase");
    }
}

/// One store per watched kind and label selector.
type Stores = BTreeMap<(Kind, String), CompactStore>;

/// How long the controller trusts what discovery said about the optional APIs (OpenShift's
/// SecurityContextConstraints, the Prometheus operator's kinds) before asking again: they come
/// and go with an add-on's install, not from one pass to the next, and asking every pass was
/// most of an idle operator's requests (`GET /apis` per pass).
pub const DISCOVERY_REFRESH: Duration = Duration::from_secs(300);

/// How long the first pass waits for the watches' first lists ([`Cache::wait_settled`]);
/// after that it reads what is missing from the API.
pub const SETTLE_LIMIT: Duration = Duration::from_secs(30);

/// How often [`Cache::wait_settled`] looks again.
const SETTLE_POLL: Duration = Duration::from_millis(20);

/// The optional APIs the API server serves, as discovery last said.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OptionalApis {
    /// `security.openshift.io` SecurityContextConstraints.
    pub scc: bool,
    /// `monitoring.coreos.com` PrometheusRules and ServiceMonitors.
    pub prometheus: bool,
}

/// Discovery's last answer and when it came, once the controller turned the memo on.
#[derive(Default)]
struct DiscoveryMemo {
    refresh: Option<Duration>,
    last: Option<(Instant, OptionalApis)>,
}

/// What [`Cache::derived_fold`] hands its `fold`.
#[derive(Debug)]
pub enum Fold<'a, T, F> {
    /// The value made last time, and each object whose fact changed since, with what `each`
    /// made of it before and what it makes now (`None`: nothing, or the object is new or
    /// gone). Every "before" is a fact an earlier fold was given: the memo of the facts and
    /// the value are kept together.
    Update(&'a T, Vec<(Option<F>, Option<F>)>),
    /// Every fact: there is no value to update (a first read, a new list, more changes than
    /// the store's journal holds).
    Rebuild(Vec<F>),
}

/// Watch caches keyed by kind and label selector. Cheap to clone (shared).
#[derive(Clone, Default)]
pub struct Cache {
    stores: Arc<RwLock<Stores>>,
    provisioners: Arc<RwLock<Option<Store<HostPathProvisioner>>>>,
    discovery: Arc<Mutex<DiscoveryMemo>>,
    /// Objects a write found existing without the managed labels (so outside the labelled
    /// stores): an older operator's. Only these are looked up before a create-only write.
    unlabelled: Arc<Mutex<BTreeSet<ObjectKey>>>,
    interner: Interner,
    derived: Arc<Mutex<Derived>>,
    /// What [`derived_each`](Self::derived_each) made of each object, per derived value.
    memos: Arc<Mutex<Memos>>,
    verified: Arc<Mutex<HashMap<u64, Verified>>>,
    /// Whether the first pass already waited for the stores (see `wait_settled`).
    settle_awaited: Arc<std::sync::atomic::AtomicBool>,
}

/// Hashes of a desired object and of the live version it was last found (or written) to
/// match, by hash of the object's key: three numbers per object, in one table, so the memo of
/// a thousand mounters is one allocation rather than thousands of small strings scattered over
/// the heap a pass grew.
type Verified = (u64, u64);

fn fnv(text: &str) -> u64 {
    hpp_api::names::fnv1a64(text.as_bytes())
}

fn key_hash(key: &ObjectKey) -> u64 {
    let mut h = hpp_api::names::Fnv1a64::default();
    h.update(key.kind.as_bytes());
    h.update(b"\0");
    h.update(key.namespace.as_deref().unwrap_or_default().as_bytes());
    h.update(b"\0");
    h.update(key.name.as_bytes());
    h.finish()
}

/// Values derived from one store, each with the store generation it was derived at.
type Derived = BTreeMap<(Kind, String, &'static str), (u64, Arc<dyn std::any::Any + Send + Sync>)>;

/// Per-object memos of derived values (`compact_store::Memo<F>` for each value's `F`).
type Memos = BTreeMap<(Kind, String, &'static str), Box<dyn std::any::Any + Send>>;

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys: Vec<String> = self
            .stores
            .read()
            .map(|s| {
                s.keys()
                    .map(|(k, sel)| format!("{}/{} {sel}", k.group, k.plural))
                    .collect()
            })
            .unwrap_or_default();
        f.debug_struct("Cache").field("stores", &keys).finish()
    }
}

impl Cache {
    /// An empty cache: every read goes to the API.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new store for `kind` objects matching `selector`, registered, sharing object text
    /// with the cache's other stores (an object two watches see is kept once).
    pub fn new_store(&self, kind: Kind, selector: &str) -> CompactStore {
        let store = CompactStore::sharing(&self.interner);
        self.insert(kind, selector, store.clone());
        store
    }

    /// Registers the store a watch fills for `kind` objects matching `selector` (a label
    /// selector string, empty for every object).
    pub fn insert(&self, kind: Kind, selector: &str, store: CompactStore) {
        if let Ok(mut stores) = self.stores.write() {
            stores.insert((kind, selector.to_owned()), store);
        }
    }

    /// Whether a store for `kind` and `selector` is registered (synced or not).
    pub fn has(&self, kind: &Kind, selector: &str) -> bool {
        self.stores
            .read()
            .is_ok_and(|s| s.contains_key(&(kind.clone(), selector.to_owned())))
    }

    fn synced(&self, kind: &Kind, selector: &str) -> Option<CompactStore> {
        let stores = self.stores.read().ok()?;
        let store = stores.get(&(kind.clone(), selector.to_owned()))?;
        store.is_ready().then(|| store.clone())
    }

    /// The cached objects of `kind` matching `selector` (in `namespace` for namespaced kinds),
    /// or `None` when there is no synced store for them and the caller must ask the API.
    pub fn list(&self, kind: &Kind, selector: &str, namespace: Option<&str>) -> Option<Vec<Arc<DynamicObject>>> {
        Some(
            self.list_typed::<DynamicObject>(kind, selector, namespace)?
                .into_iter()
                .map(Arc::new)
                .collect(),
        )
    }

    /// [`list`](Self::list), each object parsed straight into `K` (objects that are not a `K`
    /// are left out).
    pub fn list_typed<K: DeserializeOwned>(
        &self,
        kind: &Kind,
        selector: &str,
        namespace: Option<&str>,
    ) -> Option<Vec<K>> {
        let store = self.synced(kind, selector)?;
        Some(store.list(|ns| !kind.namespaced || namespace.is_none_or(|want| want == ns)))
    }

    /// [`list_typed`](Self::list_typed), each object made into an `F` by `each` as soon as it
    /// is parsed, and an object that does not parse an error (see [`CompactStore::list_map`]).
    pub fn list_map<K: DeserializeOwned, F>(
        &self,
        kind: &Kind,
        selector: &str,
        namespace: Option<&str>,
        each: impl FnMut(K) -> Option<F>,
    ) -> Option<Result<Vec<F>, Unparsed>> {
        let store = self.synced(kind, selector)?;
        Some(store.list_map(|ns| !kind.namespaced || namespace.is_none_or(|want| want == ns), each))
    }

    /// The cached object, `Some(None)` when a synced store says it does not exist, `None`
    /// when there is no synced store and the caller must ask the API.
    pub fn get(
        &self,
        kind: &Kind,
        selector: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<Option<Arc<DynamicObject>>> {
        let store = self.synced(kind, selector)?;
        Some(store.get_dynamic(store_namespace(kind, namespace), name).map(Arc::new))
    }

    /// Namespace and name of the cached objects of `kind` matching `selector` (in `namespace`
    /// for namespaced kinds) that are not being deleted, without parsing them; `None` when there
    /// is no synced store.
    pub fn keys(&self, kind: &Kind, selector: &str, namespace: Option<&str>) -> Option<Vec<(String, String)>> {
        let store = self.synced(kind, selector)?;
        Some(store.keys(|ns| !kind.namespaced || namespace.is_none_or(|want| want == ns)))
    }

    /// Whether the watch of `kind` objects matching `selector` completed its first list (its
    /// changes reach the change log; without it readers ask the API).
    pub fn is_synced(&self, kind: &Kind, selector: &str) -> bool {
        self.synced(kind, selector).is_some()
    }

    /// Whether any synced store of `kind` objects (under any selector) holds the object;
    /// `None` without a synced store of the kind.
    pub fn holds(&self, kind: &Kind, namespace: Option<&str>, name: &str) -> Option<bool> {
        let stores = self.stores.read().ok()?;
        let mut synced = stores
            .iter()
            .filter(|((k, _), store)| k == kind && store.is_ready())
            .map(|(_, store)| store)
            .peekable();
        synced.peek()?;
        Some(synced.any(|store| store.resource_version(store_namespace(kind, namespace), name).is_some()))
    }

    /// The cached object's `resourceVersion`: `Some(Some(rv))` when held, `Some(None)` when a
    /// synced store says it does not exist (or it has none), `None` without a synced store.
    pub fn resource_version(
        &self,
        kind: &Kind,
        selector: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<Option<String>> {
        let store = self.synced(kind, selector)?;
        Some(store.resource_version(store_namespace(kind, namespace), name).flatten())
    }

    /// What `derive` makes of the synced store of `kind` objects matching `selector`, worked out
    /// again only after the store changed: a pass that no PersistentVolume change triggered
    /// does not read 10,000 of them to sum the pools' usage. `what` names the derived value
    /// (several may be derived from one store). `None` when there is no synced store (the
    /// caller reads the API).
    pub fn derived<T: Send + Sync + 'static>(
        &self,
        kind: &Kind,
        selector: &str,
        what: &'static str,
        derive: impl FnOnce(&CompactStore) -> T,
    ) -> Option<Arc<T>> {
        self.derived_shared(kind, selector, what, |store| Arc::new(derive(store)))
    }

    /// [`derived`](Self::derived), for a `derive` that may hand back a value it made before.
    fn derived_shared<T: Send + Sync + 'static>(
        &self,
        kind: &Kind,
        selector: &str,
        what: &'static str,
        derive: impl FnOnce(&CompactStore) -> Arc<T>,
    ) -> Option<Arc<T>> {
        let store = self.synced(kind, selector)?;
        let generation = store.generation();
        let key = (kind.clone(), selector.to_owned(), what);
        if let Ok(derived) = self.derived.lock()
            && let Some((at, value)) = derived.get(&key)
            && *at == generation
            && let Ok(value) = value.clone().downcast::<T>()
        {
            return Some(value);
        }
        let value = derive(&store);
        // Only if the store did not change meanwhile; otherwise the next read derives again.
        if store.generation() == generation
            && let Ok(mut derived) = self.derived.lock()
        {
            derived.insert(key, (generation, value.clone()));
        }
        Some(value)
    }

    /// [`derived`](Self::derived) from one `F` per object (`each` of the object parsed into
    /// `K`; objects `keep` refuses by namespace are left out) that `make` combines. A store
    /// that changed is read again, but only the objects changed since are parsed: a per-object
    /// memo of `what` keeps what `each` made of the others, and when `each` makes of the
    /// changed ones what it made before (a mounter's new status, which no fact reads), the
    /// value made last time is handed back, the same `Arc`, without `make`.
    pub fn derived_each<K, F, T>(
        &self,
        kind: &Kind,
        selector: &str,
        what: &'static str,
        keep: impl Fn(&str) -> bool,
        each: impl Fn(K) -> Option<F>,
        make: impl FnOnce(Vec<F>) -> T,
    ) -> Option<Arc<T>>
    where
        K: DeserializeOwned,
        F: Clone + PartialEq + Send + 'static,
        T: Send + Sync + 'static,
    {
        self.derived_memo(kind, selector, what, |store, memo, last| {
            match (store.list_each(keep, memo, each), last) {
                (None, Some(last)) => last,
                (Some(made), _) => Arc::new(make(made)),
                (None, None) => Arc::new(make(memo.facts())),
            }
        })
    }

    /// [`derived_each`](Self::derived_each) for a value kept up to date from what changed:
    /// `fold` gets the value made last time and each changed object's fact before and after
    /// ([`Fold::Update`]), or every fact when there is no value to update ([`Fold::Rebuild`]).
    /// A sum over 10,000 PersistentVolumes then costs the PVs that changed, not a visit of all
    /// of them. When no fact changed, the value made last time is handed back without `fold`.
    pub fn derived_fold<K, F, T>(
        &self,
        kind: &Kind,
        selector: &str,
        what: &'static str,
        keep: impl Fn(&str) -> bool,
        each: impl Fn(K) -> Option<F>,
        fold: impl FnOnce(Fold<'_, T, F>) -> T,
    ) -> Option<Arc<T>>
    where
        K: DeserializeOwned,
        F: Clone + PartialEq + Send + 'static,
        T: Send + Sync + 'static,
    {
        self.derived_memo(kind, selector, what, |store, memo, last| {
            match (store.list_changes(keep, memo, each), last) {
                (Changes::Same, Some(last)) => last,
                (Changes::Changed(changed), Some(last)) => Arc::new(fold(Fold::Update(&last, changed))),
                (Changes::All(all), _) => Arc::new(fold(Fold::Rebuild(all))),
                // A memo kept without a value (not one `derived_memo` keeps): from every fact,
                // which the memo holds up to date.
                (_, None) => Arc::new(fold(Fold::Rebuild(memo.facts()))),
            }
        })
    }

    /// The memo of `what` (what each object made, and the value made last), handed to `step`
    /// with the store and kept for the next read.
    fn derived_memo<F, T>(
        &self,
        kind: &Kind,
        selector: &str,
        what: &'static str,
        step: impl FnOnce(&CompactStore, &mut crate::compact_store::Memo<F>, Option<Arc<T>>) -> Arc<T>,
    ) -> Option<Arc<T>>
    where
        F: Clone + PartialEq + Send + 'static,
        T: Send + Sync + 'static,
    {
        type Kept<F, T> = (crate::compact_store::Memo<F>, Option<Arc<T>>);
        self.derived_shared(kind, selector, what, |store| {
            let slot = (kind.clone(), selector.to_owned(), what);
            // Taken out while in use: a concurrent read starts from an empty memo instead of
            // waiting.
            let (mut memo, last) = self
                .memos
                .lock()
                .ok()
                .and_then(|mut m| m.remove(&slot))
                .and_then(|m| m.downcast::<Kept<F, T>>().ok())
                .map(|m| *m)
                .unwrap_or_default();
            let value = step(store, &mut memo, last);
            if let Ok(mut memos) = self.memos.lock() {
                let kept: Kept<F, T> = (memo, Some(value.clone()));
                memos.insert(slot, Box::new(kept));
            }
            value
        })
    }

    /// Whether the live version `resource_version` of `key` was already found to match the
    /// desired object of hash `desired_hash` (so comparing them again would find the same): a
    /// pass over 1,000 unchanged mounters compares none of them.
    pub fn is_verified(&self, key: &ObjectKey, desired_hash: &str, resource_version: &str) -> bool {
        let want = (fnv(desired_hash), fnv(resource_version));
        self.verified.lock().is_ok_and(|v| v.get(&key_hash(key)) == Some(&want))
    }

    /// Records that the live version `resource_version` of `key` matches the desired object of
    /// hash `desired_hash`.
    pub fn record_verified(&self, key: &ObjectKey, desired_hash: &str, resource_version: &str) {
        if let Ok(mut v) = self.verified.lock() {
            v.insert(key_hash(key), (fnv(desired_hash), fnv(resource_version)));
        }
    }

    /// Forgets what [`record_verified`](Self::record_verified) recorded of `key` (it was
    /// deleted).
    pub fn forget_verified(&self, key: &ObjectKey) {
        if let Ok(mut v) = self.verified.lock() {
            v.remove(&key_hash(key));
        }
    }

    /// Whether every registered store finished its first list or failed before it (see
    /// [`CompactStore::is_settled`]); true without stores.
    pub fn all_settled(&self) -> bool {
        self.stores
            .read()
            .map(|stores| stores.values().all(CompactStore::is_settled))
            .unwrap_or(true)
    }

    /// Waits, once per cache, until [`all_settled`](Self::all_settled) or `limit` passed,
    /// whichever is first; later calls return at once. The first pass after start-up would
    /// otherwise read from the API what the watches are still listing, the whole list in one
    /// answer and untrimmed (1,000 kubelet-sized nodes: about 50 MiB of JSON trees, the
    /// operator's high-water mark), as controller-runtime waits for its caches to sync before
    /// the first reconcile. Returns whether every store settled.
    pub async fn wait_settled(&self, limit: Duration) -> bool {
        if self.settle_awaited.load(std::sync::atomic::Ordering::Acquire) {
            return self.all_settled();
        }
        let started = Instant::now();
        let settled = loop {
            if self.all_settled() {
                break true;
            }
            if started.elapsed() >= limit {
                break false;
            }
            tokio::time::sleep(SETTLE_POLL).await;
        };
        self.settle_awaited.store(true, std::sync::atomic::Ordering::Release);
        settled
    }

    /// Objects and JSON bytes held, per watched kind and selector (for `/debug`-style
    /// accounting and tests).
    pub fn sizes(&self) -> Vec<(Kind, String, usize, usize)> {
        self.stores
            .read()
            .map(|s| {
                s.iter()
                    .map(|((k, sel), store)| {
                        let (count, bytes) = store.size();
                        (k.clone(), sel.clone(), count, bytes)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Remembers discovery's answers for `refresh` (the controller uses
    /// [`DISCOVERY_REFRESH`]); without this every pass asks the API server (as a test calling
    /// `reconcile` directly expects when it adds an API between passes).
    pub fn remember_discovery(&self, refresh: Duration) {
        if let Ok(mut memo) = self.discovery.lock() {
            memo.refresh = Some(refresh);
        }
    }

    /// What discovery said less than the refresh period ago, if the memo is on.
    pub fn discovered(&self) -> Option<OptionalApis> {
        let memo = self.discovery.lock().ok()?;
        let refresh = memo.refresh?;
        let (at, apis) = memo.last?;
        (at.elapsed() < refresh).then_some(apis)
    }

    /// Records discovery's answer (kept only while the memo is on).
    pub fn record_discovery(&self, apis: OptionalApis) {
        if let Ok(mut memo) = self.discovery.lock()
            && memo.refresh.is_some()
        {
            memo.last = Some((Instant::now(), apis));
        }
    }

    /// Forgets discovery's answer, so the next pass asks again: after a failed pass, in case an
    /// optional API went away (a miss).
    pub fn forget_discovery(&self) {
        if let Ok(mut memo) = self.discovery.lock() {
            memo.last = None;
        }
    }

    /// Whether `key` was found existing outside the labelled stores (see
    /// [`remember_unlabelled`](Self::remember_unlabelled)).
    pub fn is_unlabelled(&self, key: &ObjectKey) -> bool {
        self.unlabelled.lock().is_ok_and(|u| u.contains(key))
    }

    /// Records whether `key` exists without the managed labels: a create-only write then
    /// reads it from the API (one GET) instead of creating it (a 409 every pass).
    pub fn remember_unlabelled(&self, key: &ObjectKey, exists: bool) {
        if let Ok(mut unlabelled) = self.unlabelled.lock() {
            if exists {
                unlabelled.insert(key.clone());
            } else {
                unlabelled.remove(key);
            }
        }
    }

    /// Registers the controller's own store of HostPathProvisioner objects.
    pub fn set_provisioners(&self, store: Store<HostPathProvisioner>) {
        if let Ok(mut slot) = self.provisioners.write() {
            *slot = Some(store);
        }
    }

    /// Whether the controller's store holds another version of `hpp` than this one (a newer
    /// one: a pass's copy comes from the store); false without a store or when it lacks it.
    pub(crate) fn has_newer_provisioner(&self, hpp: &HostPathProvisioner) -> bool {
        let Ok(slot) = self.provisioners.read() else {
            return false;
        };
        let Some(store) = slot.as_ref() else { return false };
        let key = kube::runtime::reflector::ObjectRef::from(hpp);
        store
            .get(&key)
            .is_some_and(|held| held.metadata.resource_version != hpp.metadata.resource_version)
    }

    /// Every cached HostPathProvisioner, or `None` when the controller's store is not synced.
    pub fn provisioners(&self) -> Option<Vec<Arc<HostPathProvisioner>>> {
        let slot = self.provisioners.read().ok()?;
        let store = slot.as_ref()?;
        store.wait_until_ready().now_or_never()?.ok()?;
        // Shared, not copied: a CR's status lists every node's claim (2.6 MiB at 1,000 nodes),
        // and every pass reads it.
        Some(store.state())
    }
}

/// The namespace a store keys an object of `kind` under: empty for cluster-scoped kinds.
fn store_namespace<'a>(kind: &Kind, namespace: Option<&'a str>) -> &'a str {
    match kind.namespaced {
        true => namespace.unwrap_or_default(),
        false => "",
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;
    use k8s_openapi::api::apps::v1::DaemonSet;
    use k8s_openapi::api::core::v1::Node;
    use serde_json::json;

    fn object(value: serde_json::Value) -> DynamicObject {
        serde_json::from_value(value).unwrap()
    }

    fn metadata() -> serde_json::Value {
        json!({
            "name": "n1",
            "labels": { "kubernetes.io/os": "linux" },
            "annotations": { LAST_APPLIED: "{\"huge\":\"copy\"}", "keep": "me" },
            "managedFields": [{ "manager": "kubelet", "operation": "Update", "fieldsType": "FieldsV1",
                                "fieldsV1": { "f:status": { "f:images": {} } } }],
        })
    }

    #[test]
    fn trimmed_node_keeps_what_placement_reads() {
        let mut node = object(json!({
            "apiVersion": "v1", "kind": "Node", "metadata": metadata(),
            "spec": { "taints": [{ "key": "k", "effect": "NoSchedule" }] },
            "status": { "conditions": [{ "type": "Ready", "status": "True" }],
                        "images": [{ "names": ["registry/image:v1"], "sizeBytes": 1 }],
                        "nodeInfo": { "kubeletVersion": "v1.33.0" } },
        }));
        trim(&Kind::of::<Node>(), &mut node);
        assert!(node.metadata.managed_fields.is_none());
        let annotations = node.metadata.annotations.clone().unwrap();
        assert_eq!(annotations.keys().collect::<Vec<_>>(), ["keep"]);
        assert_eq!(node.metadata.labels.clone().unwrap()["kubernetes.io/os"], "linux");
        assert!(node.data.pointer("/status/images").is_none());
        assert_eq!(node.data.pointer("/status/conditions/0/type"), Some(&json!("Ready")));
        assert_eq!(
            node.data.pointer("/status/nodeInfo/kubeletVersion"),
            Some(&json!("v1.33.0"))
        );
        assert_eq!(node.data.pointer("/spec/taints/0/key"), Some(&json!("k")));
    }

    fn volume(driver: &str) -> DynamicObject {
        object(json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": "pvc-1", "uid": "u1", "finalizers": ["kubernetes.io/pv-protection"],
                         "annotations": {"pv.kubernetes.io/provisioned-by": driver}},
            "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
                     "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "fast", "volumeMode": "Filesystem",
                     "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": "apps",
                                  "name": "data", "uid": "c1", "resourceVersion": "7"},
                     "csi": {"driver": driver, "volumeHandle": "pvc-1", "fsType": "ext4",
                             "volumeAttributes": {"storagePool": "local", "nodeLossPolicy": "Recreate"}},
                     "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                         {"key": "topology.hostpath.csi/node", "operator": "In", "values": ["node02"]}]}]}}},
            "status": {"phase": "Bound", "lastPhaseTransitionTime": "2025-01-01T00:00:00Z"},
        }))
    }

    #[test]
    fn trimmed_volume_keeps_what_the_pool_status_and_node_loss_read() {
        use k8s_openapi::api::core::v1::PersistentVolume;
        let mut ours = volume(hpp_api::constants::DRIVER_NAME);
        trim(&Kind::of::<PersistentVolume>(), &mut ours);
        assert_eq!(
            ours.data,
            json!({
                "spec": {"capacity": {"storage": "1Gi"}, "storageClassName": "fast",
                         "claimRef": {"namespace": "apps", "name": "data", "uid": "c1"},
                         "csi": {"driver": hpp_api::constants::DRIVER_NAME, "volumeHandle": "pvc-1",
                                 "volumeAttributes": {"storagePool": "local", "nodeLossPolicy": "Recreate"}},
                         "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                             {"key": "topology.hostpath.csi/node", "operator": "In", "values": ["node02"]}]}]}}},
                "status": {"phase": "Bound"},
            })
        );
        assert_eq!(ours.metadata.annotations, None);
        assert_eq!(
            ours.metadata.finalizers.as_deref(),
            Some(&["kubernetes.io/pv-protection".to_owned()][..])
        );
        let mut theirs = volume("other.example.com");
        trim(&Kind::of::<PersistentVolume>(), &mut theirs);
        assert_eq!(
            theirs.data,
            json!({"spec": {"csi": {"driver": "other.example.com", "volumeHandle": "pvc-1"}},
                   "status": {"phase": "Bound"}})
        );
        // Both still read as typed PVs (what the readers deserialize them into).
        for v in [ours, theirs] {
            let typed: PersistentVolume = serde_json::from_value(serde_json::to_value(v).unwrap()).unwrap();
            assert!(typed.spec.unwrap().csi.is_some());
        }
    }

    #[test]
    fn a_derived_value_is_worked_out_again_only_after_its_store_changed() {
        use kube::runtime::watcher::Event;
        let cache = Cache::new();
        let kind = Kind::of::<Node>();
        let count = |cache: &Cache, runs: &std::cell::Cell<u32>| {
            cache.derived(&kind, "", "count", |store| {
                runs.set(runs.get() + 1);
                store.list::<DynamicObject>(|_| true).len()
            })
        };
        let runs = std::cell::Cell::new(0);
        assert!(count(&cache, &runs).is_none(), "no store: ask the API");
        let store = cache.new_store(kind.clone(), "");
        assert!(count(&cache, &runs).is_none(), "not synced yet");
        let node = |name: &str| object(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}));
        store.apply(&Event::Init);
        store.apply(&Event::InitApply(node("n1")));
        store.apply(&Event::InitDone);
        assert_eq!(*count(&cache, &runs).unwrap(), 1);
        assert_eq!(*count(&cache, &runs).unwrap(), 1);
        assert_eq!(runs.get(), 1, "the second read reuses the first");
        store.apply(&Event::Apply(node("n2")));
        assert_eq!(*count(&cache, &runs).unwrap(), 2);
        assert_eq!(runs.get(), 2);
    }

    #[test]
    fn a_value_derived_from_each_object_is_handed_back_while_the_changed_objects_make_the_same() {
        use kube::runtime::watcher::Event;
        let cache = Cache::new();
        let kind = Kind::of::<Node>();
        let makes = std::cell::Cell::new(0);
        let names = || {
            cache
                .derived_each(
                    &kind,
                    "",
                    "names",
                    |_| true,
                    |n: Node| n.metadata.name,
                    |mut names: Vec<String>| {
                        makes.set(makes.get() + 1);
                        names.sort();
                        names
                    },
                )
                .unwrap()
        };
        let store = cache.new_store(kind.clone(), "");
        store.apply(&Event::Init);
        store.apply(&Event::InitApply(node_in_zone("n1", "a")));
        store.apply(&Event::InitApply(node_in_zone("n2", "a")));
        store.apply(&Event::InitDone);
        let first = names();
        assert_eq!(*first, ["n1", "n2"]);
        // A label no fact reads: the store changed, the value is the one made before.
        store.apply(&Event::Apply(node_in_zone("n1", "b")));
        let second = names();
        assert!(Arc::ptr_eq(&first, &second), "the same value, not made again");
        assert_eq!(makes.get(), 1);
        store.apply(&Event::Apply(node_in_zone("n3", "a")));
        assert_eq!(*names(), ["n1", "n2", "n3"]);
        assert_eq!(makes.get(), 2);
    }

    /// A Node named `name` labelled `zone`.
    fn node_in_zone(name: &str, zone: &str) -> DynamicObject {
        object(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"zone": zone}}}))
    }

    /// A folded value gets only the objects whose facts changed, each before and after, and
    /// every fact when it has nothing to start from.
    #[test]
    fn a_folded_value_is_updated_from_the_changed_objects_only() {
        use kube::runtime::watcher::Event;
        let cache = Cache::new();
        let kind = Kind::of::<Node>();
        // What each fold was given: every fact (how many), or the changed ones.
        type Given = Result<Vec<(Option<String>, Option<String>)>, usize>;
        let seen: std::cell::RefCell<Vec<Given>> = Default::default();
        let zones = || {
            cache
                .derived_fold(
                    &kind,
                    "",
                    "zones",
                    |_| true,
                    |n: Node| n.metadata.labels?.get("zone").cloned(),
                    |fold: Fold<'_, Vec<String>, String>| {
                        let mut zones = match fold {
                            Fold::Rebuild(all) => {
                                seen.borrow_mut().push(Err(all.len()));
                                all
                            }
                            Fold::Update(last, changed) => {
                                seen.borrow_mut().push(Ok(changed.clone()));
                                let mut zones = last.clone();
                                for (before, after) in changed {
                                    if let Some(b) = before
                                        && let Some(i) = zones.iter().position(|z| *z == b)
                                    {
                                        zones.remove(i);
                                    }
                                    zones.extend(after);
                                }
                                zones
                            }
                        };
                        zones.sort();
                        zones
                    },
                )
                .unwrap()
        };
        let store = cache.new_store(kind.clone(), "");
        store.apply(&Event::Init);
        for i in 0..100 {
            store.apply(&Event::InitApply(node_in_zone(&format!("n{i}"), "a")));
        }
        store.apply(&Event::InitDone);
        assert_eq!(zones().len(), 100);
        assert_eq!(seen.borrow()[0], Err(100), "every fact, to start from");
        store.apply(&Event::Apply(node_in_zone("n7", "b")));
        store.apply(&Event::Delete(node_in_zone("n8", "a")));
        let now = zones();
        assert_eq!((now.len(), now.last().map(String::as_str)), (99, Some("b")));
        let Ok(mut changed) = seen.borrow()[1].clone() else {
            panic!("not folded from the changes: {:?}", seen.borrow()[1]);
        };
        changed.sort();
        assert_eq!(
            changed,
            [(Some("a".into()), None), (Some("a".into()), Some("b".into()))],
            "the two changed nodes, not the 100"
        );
        // A change no fact reads: the value made before, not folded again.
        let before = zones();
        store.apply(&Event::Apply(object(
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n9", "labels": {"zone": "a", "x": "y"}}}),
        )));
        assert!(Arc::ptr_eq(&before, &zones()));
        assert_eq!(seen.borrow().len(), 2);
    }

    #[test]
    fn discovery_is_remembered_only_when_asked_and_until_forgotten_or_stale() {
        let cache = Cache::new();
        let apis = OptionalApis {
            scc: true,
            prometheus: false,
        };
        cache.record_discovery(apis);
        assert_eq!(cache.discovered(), None, "off by default: every pass asks");
        cache.remember_discovery(Duration::from_secs(300));
        assert_eq!(cache.discovered(), None, "nothing recorded yet");
        cache.record_discovery(apis);
        assert_eq!(cache.discovered(), Some(apis));
        cache.clone().forget_discovery();
        assert_eq!(cache.discovered(), None, "clones share the memo");
        cache.remember_discovery(Duration::ZERO);
        cache.record_discovery(apis);
        assert_eq!(cache.discovered(), None, "stale at once");
    }

    #[test]
    fn trimmed_object_of_another_kind_keeps_its_status() {
        let mut ds = object(json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": metadata(),
            "spec": { "template": { "spec": { "containers": [] } } },
            "status": { "images": "not a node's", "numberReady": 3 },
        }));
        trim(&Kind::of::<DaemonSet>(), &mut ds);
        assert!(ds.metadata.managed_fields.is_none());
        assert_eq!(ds.data.pointer("/status/images"), Some(&json!("not a node's")));
        assert_eq!(ds.data.pointer("/status/numberReady"), Some(&json!(3)));
    }

    #[tokio::test]
    async fn the_first_pass_waits_for_listing_watches_but_not_for_failed_ones_and_only_once() {
        use kube::runtime::watcher::Event;
        let cache = Cache::default();
        assert!(cache.all_settled(), "no stores: nothing to wait for");
        let listed = cache.new_store(Kind::of::<Node>(), "");
        let failing = cache.new_store(Kind::of::<DaemonSet>(), "");
        assert!(!cache.all_settled());
        listed.apply(&Event::Init);
        listed.apply(&Event::InitDone);
        failing.note_failure();
        assert!(cache.all_settled(), "a failed watch is not waited for");

        let cache = Cache::default();
        let listing = cache.new_store(Kind::of::<Node>(), "");
        assert!(
            !cache.wait_settled(Duration::from_millis(50)).await,
            "still listing at the limit"
        );
        listing.apply(&Event::Init);
        assert!(
            !cache.wait_settled(Duration::from_secs(3600)).await,
            "waited once: later passes do not wait"
        );
        listing.apply(&Event::InitDone);
        assert!(cache.wait_settled(Duration::from_secs(3600)).await);
    }
}
