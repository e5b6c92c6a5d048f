//! Controller wiring: watch the CRs, every kind the pipeline's steps manage (built-in or
//! plugged in, from [`Pipeline::kinds`](crate::Pipeline::kinds)), the objects the facts are read
//! from, and nodes, so drift is repaired by the next reconcile instead of by polling. Every
//! watch fills a reflector store in the context's [`Cache`] (objects trimmed (`cache::trim`) of
//! what no reader uses), which passes read instead of the API, and the steps' indexes
//! ([`WatchIndex`]) of its kind and selector.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use hpp_api::HostPathProvisioner;
use kube::api::{Api, DynamicObject};
use kube::runtime::controller::Controller;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::Value;
use tracing::{info, warn};

use crate::cache::Cache;
use crate::changes::ChangeLog;
use crate::gather;
use crate::index::WatchIndex;
use crate::names::managed_selector;
use crate::object::Kind;
use crate::operator::{Context, error_policy, reconcile};

/// Fingerprint of what matters about a node for pool placement (labels, taints, readiness), so
/// heartbeat-only status updates do not trigger reconciles.
fn node_fingerprint(node: &DynamicObject) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    node.labels().hash(&mut h);
    node.data.pointer("/spec/taints").map(Value::to_string).hash(&mut h);
    let ready = node
        .data
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"));
    ready.hash(&mut h);
    node.metadata.deletion_timestamp.is_some().hash(&mut h);
    Some(h.finish())
}

/// Fingerprint of what the pool status reads from a PersistentVolume (driver, phase, pool,
/// capacity) or a CSIStorageCapacity (class, capacity), so PV status churn and capacity
/// objects re-published unchanged do not trigger reconciles. Other drivers' PVs all hash the
/// same, so they trigger once when first seen and never again.
fn usage_fingerprint(obj: &DynamicObject) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let driver = obj.data.pointer("/spec/csi/driver").and_then(Value::as_str);
    if obj.data.get("storageClassName").is_some() {
        // CSIStorageCapacity: top-level fields.
        obj.data.get("storageClassName").map(Value::to_string).hash(&mut h);
        obj.data.get("capacity").map(Value::to_string).hash(&mut h);
        obj.data.get("nodeTopology").map(Value::to_string).hash(&mut h);
    } else if driver == Some(hpp_api::constants::DRIVER_NAME) {
        obj.data.pointer("/status/phase").map(Value::to_string).hash(&mut h);
        obj.data.pointer("/spec/capacity").map(Value::to_string).hash(&mut h);
        obj.data
            .pointer("/spec/csi/volumeAttributes")
            .map(Value::to_string)
            .hash(&mut h);
    }
    obj.metadata.deletion_timestamp.is_some().hash(&mut h);
    Some(h.finish())
}

/// A reflector over `kind` objects matching `selector`, registered in `cache`, feeding
/// `indexes`; yields one item per change that should trigger a reconcile.
///
/// Nodes, PersistentVolumes and capacity objects pass a fingerprint filter (heartbeats and
/// status churn do not trigger). The filter compares an object with its last seen state, so it
/// would also swallow a deletion (the deleted object looks like the last one seen): deletions
/// of those kinds always trigger, and so does every event an index reports as one its step must
/// act on.
///
/// Every trigger is recorded in `changes`: the key of an object of a kind the steps render
/// (`rendered`), "everything" for any other kind, a relist, or a trigger the filter would swallow.
fn cached_watch(
    client: &Client,
    namespace: &str,
    cache: &Cache,
    (kind, selector): (&Kind, &str),
    indexes: Vec<Arc<dyn WatchIndex>>,
    changes: Arc<ChangeLog>,
    rendered: bool,
) -> BoxStream<'static, ()> {
    let ar = kind.api_resource();
    let api = if kind.namespaced {
        Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &ar)
    } else {
        Api::<DynamicObject>::all_with(client.clone(), &ar)
    };
    let store = cache.new_store(kind.clone(), selector);
    let config = watcher::Config::default().labels(selector);
    let trimmed = {
        let kind = kind.clone();
        watcher(api, config)
            .default_backoff()
            .modify(move |obj| crate::cache::trim(&kind, obj))
    };
    let fingerprint: Option<fn(&DynamicObject) -> Option<u64>> = if kind.kind == "Node" && kind.group.is_empty() {
        Some(node_fingerprint)
    } else if (kind.kind == "PersistentVolume" && kind.group.is_empty()) || kind.kind == "CSIStorageCapacity" {
        Some(usage_fingerprint)
    } else {
        None
    };
    // Triggers the fingerprint filter would swallow, sent beside the filtered stream.
    let (extra_tx, extra_rx) = futures::channel::mpsc::unbounded::<()>();
    let filtered = fingerprint.is_some();
    let relisted = changes.clone();
    let events = trimmed.inspect(move |event| match event {
        Ok(event) => {
            store.apply(event);
            // A relist: objects deleted meanwhile are dropped without an event of their own.
            if matches!(event, watcher::Event::Init | watcher::Event::InitDone) {
                relisted.everything();
            }
            if must_trigger(filtered, event, &indexes) {
                relisted.everything();
                let _ = extra_tx.unbounded_send(());
            }
        }
        Err(_) => store.note_failure(),
    });
    let objects = events.touched_objects();
    let record = {
        let kind = kind.clone();
        move |obj: DynamicObject| {
            if rendered {
                changes.object(crate::object::key_of(&kind, &obj));
            } else {
                changes.everything();
            }
        }
    };
    let triggers = match fingerprint {
        Some(f) => objects
            .predicate_filter(f, Default::default())
            .filter_map(move |r| {
                let out = r.ok().map(&record);
                async move { out }
            })
            .boxed(),
        None => objects
            .filter_map(move |r| {
                let out = r.ok().map(&record);
                async move { out }
            })
            .boxed(),
    };
    // Ends with the watch: the sender lives in the watch stream's `inspect`.
    futures::stream::select(triggers, extra_rx).boxed()
}

/// Whether a watch event must trigger a pass even if the fingerprint filter (when `filtered`)
/// would drop it: a deletion, or a change an index reports. Feeds every index on the way.
fn must_trigger(filtered: bool, event: &watcher::Event<DynamicObject>, indexes: &[Arc<dyn WatchIndex>]) -> bool {
    let mut trigger = filtered && matches!(event, watcher::Event::Delete(_));
    for index in indexes {
        trigger |= index.apply(event);
    }
    trigger
}

/// What the controller watches: every kind the pipeline manages (labelled objects), what the
/// steps read without owning or index, and the sources the facts are gathered from.
pub fn watched(ctx: &Context, facts: &crate::ClusterFacts) -> BTreeSet<(Kind, String)> {
    let managed = managed_selector();
    ctx.pipeline
        .kinds(facts)
        .into_iter()
        .map(|k| (k, managed.clone()))
        .chain(ctx.pipeline.watches())
        .chain(ctx.pipeline.indexes().into_iter().map(|(k, sel, _)| (k, sel)))
        .chain(gather::fact_sources())
        .collect()
}

/// Builds the controller stream; drive it to completion (it ends after `shutdown`).
pub async fn controller(
    ctx: Arc<Context>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> impl Stream<Item = ()> + Send {
    let client: Client = ctx.client.clone();
    let ns = ctx.config.namespace.clone();
    // Optional APIs: watched when present at start-up; passes reuse the answer for
    // DISCOVERY_REFRESH (and ask again after a failed pass).
    ctx.cache.remember_discovery(crate::cache::DISCOVERY_REFRESH);
    let facts: crate::ClusterFacts = match gather::optional_apis(&client).await {
        Ok(apis) => {
            ctx.cache.record_discovery(apis);
            apis.into()
        }
        Err(e) => {
            warn!(error = %e, "discovery failed at start-up, optional APIs not watched");
            Default::default()
        }
    };
    info!(
        scc = facts.has_scc,
        prometheus = facts.has_prometheus,
        "optional APIs at start-up"
    );
    let c = Controller::new(
        Api::<HostPathProvisioner>::all(client.clone()),
        watcher::Config::default(),
    );
    ctx.cache.set_provisioners(c.store());
    let indexes = ctx.pipeline.indexes();
    let rendered_kinds: BTreeSet<Kind> = ctx.pipeline.kinds(&facts).into_iter().collect();
    let triggers: Vec<BoxStream<'static, ()>> = watched(&ctx, &facts)
        .iter()
        .map(|(kind, selector)| {
            let fed = indexes
                .iter()
                .filter(|(k, sel, _)| k == kind && sel == selector)
                .map(|(_, _, index)| index.clone())
                .collect();
            let rendered = rendered_kinds.contains(kind);
            cached_watch(
                &client,
                &ns,
                &ctx.cache,
                (kind, selector),
                fed,
                ctx.changes.clone(),
                rendered,
            )
        })
        .collect();
    let changes = ctx.changes.clone();
    changes.watching(true);
    let stopped = changes.clone();
    c.reconcile_all_on(futures::stream::select_all(triggers))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .map(|res| {
            if let Err(e) = res {
                warn!(error = %e, "controller");
            }
        })
        // Reconciles called after the controller stopped see no changes: full passes.
        .chain(futures::stream::once(async move { stopped.watching(false) }))
}

/// Runs the controller until `shutdown` resolves.
pub async fn run(ctx: Arc<Context>, shutdown: impl Future<Output = ()> + Send + Sync + 'static) {
    controller(ctx, shutdown).await.for_each(|()| async {}).await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    fn node(name: &str) -> DynamicObject {
        serde_json::from_value(serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}))
            .unwrap()
    }

    /// Reports every `Apply` as a change when told to.
    #[derive(Default)]
    struct Flag(AtomicBool);

    impl WatchIndex for Flag {
        fn apply(&self, event: &watcher::Event<DynamicObject>) -> bool {
            matches!(event, watcher::Event::Apply(_)) && self.0.load(Ordering::Relaxed)
        }
        fn is_ready(&self) -> bool {
            true
        }
    }

    #[test]
    fn deletions_of_filtered_kinds_and_index_changes_trigger() {
        let gone = watcher::Event::Delete(node("n1"));
        let changed = watcher::Event::Apply(node("n1"));
        // A filtered kind (nodes, PVs): the fingerprint filter would swallow a deletion.
        assert!(must_trigger(true, &gone, &[]));
        assert!(!must_trigger(true, &changed, &[]), "the filter decides about updates");
        // Unfiltered kinds trigger through the object stream anyway.
        assert!(!must_trigger(false, &gone, &[]));
        let flag = Arc::new(Flag::default());
        let indexes: Vec<Arc<dyn WatchIndex>> = vec![flag.clone()];
        assert!(!must_trigger(true, &changed, &indexes));
        flag.0.store(true, Ordering::Relaxed);
        assert!(must_trigger(true, &changed, &indexes), "an index asks for a pass");
    }
}
