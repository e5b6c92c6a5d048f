//! The controller's watch caches: one reflector store per watched kind and label selector, so a
//! pass reads live objects from memory instead of a GET per object and a LIST per kind.
//!
//! A store answers only once its first LIST completed; until then (and always when no
//! controller runs, as in a test calling `reconcile` directly) readers fall back to the API.
//! A cache may lag behind a write the operator just made: the next pass then applies once more,
//! which server-side apply makes a no-op, and the watch event that follows brings it in line.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use futures::FutureExt;
use kube::api::DynamicObject;
use kube::runtime::reflector::{ObjectRef, Store};

use hpp_api::HostPathProvisioner;

use crate::object::Kind;

/// One store per watched kind and label selector.
type Stores = BTreeMap<(Kind, String), Store<DynamicObject>>;

/// Watch caches keyed by kind and label selector. Cheap to clone (shared).
#[derive(Clone, Default)]
pub struct Cache {
    stores: Arc<RwLock<Stores>>,
    provisioners: Arc<RwLock<Option<Store<HostPathProvisioner>>>>,
}

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

    /// Registers the store a reflector fills for `kind` objects matching `selector` (a label
    /// selector string, empty for every object).
    pub fn insert(&self, kind: Kind, selector: &str, store: Store<DynamicObject>) {
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

    fn synced(&self, kind: &Kind, selector: &str) -> Option<Store<DynamicObject>> {
        let stores = self.stores.read().ok()?;
        let store = stores.get(&(kind.clone(), selector.to_owned()))?;
        store.wait_until_ready().now_or_never()?.ok()?;
        Some(store.clone())
    }

    /// The cached objects of `kind` matching `selector` (in `namespace` for namespaced kinds),
    /// or `None` when there is no synced store for them and the caller must ask the API.
    pub fn list(&self, kind: &Kind, selector: &str, namespace: Option<&str>) -> Option<Vec<Arc<DynamicObject>>> {
        let store = self.synced(kind, selector)?;
        Some(
            store.state_filter(|o| {
                !kind.namespaced || namespace.is_none() || o.metadata.namespace.as_deref() == namespace
            }),
        )
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
        let mut key = ObjectRef::new_with(name, kind.api_resource());
        if kind.namespaced {
            key = key.within(namespace.unwrap_or_default());
        }
        Some(store.get(&key))
    }

    /// Registers the controller's own store of HostPathProvisioner objects.
    pub fn set_provisioners(&self, store: Store<HostPathProvisioner>) {
        if let Ok(mut slot) = self.provisioners.write() {
            *slot = Some(store);
        }
    }

    /// Every cached HostPathProvisioner, or `None` when the controller's store is not synced.
    pub fn provisioners(&self) -> Option<Vec<HostPathProvisioner>> {
        let slot = self.provisioners.read().ok()?;
        let store = slot.as_ref()?;
        store.wait_until_ready().now_or_never()?.ok()?;
        Some(store.state().iter().map(|h| (**h).clone()).collect())
    }
}
