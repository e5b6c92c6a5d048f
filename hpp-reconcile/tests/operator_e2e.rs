//! End-to-end: the whole operator against the fake API server, for every example CR.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

mod support;

use hpp_api::HostPathProvisioner;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use kube::api::ApiResource;
use kube::core::GroupVersionKind;
use support::{CR, Env, NS};

#[tokio::test]
async fn install_local_pool_then_available_and_steady() {
    let env = Env::new("hostpathprovisioner_cr", &["node01", "node02"]);
    env.converge().await;
    let hpp = env.hpp();
    assert_eq!(
        hpp.metadata.finalizers.as_deref(),
        Some(&["finalizer.delete.hostpath-provisioner".to_owned()][..])
    );
    assert_eq!(env.names::<DaemonSet>(), ["hostpath-provisioner-csi"]);
    assert_eq!(env.names::<ServiceAccount>(), ["hostpath-provisioner-admin-csi"]);
    assert_eq!(env.names::<ClusterRole>(), ["hostpath-provisioner-admin-csi"]);
    assert_eq!(env.names::<ClusterRoleBinding>(), ["hostpath-provisioner-admin-csi"]);
    assert_eq!(env.names::<Role>(), ["hostpath-provisioner-admin-csi"]);
    assert_eq!(env.names::<RoleBinding>(), ["hostpath-provisioner-admin-csi"]);
    assert_eq!(env.names::<CSIDriver>(), ["kubevirt.io.hostpath-provisioner"]);
    assert!(env.names::<PersistentVolumeClaim>().is_empty());
    // The DaemonSet is not ready yet: deploying.
    assert_eq!(
        env.condition("Progressing"),
        (
            "True".into(),
            Some("DeployStarted".into()),
            Some("Started Deployment".into())
        )
    );
    assert_eq!(env.condition("Available").0, "False");
    let status = env.hpp().status.unwrap();
    assert_eq!(
        (status.operator_version.as_deref(), status.observed_version.as_deref()),
        (Some("v1.0.0"), None)
    );
    env.daemonset_ready("hostpath-provisioner-csi", 2);
    env.converge().await;
    assert_eq!(
        env.condition("Available"),
        (
            "True".into(),
            Some("Complete".into()),
            Some("Application Available".into())
        )
    );
    let status = env.hpp().status.unwrap();
    assert_eq!(status.observed_version.as_deref(), Some("v1.0.0"));
    assert_eq!(status.storage_pool_statuses.len(), 1);
    assert_eq!(status.storage_pool_statuses[0].name, "local");
    // Events on the transitions (DeployStarted, then Complete).
    let events = env.fake.list::<k8s_openapi::api::events::v1::Event>();
    let reasons: Vec<_> = events.iter().filter_map(|e| e.reason.clone()).collect();
    assert!(
        reasons.contains(&"DeployStarted".into()) && reasons.contains(&"Complete".into()),
        "{reasons:?}"
    );
    // Steady state: a pass reads but never writes.
    env.fake.clear_requests();
    env.pass().await.unwrap();
    assert!(env.fake.write_requests().is_empty(), "{:#?}", env.fake.write_requests());
    assert!(!env.fake.requests().is_empty());
    // Every apply used a per-sub-reconciler field manager with force.
    let env2 = Env::new("hostpathprovisioner_cr", &["node01"]);
    env2.pass().await.unwrap();
    env2.pass().await.unwrap();
    let applies: Vec<_> = env2
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.content_type.as_deref() == Some("application/apply-patch+yaml"))
        .collect();
    assert!(applies.len() >= 7);
    assert!(
        applies
            .iter()
            .all(|r| r.query_param("force").as_deref() == Some("true"))
    );
    assert!(
        applies
            .iter()
            .any(|r| r.query_param("fieldManager").as_deref() == Some("hpp-operator/csi-daemonset"))
    );
    assert!(
        applies
            .iter()
            .any(|r| r.query_param("fieldManager").as_deref() == Some("hpp-operator/rbac"))
    );
}

#[tokio::test]
async fn legacy_cr_runs_both_provisioners_and_switching_to_pools_removes_legacy() {
    let env = Env::new("hostpathprovisioner_legacy_cr", &["node01"]);
    env.converge().await;
    assert_eq!(
        env.names::<DaemonSet>(),
        ["hostpath-provisioner", "hostpath-provisioner-csi"]
    );
    assert_eq!(
        env.names::<ServiceAccount>(),
        ["hostpath-provisioner-admin", "hostpath-provisioner-admin-csi"]
    );
    assert_eq!(
        env.names::<ClusterRole>(),
        ["hostpath-provisioner", "hostpath-provisioner-admin-csi"]
    );
    env.daemonset_ready("hostpath-provisioner-csi", 1);
    env.converge().await;
    assert_eq!(
        env.condition("Available").0,
        "False",
        "the legacy DaemonSet is not ready yet"
    );
    env.daemonset_ready("hostpath-provisioner", 1);
    env.converge().await;
    assert_eq!(env.condition("Available").0, "True");
    assert_eq!(env.hpp().status.unwrap().storage_pool_statuses[0].name, "legacy");
    // Switch the CR to storage pools: the sweep removes every legacy object.
    let mut hpp = env.hpp();
    hpp.spec = support::example("hostpathprovisioner_cr").spec;
    env.fake.seed(&hpp);
    env.converge().await;
    assert_eq!(env.names::<DaemonSet>(), ["hostpath-provisioner-csi"]);
    assert_eq!(env.names::<ClusterRole>(), ["hostpath-provisioner-admin-csi"]);
    assert_eq!(env.names::<ServiceAccount>(), ["hostpath-provisioner-admin-csi"]);
}

#[tokio::test]
async fn pvc_template_rwo_pool_reports_claims_until_bound() {
    let env = Env::new("hostpathprovisioner_pvctemplate_cr", &["node01", "node02"]);
    env.converge().await;
    assert_eq!(
        env.names::<PersistentVolumeClaim>(),
        ["hpp-pool-local-node01", "hpp-pool-local-node02"]
    );
    assert_eq!(
        env.names::<Deployment>(),
        ["hpp-pool-local-node01", "hpp-pool-local-node02"]
    );
    let pvc = env
        .fake
        .get::<PersistentVolumeClaim>(Some(NS), "hpp-pool-local-node01")
        .unwrap();
    assert_eq!(pvc.spec.unwrap().volume_mode.as_deref(), Some("Block"));
    env.daemonset_ready("hostpath-provisioner-csi", 2);
    env.converge().await;
    let (_, reason, message) = env.condition("Degraded");
    assert_eq!(reason.as_deref(), Some("StoragePoolNotReady"));
    assert_eq!(
        message.as_deref(),
        Some("error: Pool PVC hpp-pool-local-node01 is Pending instead of Bound")
    );
    env.bind_claims();
    env.converge().await;
    // Claims Bound, mounters not ready yet: the pool names the nodes it cannot serve.
    let (_, reason, message) = env.condition("Degraded");
    assert_eq!(reason.as_deref(), Some("StoragePoolNotReady"));
    assert!(message.unwrap().contains("node01, node02"));
    env.mounters_ready();
    env.converge().await;
    assert_eq!(env.condition("Available").0, "True");
    let pool = &env.hpp().status.unwrap().storage_pool_statuses[0];
    assert_eq!((pool.desired_ready, pool.claim_statuses.len()), (Some(2), 2));
}

#[tokio::test]
async fn rwx_overlay_pool_with_snapshotting() {
    let env = Env::new("hostpathprovisioner_overlay_csi_cr", &["node01", "node02"]);
    env.converge().await;
    assert_eq!(env.names::<PersistentVolumeClaim>(), ["hpp-pool-nfs-backend-shared"]);
    assert_eq!(env.names::<StorageClass>(), ["hpp-overlay"]);
    assert_eq!(env.names::<Deployment>().len(), 2);
    let ds = env.fake.get::<DaemonSet>(Some(NS), "hostpath-provisioner-csi").unwrap();
    let containers: Vec<String> = ds
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
        .containers
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(containers.last().map(String::as_str), Some("csi-snapshotter"));
    let cr = env
        .fake
        .get::<ClusterRole>(None, "hostpath-provisioner-admin-csi")
        .unwrap();
    assert!(cr.rules.unwrap().iter().any(|r| {
        r.resources
            .as_ref()
            .is_some_and(|x| x.contains(&"volumesnapshotcontents".to_owned()))
    }));
}

#[tokio::test]
async fn upgrade_adopts_kubevirt_objects_and_refused_downgrade_writes_only_status() {
    // Objects a KubeVirt operator created (with its last-applied annotation, no hash of ours).
    let env = Env::with_version("hostpathprovisioner_cr", &["node01"], "v1.1.0");
    let mut sa = ServiceAccount {
        metadata: support::meta("hostpath-provisioner-admin-csi"),
        ..Default::default()
    };
    sa.metadata.namespace = Some(NS.into());
    sa.metadata.annotations = Some(
        [(
            "hostpathprovisioner.kubevirt.io/lastAppliedConfiguration".to_owned(),
            "{}".to_owned(),
        )]
        .into(),
    );
    env.fake.seed(&sa);
    let mut hpp = env.hpp();
    hpp.status = Some(hpp_api::HostPathProvisionerStatus {
        observed_version: Some("v1.0.0".into()),
        ..Default::default()
    });
    env.fake.seed(&hpp);
    env.converge().await;
    assert_eq!(
        env.names::<ServiceAccount>(),
        ["hostpath-provisioner-admin-csi"],
        "adopted, not duplicated"
    );
    let sa = env
        .fake
        .get::<ServiceAccount>(Some(NS), "hostpath-provisioner-admin-csi")
        .unwrap();
    assert!(
        sa.metadata
            .owner_references
            .is_some_and(|o| o[0].kind == "HostPathProvisioner")
    );
    let (status, reason, message) = env.condition("Progressing");
    assert_eq!((status.as_str(), reason.as_deref()), ("True", None));
    assert_eq!(env.condition("Degraded").1.as_deref(), Some("UpgradeStarted"));
    assert_eq!(
        env.condition("Degraded").2.as_deref(),
        Some("Started upgrade to version v1.1.0")
    );
    let _ = message;
    env.daemonset_ready("hostpath-provisioner-csi", 1);
    env.converge().await;
    assert_eq!(env.hpp().status.unwrap().observed_version.as_deref(), Some("v1.1.0"));

    // An older operator refuses and touches nothing but the CR status.
    let old = Env::with_version("hostpathprovisioner_cr", &["node01"], "v0.9.0");
    let mut hpp = old.hpp();
    hpp.metadata.finalizers = Some(vec!["finalizer.delete.hostpath-provisioner".into()]);
    hpp.status = Some(hpp_api::HostPathProvisionerStatus {
        observed_version: Some("v1.0.0".into()),
        ..Default::default()
    });
    old.fake.seed(&hpp);
    old.fake.clear_requests();
    let err = old.pass().await.unwrap_err();
    assert_eq!(err.category(), "downgrade");
    let writes: Vec<String> = old.fake.write_requests().iter().map(|r| r.path.clone()).collect();
    assert!(
        writes
            .iter()
            .all(|p| p.contains("/hostpathprovisioners/") || p.contains("/events")),
        "{writes:?}"
    );
    assert!(old.names::<DaemonSet>().is_empty());
    let (_, reason, message) = old.condition("Degraded");
    assert_eq!(reason.as_deref(), Some("ReconcileFailed"));
    assert_eq!(
        message.as_deref(),
        Some("operator downgraded from v1.0.0 to v0.9.0, will not reconcile")
    );
    assert_eq!(old.hpp().status.unwrap().observed_version.as_deref(), Some("v1.0.0"));
}

#[tokio::test]
async fn a_second_cr_is_reported_in_its_own_status() {
    let env = Env::new("hostpathprovisioner_cr", &["node01"]);
    env.converge().await;
    let mut second: HostPathProvisioner = support::example("hostpathprovisioner_cr");
    second.metadata.name = Some("second".into());
    env.fake.seed(&second);
    let second = env.fake.get::<HostPathProvisioner>(None, "second").unwrap();
    hpp_reconcile::operator::reconcile(std::sync::Arc::new(second), env.ctx.clone())
        .await
        .unwrap();
    let second = env.fake.get::<HostPathProvisioner>(None, "second").unwrap();
    assert!(second.metadata.finalizers.is_none_or(|f| f.is_empty()));
    let degraded = second
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Degraded")
        .unwrap();
    assert_eq!(degraded.status, "True");
    assert!(
        degraded
            .message
            .unwrap()
            .contains("there should be a single hostpath provisioner, 2 items found; hostpath-provisioner")
    );
    assert_eq!(env.hpp().metadata.name.as_deref(), Some(CR));
    env.fake.clear_requests();
    env.pass().await.unwrap();
    assert!(env.fake.write_requests().is_empty(), "the first CR is unaffected");
}

fn api(group: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, "v1", kind), plural)
}

#[tokio::test]
async fn openshift_and_prometheus_objects_follow_discovery() {
    let env = Env::new("hostpathprovisioner_legacy_cr", &["node01"]);
    let scc = api(
        "security.openshift.io",
        "SecurityContextConstraints",
        "securitycontextconstraints",
    );
    let rule = api("monitoring.coreos.com", "PrometheusRule", "prometheusrules");
    let monitor = api("monitoring.coreos.com", "ServiceMonitor", "servicemonitors");
    env.fake.register_api(scc.clone(), false, false);
    env.fake.register_api(rule.clone(), true, false);
    env.fake.register_api(monitor.clone(), true, false);
    env.converge().await;
    let sccs: Vec<String> = env
        .fake
        .list_dynamic(&scc)
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(sccs, ["hostpath-provisioner", "hostpath-provisioner-csi"]);
    assert_eq!(env.fake.list_dynamic(&rule).len(), 1);
    assert_eq!(env.fake.list_dynamic(&monitor).len(), 1);
    assert!(
        env.names::<Role>()
            .contains(&"hostpath-provisioner-monitoring".to_owned())
    );
    assert!(
        env.names::<k8s_openapi::api::core::v1::Service>()
            .contains(&"hpp-prometheus-metrics".to_owned())
    );
    // The API goes away: its objects are no longer managed (and not listed by the sweep).
    env.fake.unregister_api(&monitor);
    env.fake.unregister_api(&rule);
    env.converge().await;
    assert!(
        !env.names::<Role>()
            .contains(&"hostpath-provisioner-monitoring".to_owned()),
        "monitoring RBAC swept"
    );
}
