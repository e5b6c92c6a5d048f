//! What an admin sees when something is not (yet) right: rollouts judged as `kubectl rollout
//! status` does, the `kubevirt_hpp_cr_ready` gauge, pool phases, and a quiet CR delete.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

mod support;

use std::sync::Arc;
use std::time::Duration;

use hpp_api::HostPathProvisioner;
use hpp_reconcile::metrics::ResultLabels;
use hpp_reconcile::operator::{Context, reconcile};
use hpp_reconcile::{OperatorConfig, Pipeline};
use support::{CR, Env, NS};

const CSI_DS: &str = "hostpath-provisioner-csi";

/// A second operator context on the same fake cluster, with another driver image.
fn swapped_image_context(env: &Env) -> Arc<Context> {
    let cfg = OperatorConfig::from_env([
        ("OPERATOR_VERSION", "v1.0.0"),
        ("POD_NAMESPACE", NS),
        ("CSI_PROVISIONER_IMAGE", "registry.example/hpp-csi-driver:new"),
    ]);
    let ctx = Context::new(env.fake.client(), cfg, Pipeline::standard(), env.ctx.metrics.clone())
        .with_backoff(Duration::from_millis(20), Duration::from_millis(200));
    Arc::new(ctx)
}

#[tokio::test]
async fn an_image_swap_is_progressing_until_updated_pods_are_ready() {
    let env = Env::new("hostpathprovisioner_cr", &["node01", "node02"]);
    env.converge().await;
    env.daemonset_ready(CSI_DS, 2);
    env.converge().await;
    assert_eq!(env.condition("Available").0, "True");
    assert_eq!(env.ctx.metrics.cr_ready.get(), 1);
    let generation = |env: &Env| {
        env.fake
            .get::<k8s_openapi::api::apps::v1::DaemonSet>(Some(NS), CSI_DS)
            .and_then(|d| d.metadata.generation)
            .unwrap()
    };
    let before = generation(&env);
    // The operator now runs with a new driver image: the DaemonSet template changes, the old
    // pods are all still ready, none is updated.
    let swapped = swapped_image_context(&env);
    reconcile(Arc::new(env.hpp()), swapped.clone()).await.unwrap();
    assert!(generation(&env) > before, "the template changed");
    env.daemonset_status(CSI_DS, 2, 0, 2);
    reconcile(Arc::new(env.hpp()), swapped.clone()).await.unwrap();
    let (status, reason, message) = env.condition("Progressing");
    assert_eq!((status.as_str(), reason.as_deref()), ("True", Some("UpgradeStarted")));
    assert!(message.unwrap().contains("0 of 2 pods updated"));
    assert_eq!(env.condition("Available").0, "True", "old pods still serve");
    assert_eq!(env.condition("Degraded").0, "False");
    assert_eq!(env.ctx.metrics.cr_ready.get(), 0, "not ready while rolling out");
    // Every pod updated, one new pod not ready yet: still the same rollout.
    env.daemonset_status(CSI_DS, 2, 2, 1);
    reconcile(Arc::new(env.hpp()), swapped.clone()).await.unwrap();
    assert_eq!(env.condition("Progressing").1.as_deref(), Some("UpgradeStarted"));
    assert_eq!(env.ctx.metrics.cr_ready.get(), 0);
    // Done.
    env.daemonset_ready(CSI_DS, 2);
    reconcile(Arc::new(env.hpp()), swapped.clone()).await.unwrap();
    assert_eq!(env.condition("Available").1.as_deref(), Some("Complete"));
    assert_eq!(env.condition("Progressing").0, "False");
    assert_eq!(env.ctx.metrics.cr_ready.get(), 1);
}

#[tokio::test]
async fn a_first_deploy_that_never_gets_ready_reports_not_ready_not_unknown() {
    let env = Env::new("hostpathprovisioner_cr", &["node01"]);
    assert_eq!(env.ctx.metrics.cr_ready.get(), -1, "no pass yet");
    env.converge().await;
    env.daemonset_status(CSI_DS, 1, 1, 0);
    env.converge().await;
    assert_eq!(env.condition("Progressing").1.as_deref(), Some("DeployStarted"));
    // HPPNotReady fires on `kubevirt_hpp_cr_ready == 0`.
    assert_eq!(env.ctx.metrics.cr_ready.get(), 0);
}

#[tokio::test]
async fn a_cr_delete_resets_the_gauge_and_a_gone_cr_is_not_an_error() {
    let env = Env::new("hostpathprovisioner_cr", &["node01"]);
    env.converge().await;
    env.daemonset_ready(CSI_DS, 1);
    env.converge().await;
    assert_eq!(env.ctx.metrics.cr_ready.get(), 1);
    env.fake.remove::<HostPathProvisioner>(None, CR);
    let stale = env.hpp();
    env.pass().await.unwrap();
    assert!(env.fake.get::<HostPathProvisioner>(None, CR).is_none(), "CR gone");
    assert_eq!(env.ctx.metrics.cr_ready.get(), -1, "no CR, no readiness");
    // A second pass on the cached (now stale) object: the finalizer patch gets NotFound.
    reconcile(Arc::new(stale), env.ctx.clone())
        .await
        .expect("NotFound while removing the finalizer means done");
    let errors = env
        .ctx
        .metrics
        .reconciles
        .get_or_create(&ResultLabels { result: "error" })
        .get();
    assert_eq!(errors, 0, "no reconcile error counted");
}

#[tokio::test]
async fn pvc_template_pool_phase_follows_claims_then_mounters() {
    use k8s_openapi::api::apps::v1::Deployment;
    let env = Env::new("hostpathprovisioner_pvctemplate_cr", &["node01", "node02"]);
    env.converge().await;
    env.daemonset_ready(CSI_DS, 2);
    env.converge().await;
    let pool = |env: &Env| env.hpp().status.unwrap().storage_pool_statuses[0].clone();
    assert_eq!(pool(&env).phase.as_deref(), Some("Preparing"), "claims Pending");
    env.bind_claims();
    env.converge().await;
    let p = pool(&env);
    assert_eq!(
        p.phase.as_deref(),
        Some("Mounting"),
        "claims Bound, 0 of 2 mounters ready"
    );
    assert_eq!((p.current_ready, p.desired_ready), (Some(0), Some(2)));
    let mounter_ready = |name: &str| {
        let generation = env
            .fake
            .get::<Deployment>(Some(NS), name)
            .and_then(|d| d.metadata.generation)
            .unwrap();
        assert!(env.fake.set_status::<Deployment>(
            Some(NS),
            name,
            serde_json::json!({ "observedGeneration": generation, "replicas": 1, "updatedReplicas": 1,
                                "readyReplicas": 1, "availableReplicas": 1 }),
        ));
    };
    mounter_ready("hpp-pool-local-node01");
    env.converge().await;
    assert_eq!(pool(&env).phase.as_deref(), Some("Mounting"), "1 of 2 mounters ready");
    mounter_ready("hpp-pool-local-node02");
    env.converge().await;
    let p = pool(&env);
    assert_eq!(p.phase.as_deref(), Some("Ready"));
    assert_eq!(p.current_ready, Some(2));
}

/// Issue 16: a guarded pool whose mounter is not ready on one node must say so on the CR: the
/// pool status (phase and message), the Degraded condition and a Warning Event, each naming the
/// pool and the node.
#[tokio::test]
async fn a_mounter_not_ready_on_one_node_is_reported_with_pool_and_node() {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::events::v1::Event;
    let env = Env::new("hostpathprovisioner_pvctemplate_cr", &["node01", "node02"]);
    env.converge().await;
    env.daemonset_ready(CSI_DS, 2);
    env.bind_claims();
    let mounter = |name: &str, available: i64| {
        let generation = env
            .fake
            .get::<Deployment>(Some(NS), name)
            .and_then(|d| d.metadata.generation)
            .unwrap();
        assert!(env.fake.set_status::<Deployment>(
            Some(NS),
            name,
            serde_json::json!({ "observedGeneration": generation, "replicas": 1, "updatedReplicas": 1,
                                "readyReplicas": available, "availableReplicas": available }),
        ));
    };
    mounter("hpp-pool-local-node01", 1);
    mounter("hpp-pool-local-node02", 1);
    env.converge().await;
    assert_eq!(env.condition("Available").0, "True");
    let pool = |env: &Env| env.hpp().status.unwrap().storage_pool_statuses[0].clone();
    assert_eq!(pool(&env).message, None);

    // node02's mounter loses its pod.
    mounter("hpp-pool-local-node02", 0);
    env.converge().await;
    let p = pool(&env);
    assert_eq!(p.phase.as_deref(), Some("Mounting"));
    assert_eq!((p.current_ready, p.desired_ready), (Some(1), Some(2)));
    let message = p.message.unwrap();
    assert!(
        message.contains("local") && message.contains("node02") && !message.contains("node01"),
        "{message}"
    );
    let (status, reason, message) = env.condition("Degraded");
    assert_eq!(
        (status.as_str(), reason.as_deref()),
        ("True", Some("StoragePoolNotReady"))
    );
    let message = message.unwrap();
    assert!(message.contains("local") && message.contains("node02"), "{message}");
    let warnings: Vec<Event> = env
        .fake
        .list::<Event>()
        .into_iter()
        .filter(|e| e.type_.as_deref() == Some("Warning") && e.reason.as_deref() == Some("StoragePoolNotReady"))
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    let note = warnings[0].note.clone().unwrap_or_default();
    assert!(note.contains("local") && note.contains("node02"), "{note}");

    // Back: healthy again, no message.
    mounter("hpp-pool-local-node02", 1);
    env.converge().await;
    assert_eq!(env.condition("Available").0, "True");
    assert_eq!(pool(&env).message, None);
}

#[tokio::test]
async fn releasing_a_gone_second_cr_is_not_an_error() {
    let env = Env::new("hostpathprovisioner_cr", &["node01"]);
    env.converge().await;
    // A stale copy of a deleted second CR, still carrying our finalizer; the API no longer has it.
    let mut second: HostPathProvisioner = support::example("hostpathprovisioner_cr");
    second.metadata.name = Some("second".into());
    second.metadata.finalizers = Some(vec![hpp_api::constants::FINALIZER.to_owned()]);
    second.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    second.metadata.resource_version = Some("1".into());
    reconcile(Arc::new(second), env.ctx.clone())
        .await
        .expect("NotFound while releasing a gone CR means done");
}

fn warning_events(env: &Env) -> Vec<k8s_openapi::api::events::v1::Event> {
    env.fake
        .list::<k8s_openapi::api::events::v1::Event>()
        .into_iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .collect()
}

#[tokio::test]
async fn a_transient_failure_during_a_healthy_first_deploy_emits_no_warning_event() {
    use hpp_testkit::FailureRule;
    let env = Env::new("hostpathprovisioner_pvctemplate_cr", &["node01"]);
    env.pass().await.unwrap(); // adds the finalizer
    // The first deploy pass fails once (the API server hiccups on the DaemonSet).
    env.fake
        .fail_requests(FailureRule::new(500).path_contains("/daemonsets").times(1));
    assert!(env.pass().await.is_err());
    assert_eq!(
        env.condition("Degraded").0,
        "True",
        "the status still says what happened"
    );
    env.converge().await;
    env.daemonset_ready(CSI_DS, 1);
    env.converge().await;
    // DaemonSets ready, pool claim not bound yet: StoragePoolNotReady, routine for a moment.
    assert_eq!(env.condition("Degraded").1.as_deref(), Some("StoragePoolNotReady"));
    env.bind_claims();
    env.converge().await;
    env.mounters_ready();
    env.converge().await;
    assert_eq!(env.condition("Available").0, "True");
    assert!(warning_events(&env).is_empty(), "{:#?}", warning_events(&env));
}

#[tokio::test]
async fn a_first_deploy_failure_that_outlasts_the_grace_is_a_warning() {
    use hpp_testkit::FailureRule;
    let env = Env::new("hostpathprovisioner_cr", &["node01"]);
    let ctx = Context::new(
        env.fake.client(),
        support::config("v1.0.0"),
        Pipeline::standard(),
        env.ctx.metrics.clone(),
    )
    .with_warning_grace(Duration::ZERO);
    env.pass().await.unwrap(); // adds the finalizer
    env.fake
        .fail_requests(FailureRule::new(500).path_contains("/daemonsets"));
    assert!(reconcile(Arc::new(env.hpp()), Arc::new(ctx)).await.is_err());
    let warnings = warning_events(&env);
    assert!(
        warnings.iter().any(|e| e.reason.as_deref() == Some("ReconcileFailed")),
        "{warnings:#?}"
    );
    // With the default grace the same failure is held back, and the pass asks to be retried.
    let env = Env::new("hostpathprovisioner_cr", &["node01"]);
    env.pass().await.unwrap();
    env.fake
        .fail_requests(FailureRule::new(500).path_contains("/daemonsets"));
    assert!(env.pass().await.is_err());
    assert!(env.pass().await.is_err());
    assert!(warning_events(&env).is_empty());
}

#[tokio::test]
async fn a_mounter_rollout_is_progressing_and_named_like_a_daemonset_rollout() {
    let env = Env::new("hostpathprovisioner_pvctemplate_cr", &["node01", "node02"]);
    env.converge().await;
    env.daemonset_ready(CSI_DS, 2);
    env.bind_claims();
    env.converge().await;
    assert_eq!(
        env.condition("Available").0,
        "False",
        "claims Bound but no mounter available yet"
    );
    env.mounters_ready();
    env.converge().await;
    assert_eq!(env.condition("Available").1.as_deref(), Some("Complete"));
    assert_eq!(env.ctx.metrics.cr_ready.get(), 1);
    // A new mounter template the Deployment controller has not caught up with yet.
    let name = "hpp-pool-local-node02";
    assert!(env.fake.set_status::<k8s_openapi::api::apps::v1::Deployment>(
        Some(NS),
        name,
        serde_json::json!({ "observedGeneration": 0, "replicas": 1, "updatedReplicas": 0, "availableReplicas": 1 }),
    ));
    env.converge().await;
    let (status, reason, message) = env.condition("Progressing");
    assert_eq!((status.as_str(), reason.as_deref()), ("True", Some("UpgradeStarted")));
    assert!(message.unwrap().contains(&format!("Deployment {name}")));
    assert_eq!(env.condition("Available").0, "True", "the old mounter still serves");
    assert_eq!(env.ctx.metrics.cr_ready.get(), 0);
    env.deployment_ready(name);
    env.converge().await;
    assert_eq!(env.condition("Progressing").0, "False");
    // A mounter that stops being available on a healthy CR is Degraded, and named.
    assert!(env.fake.set_status::<k8s_openapi::api::apps::v1::Deployment>(
        Some(NS),
        name,
        serde_json::json!({ "observedGeneration": 1, "replicas": 1, "updatedReplicas": 1, "availableReplicas": 0 }),
    ));
    env.converge().await;
    let (status, _, message) = env.condition("Degraded");
    assert_eq!(status, "True");
    assert!(message.unwrap().contains(name));
}

#[tokio::test]
async fn a_deletion_stuck_on_cleanup_jobs_backs_off_and_the_skip_annotation_finishes_it() {
    use hpp_reconcile::operator::error_policy;
    use kube::api::{Api, Patch, PatchParams};
    let env = Env::new("hostpathprovisioner_pvctemplate_cr", &["node01", "node02"]);
    env.converge().await;
    env.fake.remove::<HostPathProvisioner>(None, CR);
    // The cleanup Jobs never run (say the image cannot be pulled on those nodes).
    let mut delays = Vec::new();
    for _ in 0..4 {
        let err = env.pass().await.unwrap_err();
        assert_eq!(err.category(), "cleanup_pending");
        delays.push(error_policy(Arc::new(env.hpp()), &err, env.ctx.clone()));
    }
    let expected: Vec<_> = [20, 40, 80, 160]
        .into_iter()
        .map(|ms| kube::runtime::controller::Action::requeue(Duration::from_millis(ms)))
        .collect();
    assert_eq!(delays, expected, "the retry (and its warning) backs off");
    let pending: Vec<_> = warning_events(&env)
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("CleanupPending"))
        .collect();
    assert_eq!(pending.len(), 1, "told once, not every pass: {pending:#?}");
    let note = pending[0].note.clone().unwrap();
    assert!(
        note.contains("hostpathprovisioner.kubevirt.io/skip-cleanup=true"),
        "{note}"
    );
    // The way out.
    let api: Api<HostPathProvisioner> = Api::all(env.fake.client());
    api.patch(
        CR,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({
            "metadata": { "annotations": { "hostpathprovisioner.kubevirt.io/skip-cleanup": "true" } }
        })),
    )
    .await
    .unwrap();
    env.pass().await.unwrap();
    assert!(
        env.fake.get::<HostPathProvisioner>(None, CR).is_none(),
        "deletion finished"
    );
    assert!(
        env.names::<k8s_openapi::api::batch::v1::Job>().is_empty(),
        "no Job left behind"
    );
    let skipped = warning_events(&env)
        .into_iter()
        .find(|e| e.reason.as_deref() == Some("CleanupSkipped"))
        .expect("the admin is told what was not cleaned");
    let note = skipped.note.unwrap();
    assert!(
        note.contains("pool local on node node01 (/var/hpvolumes/csi)") && note.contains("node node02"),
        "{note}"
    );
}

/// Issue 13: the pool status shows the configured quota mode, the committed bytes (Bound hpp
/// PersistentVolumes of the pool) and the available bytes (the CSIStorageCapacity objects of the
/// pool's StorageClasses, largest per node, summed over nodes).
#[tokio::test]
async fn pool_status_shows_quota_committed_and_available_bytes() {
    use k8s_openapi::api::core::v1::PersistentVolume;
    use k8s_openapi::api::storage::v1::{CSIStorageCapacity, StorageClass};
    use serde_json::json;
    // Every change of the figures written at once (their pace is
    // `usage_figures_alone_are_written_at_most_once_per_interval`'s subject).
    let env =
        Env::new("hostpathprovisioner_cr", &["node01", "node02"]).map_ctx(|c| c.with_usage_interval(Duration::ZERO));
    // The example's pool `local`, with a quota backend and a second pool beside it.
    let mut hpp = env.hpp();
    let pools = hpp.spec.storage_pools.as_mut().unwrap();
    pools[0].quota = Some(hpp_api::quota::QuotaMode::Btrfs);
    let mut other = pools[0].clone();
    other.name = "other".into();
    other.path = "/var/other".into();
    other.quota = None;
    pools.push(other);
    env.fake.seed(&hpp);
    let driver = hpp_api::constants::DRIVER_NAME;
    let class = |name: &str, pool: Option<&str>| -> StorageClass {
        let mut sc = json!({ "metadata": { "name": name }, "provisioner": driver });
        if let Some(p) = pool {
            sc["parameters"] = json!({ "storagePool": p });
        }
        serde_json::from_value(sc).unwrap()
    };
    env.fake.seed(&class("hpp-local", Some("local")));
    env.fake.seed(&class("hpp-local-wffc", Some("local")));
    env.fake.seed(&class("hpp-other", Some("other")));
    env.fake.seed(&serde_json::from_value::<StorageClass>(json!({
        "metadata": { "name": "foreign" }, "provisioner": "example.com/other", "parameters": { "storagePool": "local" }
    })).unwrap());
    let pv = |name: &str, driver: &str, pool: &str, size: &str, phase: &str| -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": { "name": name },
            "spec": { "capacity": { "storage": size }, "accessModes": ["ReadWriteOnce"],
                      "csi": { "driver": driver, "volumeHandle": name, "volumeAttributes": { "storagePool": pool } } },
            "status": { "phase": phase },
        }))
        .unwrap()
    };
    env.fake.seed(&pv("pv-1", driver, "local", "1Gi", "Bound"));
    env.fake.seed(&pv("pv-2", driver, "local", "512Mi", "Bound"));
    env.fake.seed(&pv("pv-3", driver, "local", "8Gi", "Released"));
    env.fake.seed(&pv("pv-4", "example.com/other", "local", "8Gi", "Bound"));
    env.fake.seed(&pv("pv-5", driver, "other", "2Gi", "Bound"));
    let capacity = |name: &str, class: &str, node: &str, size: &str| -> CSIStorageCapacity {
        serde_json::from_value(json!({
            "metadata": { "name": name, "namespace": NS },
            "storageClassName": class,
            "nodeTopology": { "matchLabels": { "topology.hostpath.csi/node": node } },
            "capacity": size,
        }))
        .unwrap()
    };
    // Two classes of one pool report the same node: counted once.
    env.fake.seed(&capacity("csisc-1", "hpp-local", "node01", "10Gi"));
    env.fake.seed(&capacity("csisc-2", "hpp-local-wffc", "node01", "10Gi"));
    env.fake.seed(&capacity("csisc-3", "hpp-local", "node02", "5Gi"));
    env.fake.seed(&capacity("csisc-4", "foreign", "node02", "100Gi"));
    env.converge().await;
    let statuses = env.hpp().status.unwrap().storage_pool_statuses;
    let local = statuses.iter().find(|s| s.name == "local").unwrap();
    assert_eq!(local.quota, Some(hpp_api::quota::QuotaMode::Btrfs));
    assert_eq!(local.committed.as_deref(), Some("1536Mi"));
    assert_eq!(local.available.as_deref(), Some("15Gi"));
    let other = statuses.iter().find(|s| s.name == "other").unwrap();
    assert_eq!(other.quota, None);
    assert_eq!(other.committed.as_deref(), Some("2Gi"));
    assert_eq!(other.available, None, "no capacity objects for its class");
    let raw = serde_json::to_value(env.hpp()).unwrap();
    assert_eq!(raw["status"]["storagePoolStatuses"][0]["committed"], "1536Mi");

    // A volume is released: the status follows.
    env.fake
        .set_status::<PersistentVolume>(None, "pv-2", json!({ "phase": "Released" }));
    env.converge().await;
    let statuses = env.hpp().status.unwrap().storage_pool_statuses;
    let local = statuses.iter().find(|s| s.name == "local").unwrap();
    assert_eq!(local.committed.as_deref(), Some("1Gi"));
}
