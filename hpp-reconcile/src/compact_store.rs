//! A watch store that keeps each object as its JSON text rather than as a parsed
//! `DynamicObject`.
//!
//! A `DynamicObject` is a tree of `serde_json::Value`s: every key a heap string, every map a
//! B-tree, about five times the bytes of the JSON it came from. The controller watches every
//! node and, per node, a pool claim and a mounter Deployment, so at 1,000 nodes the parsed
//! stores were most of the operator's heap (67 MiB of it at the first convergence, measured
//! with heaptrack). Kept as text, the same objects take their JSON size; a pass parses what it
//! reads, one object at a time, straight into the type it wants.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock, Weak};

use kube::ResourceExt;
use kube::api::DynamicObject;
use kube::runtime::watcher::Event;
use serde::de::DeserializeOwned;

/// Namespace (empty for cluster-scoped objects) and name.
type Key = (String, String);

fn key_of(obj: &DynamicObject) -> Key {
    (obj.namespace().unwrap_or_default(), obj.name_any())
}

/// One copy of each object version's text for every store that shares it: the controller
/// watches some kinds under two selectors (pool claims and mounters by their pool label, and by
/// the managed-by label), so the same object would otherwise be kept twice. Keyed by uid and
/// resourceVersion, which name one version's content.
#[derive(Clone, Default)]
pub struct Interner {
    inner: Arc<Mutex<InternTable>>,
}

/// One version's text, shared by the stores holding it. The text sits in its own allocation
/// behind the shared one, so the table's weak reference to a version no store holds any more
/// keeps 32 bytes alive until the next sweep, not the whole text (a `Weak<str>` would keep the
/// text's memory: with every node heartbeating, a second copy of every node's text).
type Text = Arc<Box<str>>;

#[derive(Default)]
struct InternTable {
    texts: HashMap<(String, String), Weak<Box<str>>>,
    /// Size at which dead entries are swept next.
    sweep_at: usize,
}

impl Interner {
    /// The shared text of `obj`'s current version, encoding it if no store holds it yet.
    fn text_of(&self, obj: &DynamicObject) -> Option<Text> {
        let (Some(uid), Some(rv)) = (obj.metadata.uid.as_deref(), obj.metadata.resource_version.as_deref()) else {
            return encode(obj);
        };
        let Ok(mut table) = self.inner.lock() else {
            return encode(obj);
        };
        let key = (uid.to_owned(), rv.to_owned());
        if let Some(text) = table.texts.get(&key).and_then(Weak::upgrade) {
            return Some(text);
        }
        let text = encode(obj)?;
        table.texts.insert(key, Arc::downgrade(&text));
        if table.texts.len() >= table.sweep_at {
            table.texts.retain(|_, text| text.strong_count() > 0);
            table.sweep_at = (table.texts.len() * 2).max(1024);
        }
        Some(text)
    }
}

/// One object: its text, and what passes ask of every object without parsing it.
#[derive(Clone)]
struct Entry {
    text: Text,
    /// Where `metadata.resourceVersion` is in `text` (start, length), kept as offsets so an
    /// entry adds no allocation of its own.
    resource_version: Option<(u32, u32)>,
    /// Whether `metadata.deletionTimestamp` is set (the sweep leaves such objects alone).
    terminating: bool,
}

impl Entry {
    fn of(obj: &DynamicObject, text: Text) -> Self {
        let resource_version = obj.metadata.resource_version.as_deref().and_then(|rv| {
            let (start, end) = version_span(&text)?;
            (&text[start..end] == rv).then_some((u32::try_from(start).ok()?, u32::try_from(end - start).ok()?))
        });
        Entry {
            text,
            resource_version,
            terminating: obj.metadata.deletion_timestamp.is_some(),
        }
    }

    fn resource_version(&self) -> Option<&str> {
        let (start, len) = self.resource_version?;
        let start = start as usize;
        self.text.get(start..start + len as usize)
    }
}

/// What [`CompactStore::list_each`] made of each object, by namespace and name, with the
/// version it was made of. The weak reference keeps that version's address from being reused
/// while the memo holds it (a weak `Arc` keeps its allocation, though not the text), so an
/// address the memo knows is the same version; the text itself is freed with the store's last
/// copy.
pub struct Memo<F> {
    seen: HashMap<Key, (Weak<Box<str>>, Option<F>)>,
    /// The store and its generation at the last read (`None` before the first).
    at: Option<(StoreId, u64)>,
}

impl<F> Default for Memo<F> {
    fn default() -> Self {
        Memo {
            seen: HashMap::new(),
            at: None,
        }
    }
}

impl<F: Clone> Memo<F> {
    /// What `each` made of the objects at the last read.
    pub fn facts(&self) -> Vec<F> {
        self.seen.values().filter_map(|(_, fact)| fact.clone()).collect()
    }
}

/// What [`CompactStore::list_changes`] found since a memo's last read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Changes<F> {
    /// What `each` makes of the objects is what it made at the last read.
    Same,
    /// Followed from the store's journal: each object whose fact changed, with what `each`
    /// made of it before and what it makes now (`None`: nothing, or the object is new or gone).
    Changed(Vec<(Option<F>, Option<F>)>),
    /// Every fact: the memo could not follow the journal (its first read, another store's
    /// memo, more changes than the journal holds, a new list).
    All(Vec<F>),
}

/// A store's identity, so a memo's generation is only ever compared with the generations of
/// the store it read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct StoreId(u64);

impl Default for StoreId {
    fn default() -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        StoreId(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }
}

/// Changes a store remembers by key, for readers a few changes behind
/// ([`CompactStore::list_each`]); one further behind reads every object.
const JOURNAL: usize = 128;

#[derive(Default)]
struct Inner {
    objects: HashMap<Key, Entry>,
    /// Objects of a (re-)list in progress; they replace `objects` when it is done.
    relisting: Option<HashMap<Key, Entry>>,
    /// Whether a first list completed.
    ready: bool,
    /// Whether the watch failed before its first list completed (the kind not served, the
    /// list forbidden): readers ask the API, and nobody should wait for this store.
    failed: bool,
    /// Bumped by every change readers can see (an object set, removed, or a list swapped in).
    generation: u64,
    /// The last [`JOURNAL`] objects set or removed, each with the generation it made.
    journal: std::collections::VecDeque<(u64, Key)>,
    /// The journal holds every change after this generation.
    journal_from: u64,
    id: StoreId,
}

impl Inner {
    /// One object set or removed.
    fn changed(&mut self, key: Key) {
        self.generation += 1;
        self.journal.push_back((self.generation, key));
        if self.journal.len() > JOURNAL
            && let Some((generation, _)) = self.journal.pop_front()
        {
            self.journal_from = generation;
        }
    }

    /// The keys changed after `generation` of store `id`, if the journal holds every one of
    /// them.
    fn changed_since(&self, (id, generation): (StoreId, u64)) -> Option<std::collections::HashSet<&Key>> {
        (id == self.id && generation >= self.journal_from && generation <= self.generation).then(|| {
            self.journal
                .iter()
                .rev()
                .take_while(|(g, _)| *g > generation)
                .map(|(_, key)| key)
                .collect()
        })
    }
}

/// The objects a watch reported, as JSON text. Cheap to clone (shared).
#[derive(Clone, Default)]
pub struct CompactStore {
    inner: Arc<RwLock<Inner>>,
    interner: Interner,
}

impl CompactStore {
    /// An empty store, not ready until a list completes.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store that shares the text of identical object versions with the other
    /// stores of `interner`.
    pub fn sharing(interner: &Interner) -> Self {
        CompactStore {
            inner: Arc::default(),
            interner: interner.clone(),
        }
    }

    /// Applies a watch event, as kube's reflector does: a re-list builds a new set and swaps it
    /// in when done, so readers never see a half-listed store.
    pub fn apply(&self, event: &Event<DynamicObject>) {
        let Ok(mut inner) = self.inner.write() else { return };
        match event {
            Event::Init => inner.relisting = Some(HashMap::new()),
            Event::InitApply(obj) => {
                if let (Some(set), Some(text)) = (inner.relisting.as_mut(), self.interner.text_of(obj)) {
                    set.insert(key_of(obj), Entry::of(obj, text));
                }
            }
            Event::InitDone => {
                if let Some(set) = inner.relisting.take() {
                    inner.objects = set;
                }
                inner.ready = true;
                inner.generation += 1;
                // A new list: readers of an older generation read every object.
                inner.journal.clear();
                inner.journal_from = inner.generation;
            }
            Event::Apply(obj) => {
                if let Some(text) = self.interner.text_of(obj) {
                    let key = key_of(obj);
                    // A new version with nothing else new (a node heartbeat, its time trimmed
                    // away) changes nothing a reader sees but the version: the text held stays,
                    // so a quiet cluster's heartbeats leave no new allocation behind (it would
                    // land wherever the heap had room and pin that page). Its older
                    // resourceVersion is still a version of exactly this content.
                    let unchanged = inner
                        .objects
                        .get(&key)
                        .is_some_and(|old| same_but_version(&old.text, &text));
                    if !unchanged {
                        inner.objects.insert(key.clone(), Entry::of(obj, text));
                        inner.changed(key);
                    }
                }
            }
            Event::Delete(obj) => {
                let key = key_of(obj);
                inner.objects.remove(&key);
                inner.changed(key);
            }
        }
    }

    /// A number that changes whenever what readers see changes: what was derived from the
    /// store at one generation holds as long as it stays.
    pub fn generation(&self) -> u64 {
        self.inner.read().map(|i| i.generation).unwrap_or(0)
    }

    /// Whether a first list completed (before that, readers ask the API).
    pub fn is_ready(&self) -> bool {
        self.inner.read().is_ok_and(|i| i.ready)
    }

    /// Records that the watch failed (an error event). Before the first list completed, the
    /// store counts as settled: waiting for it would wait for a kind the cluster may not serve.
    pub fn note_failure(&self) {
        if let Ok(mut inner) = self.inner.write() {
            inner.failed = true;
        }
    }

    /// Whether the first list completed or the watch failed before it did: there is nothing
    /// worth waiting for.
    pub fn is_settled(&self) -> bool {
        self.inner.read().is_ok_and(|i| i.ready || i.failed)
    }

    /// The object `namespace`/`name` (empty namespace for cluster-scoped objects), parsed.
    pub fn get<K: DeserializeOwned>(&self, namespace: &str, name: &str) -> Option<K> {
        let inner = self.inner.read().ok()?;
        let entry = inner.objects.get(&(namespace.to_owned(), name.to_owned()))?;
        decode(&entry.text)
    }

    /// [`get`](Self::get) as a `DynamicObject`, parsed the fast way
    /// (`object::dynamic_from_str`).
    pub fn get_dynamic(&self, namespace: &str, name: &str) -> Option<DynamicObject> {
        let inner = self.inner.read().ok()?;
        let entry = inner.objects.get(&(namespace.to_owned(), name.to_owned()))?;
        crate::object::dynamic_from_str(&entry.text).ok()
    }

    /// Whether the object `namespace`/`name` is held, and its `resourceVersion` if so, without
    /// parsing it.
    pub fn resource_version(&self, namespace: &str, name: &str) -> Option<Option<String>> {
        let inner = self.inner.read().ok()?;
        let entry = inner.objects.get(&(namespace.to_owned(), name.to_owned()))?;
        Some(entry.resource_version().map(str::to_owned))
    }

    /// Namespace and name of every object `keep` accepts by namespace that is not being
    /// deleted, without parsing any: the sweep needs only who is there.
    pub fn keys(&self, keep: impl Fn(&str) -> bool) -> Vec<(String, String)> {
        let Ok(inner) = self.inner.read() else {
            return Vec::new();
        };
        inner
            .objects
            .iter()
            .filter(|((ns, _), entry)| !entry.terminating && keep(ns))
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// Every object `keep` accepts by namespace, each parsed into `K`; objects that do not
    /// parse as `K` are left out.
    pub fn list<K: DeserializeOwned>(&self, keep: impl Fn(&str) -> bool) -> Vec<K> {
        let Ok(inner) = self.inner.read() else {
            return Vec::new();
        };
        inner
            .objects
            .iter()
            .filter(|((ns, _), _)| keep(ns))
            .filter_map(|(_, entry)| decode(&entry.text))
            .collect()
    }

    /// Every object `keep` accepts by namespace, each made into an `F` by `each` as soon as
    /// it is parsed: only the `F`s are held, never every parsed object at once (10,000
    /// PersistentVolumes parsed whole are tens of MiB; what a reader keeps of each, a few
    /// hundred bytes). Unlike [`list`](Self::list), an object that does not parse as `K` is
    /// an error: a reader that judges what is missing (the volume audit) must not take an
    /// object it could not read for one that is not there. `each` runs under the store's
    /// read lock: it must not write to the store.
    pub fn list_map<K: DeserializeOwned, F>(
        &self,
        keep: impl Fn(&str) -> bool,
        mut each: impl FnMut(K) -> Option<F>,
    ) -> Result<Vec<F>, Unparsed> {
        let Ok(inner) = self.inner.read() else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for ((namespace, name), entry) in inner.objects.iter().filter(|((ns, _), _)| keep(ns)) {
            let object = serde_json::from_str(&entry.text).map_err(|source| Unparsed {
                namespace: namespace.clone(),
                name: name.clone(),
                source,
            })?;
            out.extend(each(object));
        }
        Ok(out)
    }

    /// [`list`](Self::list), each object parsed into `K` and made into an `F` by `each`, but
    /// only the versions `memo` has not seen: after one of 1,000 mounters changed, a pass
    /// parses that one and reuses what it made of the other 999. `None` when what `each` makes
    /// of the objects is what it made at the last read with `memo`, found from the store's
    /// journal without visiting the other objects (a mounter's new status changes no fact).
    pub fn list_each<K: DeserializeOwned, F: Clone + PartialEq>(
        &self,
        keep: impl Fn(&str) -> bool,
        memo: &mut Memo<F>,
        each: impl Fn(K) -> Option<F>,
    ) -> Option<Vec<F>> {
        match self.list_changes(keep, memo, each) {
            Changes::Same => None,
            Changes::Changed(_) => Some(memo.facts()),
            Changes::All(all) => Some(all),
        }
    }

    /// [`list_each`](Self::list_each), saying what changed rather than listing every fact when
    /// the store's journal tells: a value kept up to date from the changes (a sum over 10,000
    /// PersistentVolumes) costs the changed objects, not a visit of every fact.
    pub fn list_changes<K: DeserializeOwned, F: Clone + PartialEq>(
        &self,
        keep: impl Fn(&str) -> bool,
        memo: &mut Memo<F>,
        each: impl Fn(K) -> Option<F>,
    ) -> Changes<F> {
        let Ok(inner) = self.inner.read() else {
            return Changes::All(Vec::new());
        };
        let same_version =
            |known: &Weak<Box<str>>, entry: &Entry| std::ptr::eq(known.as_ptr(), Arc::as_ptr(&entry.text));
        if let Some(changed) = memo.at.and_then(|at| inner.changed_since(at)) {
            let mut changes = Vec::new();
            for key in changed.into_iter().filter(|(ns, _)| keep(ns)) {
                let Some(entry) = inner.objects.get(key) else {
                    if let Some((_, Some(before))) = memo.seen.remove(key) {
                        changes.push((Some(before), None));
                    }
                    continue;
                };
                if memo.seen.get(key).is_some_and(|(known, _)| same_version(known, entry)) {
                    continue;
                }
                let fact = decode(&entry.text).and_then(&each);
                let before = memo
                    .seen
                    .insert(key.clone(), (Arc::downgrade(&entry.text), fact.clone()))
                    .and_then(|(_, before)| before);
                // An object `each` makes nothing of adds nothing, whether new or as before.
                if before != fact {
                    changes.push((before, fact));
                }
            }
            memo.at = Some((inner.id, inner.generation));
            return match changes.is_empty() {
                true => Changes::Same,
                false => Changes::Changed(changes),
            };
        }
        let mut seen = HashMap::with_capacity(inner.objects.len());
        let mut made = Vec::with_capacity(inner.objects.len());
        for (key, entry) in &inner.objects {
            if !keep(&key.0) {
                continue;
            }
            let fact = match memo.seen.remove(key) {
                Some((known, fact)) if same_version(&known, entry) => fact,
                _ => decode(&entry.text).and_then(&each),
            };
            made.extend(fact.iter().cloned());
            seen.insert(key.clone(), (Arc::downgrade(&entry.text), fact));
        }
        memo.seen = seen;
        memo.at = Some((inner.id, inner.generation));
        Changes::All(made)
    }

    /// How many objects the store holds and their JSON bytes (text shared with another store
    /// counted in each).
    pub fn size(&self) -> (usize, usize) {
        self.inner
            .read()
            .map(|i| (i.objects.len(), i.objects.values().map(|e| e.text.len()).sum()))
            .unwrap_or_default()
    }
}

/// Where the value of the first `"resourceVersion":"…"` member is in an object's text (start
/// and end): its metadata's, as metadata comes before the body.
fn version_span(text: &str) -> Option<(usize, usize)> {
    const FIELD: &str = "\"resourceVersion\":\"";
    let start = text.find(FIELD)? + FIELD.len();
    let end = start + text[start..].find('"')?;
    Some((start, end))
}

/// Whether two texts of one object differ at most in `metadata.resourceVersion`.
fn same_but_version(a: &str, b: &str) -> bool {
    fn split(text: &str) -> (&str, &str) {
        match version_span(text) {
            Some((start, end)) => (&text[..start], &text[end..]),
            None => (text, ""),
        }
    }
    a.len().abs_diff(b.len()) < 32 && split(a) == split(b)
}

fn encode(obj: &DynamicObject) -> Option<Text> {
    match serde_json::to_string(obj) {
        Ok(text) => Some(Arc::new(text.into_boxed_str())),
        Err(e) => {
            tracing::warn!(object = %obj.name_any(), error = %e, "cannot cache a watched object");
            None
        }
    }
}

/// A cached object that did not parse as the type a reader asked for.
#[derive(Debug, thiserror::Error)]
#[error("cached object {namespace}/{name}: {source}")]
pub struct Unparsed {
    /// Its namespace (empty for a cluster-scoped object).
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Why it did not parse.
    #[source]
    pub source: serde_json::Error,
}

fn decode<K: DeserializeOwned>(text: &str) -> Option<K> {
    serde_json::from_str(text).ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn cm(ns: &str, name: &str, value: &str) -> DynamicObject {
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": ns}, "data": {"k": value}}))
        .unwrap()
    }

    fn value(store: &CompactStore, ns: &str, name: &str) -> Option<String> {
        let obj: DynamicObject = store.get(ns, name)?;
        Some(obj.data["data"]["k"].as_str()?.to_owned())
    }

    #[test]
    fn a_list_is_swapped_in_whole_and_events_apply_after() {
        let store = CompactStore::new();
        assert!(!store.is_ready());
        store.apply(&Event::Init);
        store.apply(&Event::InitApply(cm("a", "one", "1")));
        assert!(!store.is_ready());
        assert_eq!(value(&store, "a", "one"), None, "not visible before the list is done");
        store.apply(&Event::InitDone);
        assert!(store.is_ready());
        assert_eq!(value(&store, "a", "one").as_deref(), Some("1"));
        let seen = store.generation();
        let _ = value(&store, "a", "one");
        assert_eq!(store.generation(), seen, "reads change nothing");
        store.apply(&Event::Apply(cm("b", "two", "2")));
        assert!(store.generation() > seen, "a change is a new generation");
        store.apply(&Event::Apply(cm("a", "one", "1b")));
        assert_eq!(value(&store, "a", "one").as_deref(), Some("1b"));
        let in_a: Vec<DynamicObject> = store.list(|ns| ns == "a");
        assert_eq!(in_a.len(), 1);
        assert_eq!(store.list::<DynamicObject>(|_| true).len(), 2);
        store.apply(&Event::Delete(cm("b", "two", "2")));
        assert_eq!(value(&store, "b", "two"), None);
        // A re-list replaces everything: objects deleted meanwhile go.
        store.apply(&Event::Init);
        store.apply(&Event::InitApply(cm("c", "three", "3")));
        assert_eq!(
            value(&store, "a", "one").as_deref(),
            Some("1b"),
            "kept until the re-list is done"
        );
        store.apply(&Event::InitDone);
        assert_eq!(value(&store, "a", "one"), None);
        assert_eq!(value(&store, "c", "three").as_deref(), Some("3"));
        let (count, bytes) = store.size();
        assert_eq!(count, 1);
        assert!(bytes > 50, "{bytes}");
    }

    #[test]
    fn list_map_keeps_what_each_makes_of_the_accepted_objects() {
        let store = CompactStore::new();
        store.apply(&Event::Init);
        for (ns, name, v) in [
            ("a", "one", "1"),
            ("a", "two", "2"),
            ("a", "three", "3"),
            ("b", "five", "5"),
        ] {
            store.apply(&Event::InitApply(cm(ns, name, v)));
        }
        store.apply(&Event::InitDone);
        let odd = |o: k8s_openapi::api::core::v1::ConfigMap| {
            let v = o.data?.remove("k")?;
            (v.parse::<u32>().ok()? % 2 == 1).then_some(v)
        };
        let mut in_a: Vec<String> = store.list_map(|ns| ns == "a", odd).unwrap();
        in_a.sort();
        assert_eq!(in_a, ["1", "3"], "b's five is odd but outside `keep`");
        let all: Vec<k8s_openapi::api::core::v1::ConfigMap> = store.list(|_| true);
        assert_eq!(all.len(), 4);
        // An object that is not a `K` is an error, not a gap in the list.
        let err = store
            .list_map(|ns| ns == "b", |n: Vec<u8>| Some(n.len()))
            .expect_err("a ConfigMap is not a list of bytes");
        assert_eq!((err.namespace.as_str(), err.name.as_str()), ("b", "five"));
    }

    #[test]
    fn stores_sharing_an_interner_keep_one_copy_of_a_version() {
        let interner = Interner::default();
        let (a, b) = (CompactStore::sharing(&interner), CompactStore::sharing(&interner));
        let mut obj = cm("ns", "one", "1");
        obj.metadata.uid = Some("u1".into());
        obj.metadata.resource_version = Some("7".into());
        for store in [&a, &b] {
            store.apply(&Event::Init);
            store.apply(&Event::InitApply(obj.clone()));
            store.apply(&Event::InitDone);
        }
        let text = |s: &CompactStore| s.inner.read().unwrap().objects.values().next().unwrap().text.clone();
        assert!(Arc::ptr_eq(&text(&a), &text(&b)), "one copy");
        // A new version is a new text; the old one goes once no store holds it.
        obj.metadata.resource_version = Some("8".into());
        obj.data["data"]["k"] = json!("2");
        a.apply(&Event::Apply(obj.clone()));
        assert!(!Arc::ptr_eq(&text(&a), &text(&b)));
        b.apply(&Event::Apply(obj));
        assert!(Arc::ptr_eq(&text(&a), &text(&b)));
        assert_eq!(value(&b, "ns", "one").as_deref(), Some("2"));
    }

    fn cm_labelled(ns: &str, name: &str, value: &str, label: &str) -> DynamicObject {
        let mut obj = cm(ns, name, value);
        obj.metadata.labels = Some([("l".to_owned(), label.to_owned())].into());
        obj
    }

    #[test]
    fn list_each_parses_only_the_changed_objects_and_says_when_their_facts_are_the_same() {
        use std::cell::Cell;
        let store = CompactStore::new();
        store.apply(&Event::Init);
        for (name, v) in [("one", "1"), ("two", "2"), ("three", "3")] {
            store.apply(&Event::InitApply(cm("a", name, v)));
        }
        store.apply(&Event::InitApply(cm("b", "elsewhere", "9")));
        store.apply(&Event::InitDone);
        let parsed = Cell::new(0);
        let mut memo = Memo::default();
        let read = |store: &CompactStore, memo: &mut Memo<String>| {
            store
                .list_each(
                    |ns| ns == "a",
                    memo,
                    |obj: DynamicObject| {
                        parsed.set(parsed.get() + 1);
                        // An object `each` makes nothing of is remembered as nothing.
                        let v = obj.data["data"]["k"].as_str()?.to_owned();
                        (v != "3").then_some(v)
                    },
                )
                .map(|mut values| {
                    values.sort();
                    values
                })
        };
        assert_eq!(read(&store, &mut memo).unwrap(), ["1", "2"]);
        assert_eq!(parsed.get(), 3, "every object of the namespace, once");
        assert_eq!(read(&store, &mut memo), None, "nothing new: the same facts");
        assert_eq!(parsed.get(), 3, "nothing new: nothing parsed");

        // A new version that `each` makes the same of: parsed, and the facts are the same.
        store.apply(&Event::Apply(cm_labelled("a", "two", "2", "new")));
        assert_eq!(read(&store, &mut memo), None);
        assert_eq!(parsed.get(), 4, "only the new version");
        // Objects `keep` refuses change nothing.
        store.apply(&Event::Apply(cm("b", "elsewhere", "10")));
        assert_eq!(read(&store, &mut memo), None);
        assert_eq!(parsed.get(), 4);

        store.apply(&Event::Apply(cm("a", "two", "22")));
        store.apply(&Event::Delete(cm("a", "one", "1")));
        assert_eq!(read(&store, &mut memo).unwrap(), ["22"]);
        assert_eq!(parsed.get(), 5, "only the new version");
        assert_eq!(
            memo.seen.len(),
            2,
            "the deleted object and the old version are forgotten"
        );
        // An object that comes and one that goes with nothing made of it.
        store.apply(&Event::Delete(cm("a", "three", "3")));
        assert_eq!(read(&store, &mut memo), None);
        store.apply(&Event::Apply(cm("a", "four", "4")));
        assert_eq!(read(&store, &mut memo).unwrap(), ["22", "4"]);
        assert_eq!(parsed.get(), 6);

        // A fresh memo (another reader) parses everything again.
        assert_eq!(read(&store, &mut Memo::default()).unwrap(), ["22", "4"]);
        assert_eq!(parsed.get(), 8);

        // More changes than the journal holds: every object is visited, and only the new
        // version parsed.
        for i in 0..=JOURNAL {
            store.apply(&Event::Apply(cm("b", "elsewhere", &i.to_string())));
        }
        store.apply(&Event::Apply(cm("a", "four", "44")));
        assert_eq!(read(&store, &mut memo).unwrap(), ["22", "44"]);
        assert_eq!(parsed.get(), 9);

        // A new list: every object is visited again.
        store.apply(&Event::Init);
        store.apply(&Event::InitApply(cm("a", "five", "5")));
        store.apply(&Event::InitDone);
        assert_eq!(read(&store, &mut memo).unwrap(), ["5"]);

        // A memo of another store is not taken for one of this store, even where the other's
        // journal spans the memo's generation.
        let other = CompactStore::new();
        other.apply(&Event::Init);
        other.apply(&Event::InitApply(cm("a", "six", "6")));
        other.apply(&Event::InitDone);
        let (_, at) = memo.at.unwrap();
        for i in 0..at + 5 {
            other.apply(&Event::Apply(cm("b", "elsewhere", &i.to_string())));
        }
        {
            let inner = other.inner.read().unwrap();
            assert!(inner.journal_from <= at && at <= inner.generation);
        }
        assert_eq!(read(&other, &mut memo).unwrap(), ["6"]);
    }

    #[test]
    fn the_journal_answers_for_every_generation_it_spans_and_no_older_one() {
        let store = CompactStore::new();
        store.apply(&Event::Init);
        store.apply(&Event::InitDone);
        let names: Vec<String> = (0..=JOURNAL).map(|i| format!("o{i}")).collect();
        for name in &names {
            store.apply(&Event::Apply(cm("a", name, "1")));
        }
        let inner = store.inner.read().unwrap();
        let id = inner.id;
        let keys = |generation: u64| {
            inner.changed_since((id, generation)).map(|keys| {
                let mut names: Vec<&str> = keys.iter().map(|(_, name)| name.as_str()).collect();
                names.sort_unstable();
                names
            })
        };
        // The list made generation 1; the changes 2..=JOURNAL + 2, the first one forgotten.
        assert_eq!(inner.generation, JOURNAL as u64 + 2);
        assert_eq!(keys(1), None, "its first change is forgotten");
        let mut after_first: Vec<&str> = names[1..].iter().map(String::as_str).collect();
        after_first.sort_unstable();
        assert_eq!(keys(2).unwrap(), after_first, "every change after the forgotten one");
        assert_eq!(keys(inner.generation).unwrap(), Vec::<&str>::new(), "nothing since");
        assert_eq!(keys(inner.generation + 1), None, "a generation it never had");
        assert_eq!(inner.changed_since((StoreId::default(), 2)), None, "another store's");
    }

    #[test]
    fn objects_parse_straight_into_their_type() {
        let store = CompactStore::new();
        store.apply(&Event::Init);
        store.apply(&Event::InitApply(cm("a", "one", "1")));
        store.apply(&Event::InitDone);
        let typed: k8s_openapi::api::core::v1::ConfigMap = store.get("a", "one").unwrap();
        assert_eq!(typed.data.unwrap()["k"], "1");
    }

    #[test]
    fn keys_and_versions_are_read_without_parsing_and_leave_terminating_objects_out() {
        let store = CompactStore::new();
        let mut live = cm("a", "live", "1");
        live.metadata.resource_version = Some("41".into());
        let mut going = cm("a", "going", "2");
        going.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        store.apply(&Event::Init);
        for obj in [live, going, cm("b", "elsewhere", "3")] {
            store.apply(&Event::InitApply(obj));
        }
        store.apply(&Event::InitDone);
        assert_eq!(store.keys(|ns| ns == "a"), vec![("a".to_owned(), "live".to_owned())]);
        assert_eq!(store.resource_version("a", "live"), Some(Some("41".to_owned())));
        assert_eq!(
            store.resource_version("b", "elsewhere"),
            Some(None),
            "held, unversioned"
        );
        assert_eq!(store.resource_version("a", "absent"), None);
    }

    #[test]
    fn a_new_version_with_nothing_else_new_keeps_the_generation() {
        let store = CompactStore::new();
        let versioned = |rv: &str, value: &str| {
            let mut obj = cm("a", "one", value);
            obj.metadata.resource_version = Some(rv.into());
            obj
        };
        store.apply(&Event::Init);
        store.apply(&Event::InitApply(versioned("1", "x")));
        store.apply(&Event::InitDone);
        let seen = store.generation();
        store.apply(&Event::Apply(versioned("2", "x")));
        assert_eq!(store.generation(), seen, "only the version changed");
        assert_eq!(
            store.resource_version("a", "one"),
            Some(Some("1".to_owned())),
            "the text held stays (an older version of the same content)"
        );
        store.apply(&Event::Apply(versioned("3", "y")));
        assert!(store.generation() > seen, "the content changed");
        assert!(same_but_version(r#"{"a":1}"#, r#"{"a":1}"#));
        assert!(!same_but_version(r#"{"a":1}"#, r#"{"a":2}"#));
        assert!(same_but_version(
            r#"{"metadata":{"resourceVersion":"9"},"b":1}"#,
            r#"{"metadata":{"resourceVersion":"10"},"b":1}"#
        ));
        assert!(!same_but_version(
            r#"{"metadata":{"resourceVersion":"9"},"b":1}"#,
            r#"{"metadata":{"resourceVersion":"10"},"b":2}"#
        ));
    }
}
