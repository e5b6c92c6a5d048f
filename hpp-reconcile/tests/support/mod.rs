//! Shared set-up for the end-to-end operator tests against the fake API server.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use hpp_api::HostPathProvisioner;
use hpp_reconcile::metrics::Metrics;
use hpp_reconcile::operator::{Context, reconcile};
use hpp_reconcile::{Error, OperatorConfig, Pipeline};
use hpp_testkit::FakeApiServer;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim};
use kube::api::ObjectMeta;
use kube::runtime::controller::Action;
use serde_json::json;

pub const NS: &str = "hostpath-provisioner";
pub const CR: &str = "hostpath-provisioner";

pub fn example(name: &str) -> HostPathProvisioner {
    // deploy/examples/ as copied into the crate (xtask/tests/deploy_example_copies.rs keeps them equal).
    let path = format!("{}/tests/fixtures/examples/{name}.yaml", env!("CARGO_MANIFEST_DIR"));
    serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

pub fn config(version: &str) -> OperatorConfig {
    OperatorConfig::from_env([("OPERATOR_VERSION", version), ("POD_NAMESPACE", NS)])
}

pub fn node(name: &str, ready: bool) -> Node {
    serde_json::from_value(json!({
        "metadata": { "name": name, "labels": { "kubernetes.io/os": "linux", "kubernetes.io/hostname": name } },
        "status": { "conditions": [{ "type": "Ready", "status": if ready { "True" } else { "False" } }] },
    }))
    .unwrap()
}

pub struct Env {
    pub fake: FakeApiServer,
    pub ctx: Arc<Context>,
}

impl Env {
    /// How many times Warning Events with this reason about this object were published,
    /// counting the repeats an Event's series records.
    pub fn warnings_published(&self, reason: &str, name: &str) -> i32 {
        self.fake
            .list::<k8s_openapi::api::events::v1::Event>()
            .into_iter()
            .filter(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
            })
            .map(|e| e.series.map_or(1, |s| s.count))
            .sum::<i32>()
            + self
                .fake
                .list::<k8s_openapi::api::core::v1::Event>()
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some(reason) && e.involved_object.name.as_deref() == Some(name))
                .map(|e| e.count.unwrap_or(1))
                .sum::<i32>()
    }

    /// A fake cluster with the CRD, the given Ready nodes and one example CR.
    pub fn new(example_name: &str, nodes: &[&str]) -> Self {
        Self::with_version(example_name, nodes, "v1.0.0")
    }

    pub fn with_version(example_name: &str, nodes: &[&str], version: &str) -> Self {
        let fake = FakeApiServer::new();
        fake.register::<HostPathProvisioner>(false, true);
        for n in nodes {
            fake.seed(&node(n, true));
        }
        fake.seed(&example(example_name));
        let ctx = Context::new(fake.client(), config(version), Pipeline::standard(), Metrics::default())
            .with_backoff(Duration::from_millis(20), Duration::from_millis(200));
        Env {
            fake,
            ctx: Arc::new(ctx),
        }
    }

    /// The same environment with its context changed by `f` (before any pass shares it).
    #[allow(dead_code)]
    pub fn map_ctx(self, f: impl FnOnce(Context) -> Context) -> Self {
        let ctx = Arc::into_inner(self.ctx).expect("the context is not shared yet");
        Env {
            fake: self.fake,
            ctx: Arc::new(f(ctx)),
        }
    }

    pub fn hpp(&self) -> HostPathProvisioner {
        self.fake.get::<HostPathProvisioner>(None, CR).expect("the CR exists")
    }

    /// One reconcile of the current CR, as the controller would run it.
    pub async fn pass(&self) -> Result<Action, Error> {
        reconcile(Arc::new(self.hpp()), self.ctx.clone()).await
    }

    /// Reconciles until a pass succeeds without writing (at most 10 passes).
    pub async fn converge(&self) {
        for _ in 0..10 {
            self.fake.clear_requests();
            let result = self.pass().await;
            if result.is_ok() && self.fake.write_requests().is_empty() {
                return;
            }
        }
        panic!(
            "no steady state after 10 passes: last writes {:#?}",
            self.fake.write_requests()
        );
    }

    /// Marks a DaemonSet rolled out and ready on every node, as the DaemonSet controller would.
    pub fn daemonset_ready(&self, name: &str, nodes: i64) {
        let generation = self
            .fake
            .get::<DaemonSet>(Some(NS), name)
            .and_then(|d| d.metadata.generation)
            .unwrap_or(1);
        assert!(self.fake.set_status::<DaemonSet>(
            Some(NS),
            name,
            json!({ "observedGeneration": generation, "numberReady": nodes, "desiredNumberScheduled": nodes,
                    "numberAvailable": nodes, "updatedNumberScheduled": nodes }),
        ));
    }

    /// Sets a DaemonSet's status as the DaemonSet controller would after seeing its spec:
    /// `updated` of `nodes` pods run the current template, `ready` are ready.
    pub fn daemonset_status(&self, name: &str, nodes: i64, updated: i64, ready: i64) {
        let generation = self
            .fake
            .get::<DaemonSet>(Some(NS), name)
            .and_then(|d| d.metadata.generation)
            .unwrap_or(1);
        assert!(self.fake.set_status::<DaemonSet>(
            Some(NS),
            name,
            json!({ "observedGeneration": generation, "numberReady": ready, "desiredNumberScheduled": nodes,
                    "numberAvailable": ready, "updatedNumberScheduled": updated }),
        ));
    }

    /// Marks a Deployment (a pool mounter) rolled out and available.
    pub fn deployment_ready(&self, name: &str) {
        let generation = self
            .fake
            .get::<k8s_openapi::api::apps::v1::Deployment>(Some(NS), name)
            .and_then(|d| d.metadata.generation)
            .unwrap_or(1);
        assert!(self.fake.set_status::<k8s_openapi::api::apps::v1::Deployment>(
            Some(NS),
            name,
            json!({ "observedGeneration": generation, "replicas": 1, "updatedReplicas": 1,
                    "readyReplicas": 1, "availableReplicas": 1 }),
        ));
    }

    /// Marks every pool mounter Deployment rolled out and available.
    pub fn mounters_ready(&self) {
        for d in self.names::<k8s_openapi::api::apps::v1::Deployment>() {
            if d.starts_with("hpp-pool-") {
                self.deployment_ready(&d);
            }
        }
    }

    /// Binds every pool PVC, as a provisioner would.
    pub fn bind_claims(&self) {
        for pvc in self.fake.list::<PersistentVolumeClaim>() {
            let name = pvc.metadata.name.clone().unwrap();
            self.fake
                .set_status::<PersistentVolumeClaim>(Some(NS), &name, json!({ "phase": "Bound" }));
        }
    }

    pub fn condition(&self, ty: &str) -> (String, Option<String>, Option<String>) {
        let status = self.hpp().status.unwrap_or_default();
        let c = status
            .conditions
            .iter()
            .find(|c| c.type_ == ty)
            .expect("condition present");
        (c.status.clone(), c.reason.clone(), c.message.clone())
    }

    /// Names of the stored objects of a kind.
    pub fn names<K>(&self) -> Vec<String>
    where
        K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned,
    {
        self.fake
            .list::<K>()
            .into_iter()
            .map(|o| o.meta().name.clone().unwrap_or_default())
            .collect()
    }
}

pub fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        ..Default::default()
    }
}
