//! Controller wiring: watch the CRs, the owned kinds (via owner references) and the
//! label-mapped kinds, so drift is repaired by the next reconcile instead of by polling.

use std::future::Future;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use hpp_api::HostPathProvisioner;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use kube::api::{Api, DynamicObject};
use kube::runtime::controller::Controller;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use tracing::{info, warn};

use crate::gather::has_api;
use crate::names::managed_selector;
use crate::operator::{Context, error_policy, reconcile};
use crate::reconcilers::common::{prometheus_rule_kind, scc_kind, service_monitor_kind};

/// Fingerprint of what matters about a node for pool placement (labels, taints, readiness), so
/// heartbeat-only status updates do not trigger reconciles.
fn node_fingerprint(node: &Node) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    node.metadata.labels.hash(&mut h);
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| format!("{t:?}"));
    taints.hash(&mut h);
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    ready.hash(&mut h);
    node.metadata.deletion_timestamp.is_some().hash(&mut h);
    Some(h.finish())
}

fn trigger<K>(api: Api<K>, cfg: watcher::Config) -> impl Stream<Item = ()> + Send + 'static
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    watcher(api, cfg)
        .default_backoff()
        .touched_objects()
        .filter_map(|r| async move { r.ok().map(|_| ()) })
}

/// Builds the controller stream; drive it to completion (it ends after `shutdown`).
pub async fn controller(
    ctx: Arc<Context>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> impl Stream<Item = ()> + Send {
    let client: Client = ctx.client.clone();
    let ns = ctx.config.namespace.clone();
    let labelled = watcher::Config::default().labels(&managed_selector());
    let mut c = Controller::new(
        Api::<HostPathProvisioner>::all(client.clone()),
        watcher::Config::default(),
    )
    .owns(Api::<DaemonSet>::namespaced(client.clone(), &ns), labelled.clone())
    .owns(Api::<Deployment>::namespaced(client.clone(), &ns), labelled.clone())
    .owns(Api::<ServiceAccount>::namespaced(client.clone(), &ns), labelled.clone())
    .owns(Api::<Role>::namespaced(client.clone(), &ns), labelled.clone())
    .owns(Api::<RoleBinding>::namespaced(client.clone(), &ns), labelled.clone())
    .owns(Api::<Service>::namespaced(client.clone(), &ns), labelled.clone())
    .owns(Api::<ClusterRole>::all(client.clone()), labelled.clone())
    .owns(Api::<ClusterRoleBinding>::all(client.clone()), labelled.clone())
    .owns(Api::<CSIDriver>::all(client.clone()), labelled.clone());
    // Optional APIs: watched when present at start-up (each pass re-discovers them anyway).
    let scc = has_api(&client, "security.openshift.io", "securitycontextconstraints")
        .await
        .unwrap_or(false);
    if scc {
        let ar = scc_kind().api_resource();
        c = c.owns_with(
            Api::<DynamicObject>::all_with(client.clone(), &ar),
            ar,
            labelled.clone(),
        );
    }
    let prom = has_api(&client, "monitoring.coreos.com", "prometheusrules")
        .await
        .unwrap_or(false);
    if prom {
        for kind in [prometheus_rule_kind(), service_monitor_kind()] {
            let ar = kind.api_resource();
            c = c.owns_with(
                Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &ar),
                ar,
                labelled.clone(),
            );
        }
    }
    info!(scc, prometheus = prom, "optional APIs at start-up");
    // Objects without owner references (pool PVCs, cleanup Jobs, overlay classes) and nodes.
    let nodes = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .touched_objects()
        .predicate_filter(node_fingerprint, Default::default())
        .filter_map(|r| async move { r.ok().map(|_| ()) });
    let others = futures::stream::select_all([
        trigger(
            Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns),
            labelled.clone(),
        )
        .boxed(),
        trigger(Api::<Job>::namespaced(client.clone(), &ns), labelled.clone()).boxed(),
        trigger(Api::<StorageClass>::all(client.clone()), labelled.clone()).boxed(),
        nodes.boxed(),
    ]);
    c.reconcile_all_on(others)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .map(|res| {
            if let Err(e) = res {
                warn!(error = %e, "controller");
            }
        })
}

/// Runs the controller until `shutdown` resolves.
pub async fn run(ctx: Arc<Context>, shutdown: impl Future<Output = ()> + Send + Sync + 'static) {
    controller(ctx, shutdown).await.for_each(|()| async {}).await;
}
