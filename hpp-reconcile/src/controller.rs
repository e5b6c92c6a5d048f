//! Controller wiring: watch the CRs, every kind the pipeline's steps manage (built-in or
//! plugged in, from [`Pipeline::kinds`](crate::Pipeline::kinds)), the objects the facts are read
//! from, and nodes, so drift is repaired by the next reconcile instead of by polling. Every
//! watch fills a reflector store in the context's [`Cache`] (objects trimmed (`cache::trim`) of
//! what no reader uses), which passes read instead of the API, and the steps' indexes
//! ([`WatchIndex`]) of its kind and selector.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use hpp_api::HostPathProvisioner;
use kube::api::{Api, DynamicObject};
use kube::runtime::controller::Controller;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, ResourceExt};
use serde_json::Value;
use tracing::{Instrument, info, warn};

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
/// (`rendered`), the name of a Node whose fingerprint changed or that was deleted, a change of
/// a PersistentVolume or a CSIStorageCapacity object, and "everything" for any other kind, a
/// relist, or another trigger the filter would swallow.
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
    let node = is_kind(kind, "", "Node");
    let usage = is_kind(kind, "", "PersistentVolume") || is_capacity(kind);
    let fingerprint: Option<fn(&DynamicObject) -> Option<u64>> = if node {
        Some(node_fingerprint)
    } else if usage {
        Some(usage_fingerprint)
    } else {
        None
    };
    // Triggers the fingerprint filter would swallow, sent beside the filtered stream.
    let (extra_tx, extra_rx) = futures::channel::mpsc::unbounded::<()>();
    let filtered = fingerprint.is_some();
    // The kinds only the facts and node loss read (not rendered, not Nodes).
    let storage = !rendered && usage;
    let relisted = changes.clone();
    let events = trimmed.inspect(move |event| match event {
        Ok(event) => {
            store.apply(event);
            // A relist: objects deleted meanwhile are dropped without an event of their own.
            if matches!(event, watcher::Event::Init | watcher::Event::InitDone) {
                relisted.everything();
            }
            if must_trigger(filtered, event, &indexes) {
                match event {
                    // A deleted Node: its parts go, which a pass over parts can take when the
                    // steps can place the node (and no index asked for more).
                    watcher::Event::Delete(obj) if node && indexes.is_empty() => relisted.node(obj.name_any()),
                    // A PV or capacity object the usage or the node-loss index reports: the
                    // steps acting on them run in every pass.
                    watcher::Event::Apply(_) | watcher::Event::Delete(_) if storage => relisted.storage(),
                    _ => relisted.everything(),
                }
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
            } else if node {
                changes.node(obj.name_any());
            } else if storage {
                changes.storage();
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

/// Whether `kind` is `name` of API group `group` (`""`: the core group).
fn is_kind(kind: &Kind, group: &str, name: &str) -> bool {
    kind.group == group && kind.kind == name
}

/// Whether `kind` is CSIStorageCapacity, which feeds only the pools' `available`.
fn is_capacity(kind: &Kind) -> bool {
    is_kind(kind, "storage.k8s.io", "CSIStorageCapacity")
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
    let (provisioners, writer) = reflector::store();
    ctx.cache.set_provisioners(provisioners.clone());
    // The operator's own status writes come back as events of the CR: they start no pass.
    let own = ctx.clone();
    let mut echoes = crate::echo::EchoFilter::default();
    // No backoff of its own: the controller backs off its trigger streams (as with
    // `Controller::new`).
    let crs = watcher(
        Api::<HostPathProvisioner>::all(client.clone()),
        watcher::Config::default(),
    )
    .reflect(writer)
    .applied_objects()
    .filter(move |event| {
        let passes = match event {
            Ok(hpp) => echoes.passes(hpp, &own.own_status),
            Err(_) => true,
        };
        std::future::ready(passes)
    });
    let c = Controller::for_stream(crs, provisioners);
    let indexes = ctx.pipeline.indexes();
    let rendered_kinds: BTreeSet<Kind> = ctx.pipeline.kinds(&facts).into_iter().collect();
    let triggers: Vec<BoxStream<'static, ()>> = watched(&ctx, &facts)
        .iter()
        .map(|(kind, selector)| {
            let fed: Vec<_> = indexes
                .iter()
                .filter(|(k, sel, _)| k == kind && sel == selector)
                .map(|(_, _, index)| index.clone())
                .collect();
            let rendered = rendered_kinds.contains(kind);
            // Capacity objects feed only the pools' usage figures, which are written at most
            // once per usage interval: their changes alone start no more passes than that. A
            // pass started by anything else takes them too (the change log has them at once).
            let usage_only = is_capacity(kind) && !rendered && fed.is_empty();
            let triggers = cached_watch(
                &client,
                &ns,
                &ctx.cache,
                (kind, selector),
                fed,
                ctx.changes.clone(),
                rendered,
            );
            match usage_only {
                true => throttle(triggers, ctx.usage_interval),
                false => triggers,
            }
        })
        .collect();
    let changes = ctx.changes.clone();
    changes.watching(true);
    let stopped = changes.clone();
    c.reconcile_all_on(throttle(futures::stream::select_all(triggers), ctx.pass_interval))
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

/// Passes `triggers` on at most once per `interval`: the first at once, those that arrive
/// within `interval` of the last one passed on as one trigger at the end of it. Every trigger
/// means "reconcile", and what changed is in the [`ChangeLog`], so one pass takes them all.
///
/// The triggers are read all the time by a task of their own, not only when a pass is due:
/// reading them is what applies the watch events to the caches and the change log, and a
/// watch's connection reads its next event only after the last one was taken.
fn throttle(triggers: impl Stream<Item = ()> + Send + 'static, interval: Duration) -> BoxStream<'static, ()> {
    if interval.is_zero() {
        return triggers.boxed();
    }
    // Room for one: a trigger that finds one waiting goes with it.
    let (tx, rx) = tokio::sync::mpsc::channel::<()>(1);
    let reader = tokio::spawn(
        async move {
            let mut triggers = std::pin::pin!(triggers);
            loop {
                tokio::select! {
                    // The controller stopped: the watches stop with this task.
                    () = tx.closed() => break,
                    next = triggers.next() => match next {
                        Some(()) => {
                            let _ = tx.try_send(());
                        }
                        None => break,
                    },
                }
            }
        }
        .instrument(tracing::Span::current()),
    );
    let state = (rx, None::<tokio::time::Instant>, reader);
    futures::stream::unfold(state, move |(mut rx, last, reader)| async move {
        if rx.recv().await.is_none() {
            // The triggers ended, or their reader panicked: a panic goes on here, where it
            // ends the controller as it did before the reader had a task of its own, rather
            // than leaving passes to trust a change log nobody fills.
            if let Err(e) = reader.await
                && e.is_panic()
            {
                std::panic::resume_unwind(e.into_panic());
            }
            return None;
        }
        if let Some(due) = last.map(|l| l + interval) {
            tokio::time::sleep_until(due).await;
            // What came meanwhile goes with this one.
            while rx.try_recv().is_ok() {}
        }
        Some(((), (rx, Some(tokio::time::Instant::now()), reader)))
    })
    .boxed()
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

    #[tokio::test(start_paused = true)]
    async fn triggers_closer_than_the_interval_are_passed_on_as_one() {
        // No room in the channel: a send completes only once the throttle took the trigger.
        let (mut tx, rx) = futures::channel::mpsc::channel::<()>(0);
        let mut out = throttle(rx, Duration::from_millis(100));
        let start = tokio::time::Instant::now();
        tx.try_send(()).unwrap();
        assert_eq!(out.next().await, Some(()));
        assert_eq!(start.elapsed(), Duration::ZERO, "a lone trigger goes at once");
        // Ten triggers 10 ms apart, then two more.
        let mut sender = tx.clone();
        let ten_sent = tokio::spawn(async move {
            let mut ten_sent = None;
            for (i, ms) in (5..100).step_by(10).chain([150, 160]).enumerate() {
                tokio::time::sleep_until(start + Duration::from_millis(ms)).await;
                futures::SinkExt::send(&mut sender, ()).await.unwrap();
                if i == 9 {
                    ten_sent = Some(start.elapsed());
                }
            }
            ten_sent
        });
        // The ten: one trigger, at the end of the interval.
        assert_eq!(out.next().await, Some(()));
        assert_eq!(start.elapsed(), Duration::from_millis(100));
        // The two: one more, an interval later.
        assert_eq!(out.next().await, Some(()));
        assert_eq!(start.elapsed(), Duration::from_millis(200));
        // Each trigger was taken as it came, while the throttle waited (a watch whose events
        // are not taken stops reading them).
        assert_eq!(ten_sent.await.unwrap(), Some(Duration::from_millis(95)));
        // Quiet: the next trigger goes at once.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let quiet = tokio::time::Instant::now();
        futures::SinkExt::send(&mut tx, ()).await.unwrap();
        assert_eq!(out.next().await, Some(()));
        assert_eq!(quiet.elapsed(), Duration::ZERO);
        drop(tx);
        assert_eq!(out.next().await, None, "ends with its triggers");
    }

    #[tokio::test]
    async fn a_panic_reading_the_triggers_ends_the_throttled_stream_with_it() {
        let panicking = futures::stream::once(async { panic!("a watch event no store could take") });
        let mut out = throttle(panicking, Duration::from_millis(100));
        let ended = tokio::spawn(async move { out.next().await }).await;
        assert!(ended.is_err_and(|e| e.is_panic()), "the panic reaches the controller");
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
