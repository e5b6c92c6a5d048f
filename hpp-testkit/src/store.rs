//! The object store: objects keyed by group/plural/namespace/name, the global resourceVersion
//! counter, the watch event history and owner-reference garbage collection.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::{broadcast, watch};

use super::faults::ActiveFailure;
use super::kinds::{KindInfo, Kinds};
use super::managed::{self, Writer};
use super::record::RecordedRequest;

/// How many watch events the history keeps before older resourceVersions become "too old".
pub(crate) const HISTORY_CAPACITY: usize = 10_000;

/// Identity of a stored object; version-independent, like etcd keys.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ObjKey {
    pub group: String,
    pub plural: String,
    /// "" for cluster-scoped objects.
    pub namespace: String,
    pub name: String,
}

impl ObjKey {
    /// The key of `name` in `namespace` for `kind` (namespace ignored for cluster-scoped kinds).
    pub(crate) fn new(kind: &KindInfo, namespace: Option<&str>, name: &str) -> Self {
        Self {
            group: kind.ar.group.clone(),
            plural: kind.ar.plural.clone(),
            namespace: if kind.namespaced {
                namespace.unwrap_or_default().to_string()
            } else {
                String::new()
            },
            name: name.to_string(),
        }
    }
}

/// Watch event type as it appears on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One change, kept in the history and broadcast to open watches.
#[derive(Debug, Clone)]
pub(crate) struct StoredEvent {
    pub rv: u64,
    pub key: ObjKey,
    pub kind: EventType,
    /// The object before the change (for selector transitions).
    pub old: Option<Value>,
    /// The object after the change (the last state for DELETED).
    pub object: Value,
    /// When it happened (for [`State::history_window`]).
    pub at: tokio::time::Instant,
}

/// Missed events plus the live feed, handed to a new watch.
pub(crate) type Subscription = (Vec<Arc<StoredEvent>>, broadcast::Receiver<Arc<StoredEvent>>);

/// How dependents are treated when their owner goes away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Propagation {
    /// Delete dependents whose owners are all gone (the default, done synchronously).
    #[default]
    Background,
    /// Same as background here: dependents are deleted synchronously before the response.
    Foreground,
    /// Strip the owner reference and keep dependents.
    Orphan,
}

/// Everything behind the fake's mutex.
#[derive(Debug)]
pub(crate) struct State {
    pub kinds: Kinds,
    pub objects: BTreeMap<ObjKey, Value>,
    /// Who is who, kept with `objects` (see `index`): the key of each uid, and the keys of
    /// the objects naming each uid as an owner. A real API server's garbage collector keeps
    /// such a graph; scanning every object per deletion made the fake's deletes O(objects)
    /// (about 5 ms each at 4,000 objects in a debug build: a burst of 1,000 deletes measured
    /// the fake, not the client).
    pub uids: HashMap<String, ObjKey>,
    pub dependents: HashMap<String, BTreeSet<ObjKey>>,
    pub rv: u64,
    pub counter: u64,
    pub history: VecDeque<Arc<StoredEvent>>,
    /// resourceVersions older than this are gone from the history (watch → 410).
    pub floor_rv: u64,
    pub events_tx: broadcast::Sender<Arc<StoredEvent>>,
    /// Last applied configuration per object, subresource flag and field manager.
    pub applied: BTreeMap<(ObjKey, bool), BTreeMap<String, Value>>,
    /// Propagation policy chosen at DELETE time for objects still held by finalizers (by uid).
    pub pending_policy: BTreeMap<String, Propagation>,
    pub requests: Vec<RecordedRequest>,
    pub failures: Vec<ActiveFailure>,
    pub down: bool,
    /// Bumped whenever the server goes down, which ends every open watch.
    pub down_tx: watch::Sender<u64>,
    /// `true` while requests are taken and not answered (see `set_unresponsive`).
    pub unresponsive: watch::Sender<bool>,
    /// Claims get the pvc-protection finalizer and lose it once unused (see `protection`).
    pub protect_claims: bool,
    /// Set while the protection controller commits, so its own writes do not re-enter it.
    pub protection_running: bool,
    /// When set, requests it does not allow are answered 403 (see `rbac`).
    pub rbac: Option<crate::rbac::RbacPolicy>,
    /// Objects carry `metadata.managedFields` (see `managed`).
    pub track_managed_fields: bool,
    /// When set, events older than this are gone for a watch that resumes (see
    /// `FakeApiServer::keep_history_for`).
    pub history_window: Option<std::time::Duration>,
    /// Who the write being served comes from (for `managedFields`).
    pub writer: Writer,
}

/// `now` in the RFC 3339, whole-second form the API server uses.
pub(crate) fn now() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    k8s_openapi::jiff::Timestamp::from_second(now.as_second())
        .unwrap_or(now)
        .to_string()
}

/// The uids in `metadata.ownerReferences`.
pub(crate) fn owner_uids(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .map(|refs| {
            refs.iter()
                .filter_map(|r| r.get("uid").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether the object carries any finalizer.
pub(crate) fn has_finalizers(obj: &Value) -> bool {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty())
}

/// A string field under `metadata`.
pub(crate) fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata").and_then(|m| m.get(field)).and_then(Value::as_str)
}

/// Sets `metadata.<field>`, creating `metadata` if missing.
pub(crate) fn set_meta(obj: &mut Value, field: &str, value: Value) {
    if !obj.is_object() {
        *obj = json!({});
    }
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    obj["metadata"][field] = value;
}

/// Removes `metadata.<field>` if present.
pub(crate) fn remove_meta(obj: &mut Value, field: &str) {
    if let Some(Value::Object(meta)) = obj.get_mut("metadata") {
        meta.remove(field);
    }
}

impl State {
    /// An empty store serving the built-in kinds.
    pub(crate) fn new() -> Self {
        let (events_tx, _) = broadcast::channel(4096);
        let (down_tx, _) = watch::channel(0);
        Self {
            kinds: Kinds::builtin(),
            objects: BTreeMap::new(),
            uids: HashMap::new(),
            dependents: HashMap::new(),
            rv: 1,
            counter: 0,
            history: VecDeque::new(),
            floor_rv: 0,
            events_tx,
            applied: BTreeMap::new(),
            pending_policy: BTreeMap::new(),
            requests: Vec::new(),
            failures: Vec::new(),
            down: false,
            down_tx,
            unresponsive: watch::channel(false).0,
            protect_claims: false,
            protection_running: false,
            rbac: None,
            track_managed_fields: false,
            history_window: None,
            writer: Writer::default(),
        }
    }

    /// A fresh uid (a valid UUID string, unique within this server).
    pub(crate) fn next_uid(&mut self) -> String {
        self.counter += 1;
        format!("6e1f0c2a-0000-4000-8000-{:012x}", self.counter)
    }

    /// The suffix for `generateName` (5 characters from the real server's alphabet).
    pub(crate) fn next_suffix(&mut self) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        self.counter += 1;
        let mut n = self.counter.wrapping_mul(2_654_435_761);
        (0..5)
            .map(|_| {
                let c = ALPHABET[(n % ALPHABET.len() as u64) as usize] as char;
                n /= ALPHABET.len() as u64;
                c
            })
            .collect()
    }

    fn record_event(&mut self, event: StoredEvent) {
        let event = Arc::new(event);
        self.history.push_back(event.clone());
        while self.history.len() > HISTORY_CAPACITY {
            if let Some(old) = self.history.pop_front() {
                self.floor_rv = old.rv;
            }
        }
        // No receivers is fine: nobody is watching.
        let _ = self.events_tx.send(event);
    }

    /// Forgets the event history: watches from any earlier resourceVersion get 410 Gone.
    pub(crate) fn compact(&mut self) {
        self.history.clear();
        self.floor_rv = self.rv;
    }

    /// Stores `obj` under `key`, keeping the uid and owner indexes in step.
    fn put(&mut self, key: &ObjKey, obj: Value) {
        if let Some(old) = self.objects.get(key).cloned() {
            self.unindex(key, &old);
        }
        if let Some(uid) = meta_str(&obj, "uid") {
            self.uids.insert(uid.to_owned(), key.clone());
        }
        for owner in owner_uids(&obj) {
            self.dependents.entry(owner).or_default().insert(key.clone());
        }
        self.objects.insert(key.clone(), obj);
    }

    /// Removes the object under `key` from the store and the indexes.
    fn take(&mut self, key: &ObjKey) -> Option<Value> {
        let obj = self.objects.remove(key)?;
        self.unindex(key, &obj);
        Some(obj)
    }

    fn unindex(&mut self, key: &ObjKey, obj: &Value) {
        if let Some(uid) = meta_str(obj, "uid")
            && self.uids.get(uid) == Some(key)
        {
            self.uids.remove(uid);
        }
        for owner in owner_uids(obj) {
            if let Some(set) = self.dependents.get_mut(&owner) {
                set.remove(key);
                if set.is_empty() {
                    self.dependents.remove(&owner);
                }
            }
        }
    }

    /// Stores `new` for `key` (bumping resourceVersion and emitting a watch event) unless it is
    /// identical to what is stored. An object being deleted whose finalizers are now empty is
    /// removed instead, which garbage-collects its dependents.
    pub(crate) fn commit(&mut self, key: &ObjKey, mut new: Value) -> Value {
        let old = self.objects.get(key).cloned();
        if self.track_managed_fields {
            // A write that changes nothing but who claims the fields is no change.
            if old
                .as_ref()
                .is_some_and(|o| managed::without(o) == managed::without(&new))
            {
                return old.unwrap_or(new);
            }
        } else if old.as_ref() == Some(&new) {
            return new;
        }
        if meta_str(&new, "deletionTimestamp").is_some() && !has_finalizers(&new) {
            let uid = meta_str(&new, "uid").unwrap_or_default().to_string();
            let policy = self.pending_policy.remove(&uid).unwrap_or_default();
            self.put(key, new);
            return self.remove(key, policy).unwrap_or(Value::Null);
        }
        self.rv += 1;
        set_meta(&mut new, "resourceVersion", json!(self.rv.to_string()));
        if self.track_managed_fields {
            managed::stamp(old.as_ref(), &mut new, &self.writer, &now());
        }
        self.put(key, new.clone());
        self.sync_crd(key, &new, true);
        self.record_event(StoredEvent {
            rv: self.rv,
            key: key.clone(),
            kind: if old.is_some() {
                EventType::Modified
            } else {
                EventType::Added
            },
            old,
            object: new.clone(),
            at: tokio::time::Instant::now(),
        });
        self.after_storage_change(key);
        new
    }

    /// Removes the object now (no finalizer check), emits DELETED and garbage-collects.
    pub(crate) fn remove(&mut self, key: &ObjKey, policy: Propagation) -> Option<Value> {
        let mut obj = self.take(key)?;
        self.rv += 1;
        set_meta(&mut obj, "resourceVersion", json!(self.rv.to_string()));
        self.applied.retain(|(k, _), _| k != key);
        self.record_event(StoredEvent {
            rv: self.rv,
            key: key.clone(),
            kind: EventType::Deleted,
            old: None,
            object: obj.clone(),
            at: tokio::time::Instant::now(),
        });
        if let Some(uid) = meta_str(&obj, "uid") {
            let uid = uid.to_string();
            self.pending_policy.remove(&uid);
            self.collect_garbage(&uid, policy);
        }
        if key.group.is_empty() && key.plural == "namespaces" {
            self.empty_namespace(&key.name);
        }
        for owner in owner_uids(&obj) {
            self.release_foreground(&owner);
        }
        self.sync_crd(key, &obj, false);
        self.after_storage_change(key);
        Some(obj)
    }

    /// Starts deleting an object: sets `deletionTimestamp` when finalizers hold it, removes it
    /// otherwise. Returns the object and whether it is gone.
    pub(crate) fn begin_delete(&mut self, key: &ObjKey, policy: Propagation) -> Option<(Value, bool)> {
        let obj = self.objects.get(key)?.clone();
        if !has_finalizers(&obj) {
            return self.remove(key, policy).map(|o| (o, true));
        }
        if meta_str(&obj, "deletionTimestamp").is_some() {
            return Some((obj, false));
        }
        let uid = meta_str(&obj, "uid").unwrap_or_default().to_string();
        self.pending_policy.insert(uid, policy);
        let mut deleting = obj;
        set_meta(&mut deleting, "deletionTimestamp", json!(now()));
        set_meta(&mut deleting, "deletionGracePeriodSeconds", json!(0));
        Some((self.commit(key, deleting), false))
    }

    /// Starts deleting with a propagation policy: Foreground first deletes the dependents
    /// (the owner waits under the `foregroundDeletion` finalizer for those that block it).
    pub(crate) fn delete_with(&mut self, key: &ObjKey, policy: Propagation) -> Option<(Value, bool)> {
        if policy == Propagation::Foreground
            && let Some(outcome) = self.begin_foreground(key)
        {
            return Some(outcome);
        }
        self.begin_delete(key, policy)
    }

    /// Objects of (group, plural), optionally in one namespace, in key order.
    pub(crate) fn objects_of<'a>(
        &'a self,
        group: &'a str,
        plural: &'a str,
        namespace: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a ObjKey, &'a Value)> + 'a {
        // Keys sort by group, plural, namespace, name: the kind's objects (in one namespace)
        // are one range, found without scanning every other kind's.
        let start = ObjKey {
            group: group.to_owned(),
            plural: plural.to_owned(),
            namespace: namespace.unwrap_or_default().to_owned(),
            name: String::new(),
        };
        self.objects.range(start..).take_while(move |(k, _)| {
            k.group == group && k.plural == plural && namespace.is_none_or(|ns| k.namespace == ns)
        })
    }

    /// History events newer than `rv` plus a live subscription, taken atomically so no event
    /// is lost or repeated. `Err(floor)` when `rv` is older than the kept history.
    pub(crate) fn subscribe_from(&self, rv: u64) -> Result<Subscription, u64> {
        // The newest event past the window is the oldest version a watch may resume from.
        let aged_out = self.history_window.and_then(|window| {
            self.history
                .iter()
                .take_while(|e| e.at.elapsed() > window)
                .last()
                .map(|e| e.rv)
        });
        let floor = self.floor_rv.max(aged_out.unwrap_or(0));
        if rv < floor {
            return Err(floor);
        }
        let backlog = self.history.iter().filter(|e| e.rv > rv).cloned().collect();
        Ok((backlog, self.events_tx.subscribe()))
    }
}
