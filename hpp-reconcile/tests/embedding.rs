//! What the framework promises an embedder, against the fake API server: the standard operator
//! makes no call its derived RBAC does not grant (with the fake enforcing it), an embedder's
//! own failure (`Error::other`) is reported and retried, and a step wanting an object outside
//! the operator's namespace is refused before anything is written.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

mod support;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use hpp_api::HostPathProvisioner;
use hpp_reconcile::metrics::Metrics;
use hpp_reconcile::object::Kind;
use hpp_reconcile::operator::{Context, error_policy};
use hpp_reconcile::reconcilers::common::{object_meta, typed_ssa};
use hpp_reconcile::{ClusterFacts, DesiredObject, Error, OperatorConfig, OperatorRules, Pipeline, SubReconciler};
use hpp_testkit::RbacPolicy;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ApiResource;
use kube::core::GroupVersionKind;
use kube::runtime::controller::Action;
use serde_json::json;
use support::{CR, Env, NS};

/// The rules `pipeline` derives, enforced by the fake for the operator's namespace.
fn derived_policy(pipeline: &Pipeline) -> RbacPolicy {
    let rules = OperatorRules::for_pipeline(pipeline);
    RbacPolicy::new()
        .user(format!("system:serviceaccount:{NS}:hostpath-provisioner-operator"))
        .cluster_rules(rules.cluster_rules())
        .namespace_rules(NS, rules.namespace_rules())
}

fn api(group: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, "v1", kind), plural)
}

#[tokio::test]
async fn the_standard_operator_makes_no_call_its_derived_rbac_does_not_grant() {
    // Every step at work: legacy and CSI, pvcTemplate pools with mounters, the overlay class,
    // OpenShift SCCs and the Prometheus objects, then deletion with cleanup Jobs.
    let env = Env::new("hostpathprovisioner_overlay_csi_cr", &["node01", "node02"]);
    env.fake.register_api(
        api(
            "security.openshift.io",
            "SecurityContextConstraints",
            "securitycontextconstraints",
        ),
        false,
        false,
    );
    env.fake.register_api(
        api("monitoring.coreos.com", "PrometheusRule", "prometheusrules"),
        true,
        false,
    );
    env.fake.register_api(
        api("monitoring.coreos.com", "ServiceMonitor", "servicemonitors"),
        true,
        false,
    );
    env.fake.enforce_rbac(derived_policy(&Pipeline::standard()));
    env.converge().await;
    env.daemonset_ready("hostpath-provisioner-csi", 2);
    env.mounters_ready();
    env.bind_claims();
    env.converge().await;
    assert_eq!(env.condition("Available").0, "True");
    assert!(
        env.fake.denied_requests().is_empty(),
        "{:#?}",
        env.fake.denied_requests()
    );
    env.fake.remove::<HostPathProvisioner>(None, CR);
    assert_eq!(env.pass().await.unwrap_err().category(), "cleanup_pending");
    for job in env.names::<Job>() {
        assert!(env.fake.set_status::<Job>(Some(NS), &job, json!({ "succeeded": 1 })));
    }
    env.pass().await.unwrap();
    assert!(env.fake.get::<HostPathProvisioner>(None, CR).is_none(), "cleaned up");
    assert!(
        env.fake.denied_requests().is_empty(),
        "{:#?}",
        env.fake.denied_requests()
    );
}

/// A step of an outside team that fails in a way of its own, or wants an object elsewhere.
struct SiteInventory {
    namespace: Option<&'static str>,
}

#[async_trait]
impl SubReconciler for SiteInventory {
    fn name(&self) -> &str {
        "site-inventory"
    }

    fn kinds(&self, _facts: &ClusterFacts) -> Vec<Kind> {
        vec![Kind::of::<ConfigMap>()]
    }

    fn desired(
        &self,
        hpp: &HostPathProvisioner,
        cfg: &OperatorConfig,
        _facts: &ClusterFacts,
    ) -> hpp_reconcile::Result<Vec<DesiredObject>> {
        let Some(namespace) = self.namespace else {
            let timeout = std::io::Error::new(std::io::ErrorKind::TimedOut, "inventory service timed out");
            return Err(Error::other(self.name(), timeout));
        };
        Ok(vec![typed_ssa(&ConfigMap {
            metadata: object_meta("site-inventory", Some(namespace), cfg, &[], Some(hpp)),
            ..Default::default()
        })?])
    }
}

fn with_step(env: &Env, step: SiteInventory) -> Arc<Context> {
    let pipeline = Pipeline::standard().with(step).unwrap();
    Arc::new(
        Context::new(
            env.fake.client(),
            support::config("v1.0.0"),
            pipeline,
            Metrics::default(),
        )
        .with_backoff(Duration::from_millis(20), Duration::from_millis(200))
        .with_warning_grace(Duration::ZERO),
    )
}

/// Reconciles with `ctx` until a pass fails (the first only adds the finalizer).
async fn failing_pass(env: &Env, ctx: &Arc<Context>) -> Error {
    for _ in 0..3 {
        if let Err(e) = hpp_reconcile::operator::reconcile(Arc::new(env.hpp()), ctx.clone()).await {
            return e;
        }
    }
    panic!("the pass did not fail");
}

fn warning_events(env: &Env, reason: &str) -> Vec<String> {
    env.fake
        .list::<k8s_openapi::api::events::v1::Event>()
        .into_iter()
        .filter(|e| e.type_.as_deref() == Some("Warning") && e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.note)
        .collect()
}

#[tokio::test]
async fn an_embedders_own_failure_degrades_the_cr_with_its_message_and_is_retried() {
    let env = Env::new("hostpathprovisioner_cr", &["node01"]);
    let ctx = with_step(&env, SiteInventory { namespace: None });
    let err = failing_pass(&env, &ctx).await;
    let hpp = Arc::new(env.hpp());
    assert!(matches!(err.root(), Error::Other { step, .. } if step == "site-inventory"));
    let (status, reason, message) = env.condition("Degraded");
    assert_eq!(status, "True");
    assert_eq!(reason.as_deref(), Some("ReconcileFailed"), "{message:?}");
    assert_eq!(
        message.as_deref(),
        Some("Unable to successfully reconcile: step site-inventory: inventory service timed out")
    );
    assert_eq!(
        warning_events(&env, "StepFailed"),
        ["step site-inventory: inventory service timed out"]
    );
    // Retried with the backoff of any failure: the base delay after the first.
    assert_eq!(error_policy(hpp, &err, ctx), Action::requeue(Duration::from_millis(20)));
}

#[tokio::test]
async fn a_step_wanting_an_object_in_another_namespace_is_refused_before_any_write() {
    let env = Env::new("hostpathprovisioner_cr", &["node01"]);
    let ctx = with_step(
        &env,
        SiteInventory {
            namespace: Some("team-a"),
        },
    );
    let err = failing_pass(&env, &ctx).await;
    assert!(matches!(err.root(), Error::ForeignNamespace { .. }), "{err}");
    let (status, _, message) = env.condition("Degraded");
    assert_eq!(status, "True");
    let message = message.unwrap();
    assert!(
        message.contains(&format!(
            "step site-inventory wants /ConfigMap team-a/site-inventory, outside the operator's namespace {NS}"
        )),
        "{message}"
    );
    assert!(env.fake.get::<ConfigMap>(Some("team-a"), "site-inventory").is_none());
    assert!(
        env.fake
            .get::<DaemonSet>(Some(NS), "hostpath-provisioner-csi")
            .is_none(),
        "no step applied anything: the pass stopped before the first write"
    );
}
