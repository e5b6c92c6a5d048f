//! Pure builder tests: every owned object, built from the example CRs, with no API server.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::collections::BTreeMap;

use hpp_api::HostPathProvisioner;
use hpp_reconcile::facts::{ClaimFact, CleanupJobFact, ClusterFacts, MounterFact, NodeFact};
use hpp_reconcile::object::{ApplyStrategy, DesiredObject};
use hpp_reconcile::reconcilers::{
    csi_daemonset, csi_driver, legacy_daemonset, pool_objects, prometheus, rbac, scc, storage_pools,
};
use hpp_reconcile::{OperatorConfig, Pipeline};
use serde_json::Value;

fn example(name: &str) -> HostPathProvisioner {
    // deploy/examples/ as copied into the crate (xtask/tests/deploy_example_copies.rs keeps them equal).
    let path = format!("{}/tests/fixtures/examples/{name}.yaml", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap();
    let mut hpp: HostPathProvisioner = serde_saphyr::from_str(&text).unwrap();
    hpp.metadata.uid = Some("uid-1".into());
    hpp
}

const EXAMPLES: [&str; 4] = [
    "hostpathprovisioner_cr",
    "hostpathprovisioner_legacy_cr",
    "hostpathprovisioner_pvctemplate_cr",
    "hostpathprovisioner_overlay_csi_cr",
];

fn cfg() -> OperatorConfig {
    OperatorConfig::from_env([("OPERATOR_VERSION", "v1.0.0")])
}

fn linux_node(name: &str) -> NodeFact {
    NodeFact {
        labels: BTreeMap::from([("kubernetes.io/os".into(), "linux".into())]),
        ..NodeFact::ready(name)
    }
}

fn facts(nodes: &[&str]) -> ClusterFacts {
    ClusterFacts {
        nodes: nodes.iter().map(|n| linux_node(n)).collect(),
        has_scc: true,
        has_prometheus: true,
        ..Default::default()
    }
}

fn value(d: &DesiredObject) -> Value {
    d.to_value().unwrap()
}

fn container<'a>(ds: &'a Value, name: &str) -> &'a Value {
    ds["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap()
}

fn env<'a>(c: &'a Value, name: &str) -> &'a Value {
    c["env"].as_array().unwrap().iter().find(|e| e["name"] == name).unwrap()
}

/// Round-trips through the typed k8s-openapi struct: a misspelled field would be dropped.
fn assert_typed_round_trip<K: serde::de::DeserializeOwned + serde::Serialize>(v: &Value) {
    let typed: K = serde_json::from_value(v.clone()).unwrap();
    let back = serde_json::to_value(&typed).unwrap();
    assert_eq!(&back, v, "fields lost in a typed round trip");
}

#[test]
fn every_typed_object_round_trips_for_every_example() {
    use k8s_openapi::api::{apps::v1 as apps, batch::v1 as batch, core::v1 as core, rbac::v1 as r, storage::v1 as st};
    let mut facts = facts(&["node01", "node02"]);
    facts.mounters.push(MounterFact {
        name: "old".into(),
        pool_label: "gone-hpp".into(),
        node: "node01".into(),
        mount_path: "/x/csi".into(),
    });
    for name in EXAMPLES {
        let hpp = example(name);
        let objs: Vec<DesiredObject> = Pipeline::standard()
            .desired(&hpp, &cfg(), &facts)
            .unwrap()
            .into_iter()
            .flat_map(|(_, o)| o)
            .collect();
        assert!(objs.len() >= 8, "{name}: {}", objs.len());
        for d in &objs {
            let v = value(d);
            match d.kind.kind.as_str() {
                "DaemonSet" => assert_typed_round_trip::<apps::DaemonSet>(&v),
                "Deployment" => assert_typed_round_trip::<apps::Deployment>(&v),
                "Job" => assert_typed_round_trip::<batch::Job>(&v),
                "PersistentVolumeClaim" => assert_typed_round_trip::<core::PersistentVolumeClaim>(&v),
                "ServiceAccount" => assert_typed_round_trip::<core::ServiceAccount>(&v),
                "Service" => assert_typed_round_trip::<core::Service>(&v),
                "ClusterRole" => assert_typed_round_trip::<r::ClusterRole>(&v),
                "ClusterRoleBinding" => assert_typed_round_trip::<r::ClusterRoleBinding>(&v),
                "Role" => assert_typed_round_trip::<r::Role>(&v),
                "RoleBinding" => assert_typed_round_trip::<r::RoleBinding>(&v),
                "CSIDriver" => assert_typed_round_trip::<st::CSIDriver>(&v),
                "StorageClass" => assert_typed_round_trip::<st::StorageClass>(&v),
                "SecurityContextConstraints" | "PrometheusRule" | "ServiceMonitor" => {}
                other => panic!("unexpected kind {other}"),
            }
            let labels = &v["metadata"]["labels"];
            assert_eq!(labels["k8s-app"], "hostpath-provisioner", "{}", d.key());
            assert_eq!(labels["app.kubernetes.io/managed-by"], "hostpath-provisioner-operator");
        }
        let mut keys: Vec<_> = objs.iter().map(DesiredObject::key).collect();
        keys.sort();
        let before = keys.len();
        keys.dedup();
        assert_eq!(before, keys.len(), "{name}: duplicate objects");
    }
}

#[test]
fn csi_daemonset_matches_kubevirt() {
    let hpp = example("hostpathprovisioner_cr");
    let ds = value(&csi_daemonset::desired_csi_daemonset(&hpp, &cfg()).unwrap());
    assert_eq!(ds["metadata"]["name"], "hostpath-provisioner-csi");
    assert_eq!(ds["metadata"]["namespace"], "hostpath-provisioner");
    assert_eq!(ds["metadata"]["ownerReferences"][0]["uid"], "uid-1");
    assert_eq!(
        ds["metadata"]["labels"]["prometheus.hostpathprovisioner.kubevirt.io"],
        "true"
    );
    assert_eq!(
        ds["spec"]["selector"]["matchLabels"],
        serde_json::json!({"k8s-app": "hostpath-provisioner"})
    );
    assert_eq!(ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"], "10%");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "hostpath-provisioner-admin-csi");
    assert_eq!(pod["nodeSelector"]["kubernetes.io/os"], "linux");
    assert_eq!(
        ds["spec"]["template"]["metadata"]["annotations"]["openshift.io/required-scc"],
        "hostpath-provisioner-csi"
    );
    let names: Vec<&str> = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "hostpath-provisioner",
            "node-driver-registrar",
            "liveness-probe",
            "csi-provisioner",
            "csi-resizer"
        ]
    );
    let driver = container(&ds, "hostpath-provisioner");
    assert_eq!(
        env(driver, "PV_DIR")["value"],
        r#"[{"name":"local","path":"local-data-dir/csi","shared":false}]"#
    );
    assert_eq!(env(driver, "VERSION")["value"], "v1.0.0");
    assert_eq!(env(driver, "CSI_ENDPOINT")["value"], "unix:///csi/csi.sock");
    let args: Vec<&str> = driver["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(args.contains(&"--datadir=$(PV_DIR)") && args.contains(&"--metrics-tls-version=VersionTLS12"));
    assert!(args.contains(&"--drivername=kubevirt.io.hostpath-provisioner") && args.contains(&"--v=3"));
    // Node-local volumes are expanded by kubelet on their node; one leader-elected resizer.
    assert!(args.contains(&"--expansion=node"), "{args:?}");
    let resizer = container(&ds, "csi-resizer");
    assert!(
        resizer["args"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a == "--leader-election"),
        "{resizer}"
    );
    let mounts = driver["volumeMounts"].as_array().unwrap();
    assert!(mounts.iter().any(|m| m["name"] == "local-data-dir"
        && m["mountPath"] == "/local-data-dir"
        && m["mountPropagation"] == "HostToContainer"));
    assert!(
        mounts
            .iter()
            .any(|m| m["mountPath"] == "/var/lib/kubelet/pods" && m["mountPropagation"] == "Bidirectional")
    );
    let provisioner = container(&ds, "csi-provisioner");
    for flag in [
        "--feature-gates=Topology=true",
        "--enable-capacity=true",
        "--capacity-for-immediate-binding=true",
        "--extra-create-metadata=true",
        "--immediate-topology=false",
        "--strict-topology=true",
        "--node-deployment=true",
        "--default-fstype=xfs",
    ] {
        assert!(
            provisioner["args"].as_array().unwrap().iter().any(|a| a == flag),
            "{flag}"
        );
    }
    let volumes = pod["volumes"].as_array().unwrap();
    assert!(
        volumes
            .iter()
            .any(|v| v["name"] == "local-data-dir" && v["hostPath"]["path"] == "/var/hpvolumes")
    );
    assert_eq!(container(&ds, "liveness-probe")["args"][1], "--health-port=9898");
    // Liveness of the driver must not fail on Probe ready=false (a guarded pool waiting for its
    // mount), so it is the driver's own /livez over the metrics port.
    assert_eq!(
        container(&ds, "hostpath-provisioner")["livenessProbe"]["httpGet"],
        serde_json::json!({ "path": "/livez", "port": "metrics", "scheme": "HTTPS" })
    );
}

#[test]
fn snapshotting_and_overlay_pools_shape_the_datadir() {
    let hpp = example("hostpathprovisioner_overlay_csi_cr");
    let ds = value(&csi_daemonset::desired_csi_daemonset(&hpp, &cfg()).unwrap());
    let snap = container(&ds, "csi-snapshotter");
    assert_eq!(snap["args"][2], "--leader-election");
    assert_eq!(
        snap.get("resources"),
        None,
        "KubeVirt sets no requests on the snapshotter"
    );
    assert_eq!(
        env(container(&ds, "hostpath-provisioner"), "PV_DIR")["value"],
        r#"[{"name":"nfs-backend","path":"nfs-backend-data-dir/csi","snapshotPath":"nfs-backend-data-dir/csi/snapshots","snapshotProvider":"reflink","shared":true,"requireMountPoint":true}]"#,
        "a pvcTemplate pool is guarded: the driver waits for the mounter before creating volumes"
    );
    let local = example("hostpathprovisioner_cr");
    let ds = value(&csi_daemonset::desired_csi_daemonset(&local, &cfg()).unwrap());
    assert_eq!(
        env(container(&ds, "hostpath-provisioner"), "PV_DIR")["value"],
        r#"[{"name":"local","path":"local-data-dir/csi","shared":false}]"#
    );
    let legacy = example("hostpathprovisioner_legacy_cr");
    let ds = value(&csi_daemonset::desired_csi_daemonset(&legacy, &cfg()).unwrap());
    assert_eq!(
        env(container(&ds, "hostpath-provisioner"), "PV_DIR")["value"],
        r#"[{"name":"legacy","path":"csi-data-dir/csi","shared":false}]"#
    );
    assert!(
        ds["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["name"] != "csi-snapshotter")
    );
}

/// Names of the containers of a built CSI DaemonSet.
fn container_names(ds: &Value) -> Vec<String> {
    ds["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_owned())
        .collect()
}

/// Whether the CSI ClusterRole built for `hpp` grants anything on snapshot.storage.k8s.io.
fn snapshot_rbac(hpp: &HostPathProvisioner) -> bool {
    rbac::desired_rbac(hpp, &cfg())
        .unwrap()
        .iter()
        .map(value)
        .filter(|v| v["kind"] == "ClusterRole" && v["metadata"]["name"] == "hostpath-provisioner-admin-csi")
        .flat_map(|v| v["rules"].as_array().cloned().unwrap_or_default())
        .any(|r| r["apiGroups"][0] == "snapshot.storage.k8s.io")
}

/// csi-snapshotter exits at startup against a driver without CREATE_DELETE_SNAPSHOT, which the
/// driver advertises only when some pool has a snapshot path: with the gate but no
/// snapshotProvider the sidecar used to crash-loop and keep every CSI pod NotReady.
#[test]
fn snapshotter_only_with_the_gate_and_a_pool_with_a_snapshot_provider() {
    let gated = |name: &str| {
        let mut hpp = example(name);
        hpp.spec.feature_gates = Some(vec!["Snapshotting".into()]);
        hpp
    };
    for no_provider in [gated("hostpathprovisioner_cr"), gated("hostpathprovisioner_legacy_cr")] {
        let ds = value(&csi_daemonset::desired_csi_daemonset(&no_provider, &cfg()).unwrap());
        assert!(
            !container_names(&ds).iter().any(|c| c == "csi-snapshotter"),
            "{:?}",
            container_names(&ds)
        );
        assert!(!snapshot_rbac(&no_provider), "no snapshotter, no snapshot RBAC");
        assert!(!csi_daemonset::runs_snapshotter(&no_provider).unwrap());
        let why = csi_daemonset::snapshots_off_reason(&no_provider).unwrap();
        assert!(why.contains("snapshotProvider"), "{why}");
    }

    let mut with_provider = gated("hostpathprovisioner_cr");
    with_provider.spec.storage_pools.as_mut().unwrap()[0].snapshot_provider = Some("reflink".into());
    let ds = value(&csi_daemonset::desired_csi_daemonset(&with_provider, &cfg()).unwrap());
    assert!(container_names(&ds).iter().any(|c| c == "csi-snapshotter"));
    assert!(snapshot_rbac(&with_provider));
    assert_eq!(csi_daemonset::snapshots_off_reason(&with_provider), None);

    // A provider without the gate: no snapshotter, nothing to warn about.
    let mut ungated = example("hostpathprovisioner_cr");
    ungated.spec.storage_pools.as_mut().unwrap()[0].snapshot_provider = Some("reflink".into());
    let ds = value(&csi_daemonset::desired_csi_daemonset(&ungated, &cfg()).unwrap());
    assert!(!container_names(&ds).iter().any(|c| c == "csi-snapshotter"));
    assert!(!snapshot_rbac(&ungated));
    assert_eq!(csi_daemonset::snapshots_off_reason(&ungated), None);
}

/// The CSI step warns on the CR (a Warning Event) when the gate is on but snapshots are off.
#[test]
fn csi_step_warns_when_the_gate_is_on_without_a_snapshot_provider() {
    use hpp_reconcile::SubReconciler;
    let mut hpp = example("hostpathprovisioner_cr");
    hpp.metadata.name = Some("hostpath-provisioner".into());
    let step = hpp_reconcile::reconcilers::CsiDaemonSet;
    assert!(step.readiness(&hpp, &ClusterFacts::default(), &[]).warnings.is_empty());
    hpp.spec.feature_gates = Some(vec!["Snapshotting".into()]);
    let warnings = step.readiness(&hpp, &ClusterFacts::default(), &[]).warnings;
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].reason, csi_daemonset::REASON_SNAPSHOTS_DISABLED);
    assert_eq!(warnings[0].regarding.kind.as_deref(), Some("HostPathProvisioner"));
    assert_eq!(warnings[0].regarding.name.as_deref(), Some("hostpath-provisioner"));
}

#[test]
fn legacy_daemonset_only_with_path_config() {
    let legacy = example("hostpathprovisioner_legacy_cr");
    let ds = value(
        &legacy_daemonset::desired_legacy_daemonset(&legacy, &cfg())
            .unwrap()
            .unwrap(),
    );
    assert_eq!(ds["metadata"]["name"], "hostpath-provisioner");
    assert_eq!(
        ds["metadata"]["labels"]["np.kubevirt.io/allow-access-cluster-services"],
        "true"
    );
    let c = container(&ds, "hostpath-provisioner");
    assert_eq!(c["image"], "hostpath-provisioner");
    // The stock image's entrypoint is the CSI driver, so the provisioner is named explicitly.
    assert_eq!(c["command"], serde_json::json!(["/usr/bin/hpp-provisioner"]));
    assert_eq!(env(c, "PV_DIR")["value"], "/var/hpvolumes");
    assert_eq!(env(c, "USE_NAMING_PREFIX")["value"], "false");
    assert_eq!(
        ds["spec"]["template"]["spec"]["serviceAccountName"],
        "hostpath-provisioner-admin"
    );
    assert!(
        legacy_daemonset::desired_legacy_daemonset(&example("hostpathprovisioner_cr"), &cfg())
            .unwrap()
            .is_none()
    );
}

#[test]
fn rbac_and_service_accounts() {
    let names = |objs: Vec<DesiredObject>| {
        objs.iter()
            .map(|d| format!("{}:{}", d.kind.kind, d.key().name))
            .collect::<Vec<_>>()
    };
    let csi = example("hostpathprovisioner_cr");
    assert_eq!(
        names(rbac::desired_service_accounts(&csi, &cfg()).unwrap()),
        ["ServiceAccount:hostpath-provisioner-admin-csi"]
    );
    let legacy = example("hostpathprovisioner_legacy_cr");
    assert_eq!(names(rbac::desired_service_accounts(&legacy, &cfg()).unwrap()).len(), 2);
    let objs = rbac::desired_rbac(&legacy, &cfg()).unwrap();
    assert_eq!(
        names(objs.clone()),
        [
            "ClusterRole:hostpath-provisioner-admin-csi",
            "ClusterRoleBinding:hostpath-provisioner-admin-csi",
            "Role:hostpath-provisioner-admin-csi",
            "RoleBinding:hostpath-provisioner-admin-csi",
            "ClusterRole:hostpath-provisioner",
            "ClusterRoleBinding:hostpath-provisioner",
        ]
    );
    let crb = value(&objs[5]);
    assert_eq!(crb["subjects"][0]["name"], "hostpath-provisioner-admin");
    assert_eq!(crb["subjects"][0]["namespace"], "hostpath-provisioner");
    assert_eq!(rbac::csi_cluster_rules(false).len(), 10);
    let leases = rbac::csi_role_rules()
        .into_iter()
        .find(|r| r.resources.as_ref().unwrap()[0] == "leases")
        .unwrap();
    for verb in ["get", "list", "watch", "create", "update", "patch"] {
        assert!(leases.verbs.iter().any(|v| v == verb), "leases {verb}");
    }
    let with_snap = rbac::csi_cluster_rules(true);
    assert!(
        with_snap
            .iter()
            .any(|r| r.resources.as_ref().unwrap()[0] == "volumesnapshotcontents/status")
    );
}

#[test]
fn csi_driver_fields() {
    let d = value(&csi_driver::desired_csi_driver(&example("hostpathprovisioner_cr"), &cfg()).unwrap());
    assert_eq!(d["metadata"]["name"], "kubevirt.io.hostpath-provisioner");
    assert_eq!(d["spec"]["fsGroupPolicy"], "File");
    assert_eq!(
        d["spec"]["volumeLifecycleModes"],
        serde_json::json!(["Persistent", "Ephemeral"])
    );
    assert_eq!(
        (d["spec"]["attachRequired"].clone(), d["spec"]["podInfoOnMount"].clone()),
        (false.into(), true.into())
    );
    assert_eq!(d["spec"]["storageCapacity"], true);
}

#[test]
fn scc_and_prometheus_only_when_discovered() {
    let legacy = example("hostpathprovisioner_legacy_cr");
    let none = ClusterFacts::default();
    assert!(scc::desired_sccs(&legacy, &cfg(), &none).unwrap().is_empty());
    assert!(
        prometheus::desired_monitoring(&legacy, &cfg(), &none)
            .unwrap()
            .is_empty()
    );
    let all = facts(&[]);
    let sccs: Vec<Value> = scc::desired_sccs(&legacy, &cfg(), &all)
        .unwrap()
        .iter()
        .map(value)
        .collect();
    assert_eq!(sccs.len(), 2);
    assert_eq!(sccs[0]["allowPrivilegedContainer"], true);
    assert_eq!(
        sccs[1]["volumes"],
        serde_json::json!(["hostPath", "secret", "projected"])
    );
    assert_eq!(
        sccs[0]["users"][0],
        "system:serviceaccount:hostpath-provisioner:hostpath-provisioner-admin-csi"
    );
    let mon: Vec<Value> = prometheus::desired_monitoring(&legacy, &cfg(), &all)
        .unwrap()
        .iter()
        .map(value)
        .collect();
    let kinds: Vec<&str> = mon.iter().map(|m| m["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["PrometheusRule", "Role", "RoleBinding", "Service", "ServiceMonitor"]
    );
    let alerts: Vec<&str> = mon[0]["spec"]["groups"][1]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["alert"].as_str().unwrap())
        .collect();
    assert_eq!(alerts, ["HPPOperatorDown", "HPPNotReady", "HPPSharingPoolPathWithOS"]);
    assert_eq!(
        mon[0]["spec"]["groups"][1]["rules"][1]["annotations"]["runbook_url"],
        "https://kubevirt.io/monitoring/runbooks/HPPNotReady"
    );
    assert_eq!(mon[2]["subjects"][0]["namespace"], "monitoring");
    // Older ServiceMonitor CRDs do not declare tlsConfig.minVersion: server-side apply of an
    // undeclared field fails the whole pass, so the operator sends only what every CRD knows.
    assert_eq!(
        mon[4]["spec"]["endpoints"][0]["tlsConfig"],
        serde_json::json!({ "insecureSkipVerify": true })
    );
}

/// The pool objects, after checking that the parts a pass renders them in are exactly them.
fn pool_objs(hpp: &HostPathProvisioner, facts: &ClusterFacts) -> Vec<(String, String, ApplyStrategy)> {
    let desired = storage_pools::desired_pool_objects(hpp, &cfg(), facts).unwrap();
    assert_parts_are_the_whole(hpp, facts, &desired);
    desired
        .into_iter()
        .map(|d| (d.kind.kind.clone(), d.key().name, d.strategy))
        .collect()
}

/// Rendered part by part (as a pass does), the pool objects are the same objects, each once.
fn assert_parts_are_the_whole(hpp: &HostPathProvisioner, facts: &ClusterFacts, desired: &[DesiredObject]) {
    let by_key = |objects: &[DesiredObject]| -> Vec<(String, Value, ApplyStrategy)> {
        let mut all: Vec<_> = objects
            .iter()
            .map(|d| (d.key().to_string(), d.stamped().unwrap(), d.strategy))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    };
    let parts = storage_pools::pool_parts(hpp, facts);
    assert_eq!(parts[0], storage_pools::CLUSTER_PART);
    let mut rendered = Vec::new();
    for part in &parts {
        rendered.extend(storage_pools::desired_pool_part(hpp, &cfg(), facts, part).unwrap());
    }
    let (whole, in_parts) = (by_key(desired), by_key(&rendered));
    assert_eq!(in_parts.len(), whole.len(), "no object twice");
    assert_eq!(in_parts, whole);
}

#[test]
fn rwo_pool_gets_a_claim_and_mounter_per_node() {
    let hpp = example("hostpathprovisioner_pvctemplate_cr");
    let objs = pool_objs(&hpp, &facts(&["n2", "n1"]));
    let names: Vec<String> = objs.iter().map(|(k, n, _)| format!("{k}:{n}")).collect();
    assert_eq!(
        names,
        [
            "PersistentVolumeClaim:hpp-pool-local-n1",
            "PersistentVolumeClaim:hpp-pool-local-n2",
            "Deployment:hpp-pool-local-n1",
            "Deployment:hpp-pool-local-n2",
        ]
    );
    assert!(objs[0].2 == ApplyStrategy::CreateOnly && objs[2].2 == ApplyStrategy::ServerSideApply);
    let pool = &hpp.spec.storage_pools.as_ref().unwrap()[0];
    let dep = value(&pool_objects::mounter_deployment(&hpp, pool, "n1", "hpp-pool-local-n1", &cfg()).unwrap());
    let c = &dep["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        c["args"],
        serde_json::json!([
            "--storagePoolPath",
            "/dev/data",
            "--mountPath",
            "/var/hpvolumes/csi",
            "--hostPath",
            "/host"
        ])
    );
    assert_eq!(c["volumeDevices"][0]["devicePath"], "/dev/data");
    assert_eq!(c["securityContext"]["runAsUser"], 0);
    assert_eq!(dep["spec"]["selector"]["matchLabels"]["hpp-pool"], "local-hpp");
    assert_eq!(
        dep["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchExpressions"][0]["values"][0],
        "n1"
    );
    let claim = value(&pool_objects::pool_claim(pool, "hpp-pool-local-n1", &cfg()).unwrap());
    assert_eq!(claim["spec"]["volumeMode"], "Block");
    assert_eq!(
        claim["metadata"]["labels"]["kubevirt.io.hostpath-provisioner/storagePool"],
        "local-hpp"
    );
    assert!(
        claim["metadata"].get("ownerReferences").is_none(),
        "pool data outlives the CR object graph"
    );
    // Nodes outside the workload nodeSelector get nothing.
    let mut f = facts(&["n1"]);
    f.nodes.push(NodeFact::ready("windows"));
    assert_eq!(pool_objs(&hpp, &f).len(), 2);
}

#[test]
fn rwx_pool_shares_one_claim_and_an_overlay_class() {
    let hpp = example("hostpathprovisioner_overlay_csi_cr");
    let names: Vec<String> = pool_objs(&hpp, &facts(&["n1", "n2"]))
        .iter()
        .map(|(k, n, _)| format!("{k}:{n}"))
        .collect();
    assert_eq!(
        names,
        [
            "StorageClass:hpp-overlay",
            "PersistentVolumeClaim:hpp-pool-nfs-backend-shared",
            "Deployment:hpp-pool-nfs-backend-n1",
            "Deployment:hpp-pool-nfs-backend-n2",
        ]
    );
    let pool = &hpp.spec.storage_pools.as_ref().unwrap()[0];
    let sc = value(&pool_objects::overlay_storage_class(pool, &cfg()).unwrap());
    assert_eq!(sc["volumeBindingMode"], "Immediate");
    assert_eq!(
        sc["parameters"],
        serde_json::json!({"storagePool": "nfs-backend", "overlayCSI": "true"})
    );
    assert!(
        sc.get("allowVolumeExpansion").is_none(),
        "no quota: sizes mean nothing, no expansion"
    );
    for (mode, expands) in [
        (hpp_api::quota::QuotaMode::None, false),
        (hpp_api::quota::QuotaMode::Image, true),
        (hpp_api::quota::QuotaMode::Auto, true),
    ] {
        let mut sized = pool.clone();
        sized.quota = Some(mode);
        let sc = value(&pool_objects::overlay_storage_class(&sized, &cfg()).unwrap());
        assert_eq!(sc.get("allowVolumeExpansion").is_some(), expands, "{mode}");
    }
    let dep =
        value(&pool_objects::mounter_deployment(&hpp, pool, "n1", "hpp-pool-nfs-backend-shared", &cfg()).unwrap());
    assert_eq!(
        dep["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
        "hpp-pool-nfs-backend-shared"
    );
    assert_eq!(dep["spec"]["template"]["spec"]["containers"][0]["args"][1], "/source");
    // No node in use yet: the class exists, the shared claim does not.
    assert_eq!(pool_objs(&hpp, &facts(&[])).len(), 1);
}

#[test]
fn node_removal_keeps_claims_and_unmounts_only_on_ready_nodes() {
    let hpp = example("hostpathprovisioner_pvctemplate_cr");
    let mounter = |node: &str| MounterFact {
        name: format!("hpp-pool-local-{node}"),
        pool_label: "local-hpp".into(),
        node: node.into(),
        mount_path: "/var/hpvolumes/csi".into(),
    };
    let mut f = facts(&["n1"]);
    f.nodes.push(NodeFact {
        labels: BTreeMap::new(),
        ..NodeFact::ready("n2")
    }); // n2 no longer selected
    f.nodes.push(NodeFact {
        ready: false,
        ..linux_node("n3")
    }); // n3 NotReady but still selected
    f.nodes.push(NodeFact {
        ready: false,
        labels: BTreeMap::new(),
        ..NodeFact::ready("n4")
    }); // gone from selection and NotReady
    f.mounters = vec![mounter("n1"), mounter("n2"), mounter("n4"), mounter("n5")].into(); // n5 deleted from the cluster
    f.claims = ["n1", "n2", "n4", "n5"]
        .iter()
        .map(|n| ClaimFact {
            name: format!("hpp-pool-local-{n}"),
            pool_label: "local-hpp".into(),
        })
        .collect();
    let names: Vec<String> = pool_objs(&hpp, &f).iter().map(|(k, n, _)| format!("{k}:{n}")).collect();
    for expected in [
        "PersistentVolumeClaim:hpp-pool-local-n2",
        "PersistentVolumeClaim:hpp-pool-local-n5",
        "Job:cleanup-pool-local-n2",
        "Deployment:hpp-pool-local-n3",
    ] {
        assert!(
            names.contains(&expected.to_owned()),
            "{expected} missing from {names:?}"
        );
    }
    for absent in [
        "Deployment:hpp-pool-local-n2",
        "Job:cleanup-pool-local-n4",
        "Job:cleanup-pool-local-n5",
        "Job:cleanup-pool-local-n1",
    ] {
        assert!(!names.contains(&absent.to_owned()), "{absent} should not be desired");
    }
    // Once the Job succeeded it is no longer desired (the sweep deletes it).
    f.cleanup_jobs.push(CleanupJobFact {
        name: "cleanup-pool-local-n2".into(),
        node: "n2".into(),
        pool_label: "local-hpp".into(),
        mount_path: "/var/hpvolumes/csi".into(),
        succeeded: true,
    });
    let names: Vec<String> = pool_objs(&hpp, &f).iter().map(|(_, n, _)| n.clone()).collect();
    assert!(!names.contains(&"cleanup-pool-local-n2".to_owned()));
    let job = value(
        &pool_objects::cleanup_job(
            &hpp,
            "cleanup-pool-local-n2",
            "local-hpp",
            "n2",
            "/var/hpvolumes/csi",
            &cfg(),
        )
        .unwrap(),
    );
    assert_eq!(job["spec"]["template"]["spec"]["restartPolicy"], "OnFailure");
    assert_eq!(job["spec"]["template"]["spec"]["containers"][0]["args"][0], "--unmount");
}

#[test]
fn pipeline_can_be_edited_in_a_few_lines() {
    use hpp_reconcile::names::{STEP_PROMETHEUS, STEP_RBAC, STEP_SCC, STEP_SERVICE_ACCOUNTS};
    let mut p = Pipeline::standard();
    // The names are the field managers of live clusters: they never change.
    assert_eq!(
        p.names(),
        [
            "service-accounts",
            "rbac",
            "csi-driver",
            "scc",
            "csi-daemonset",
            "legacy-daemonset",
            "storage-pools",
            "prometheus",
            "storage-class-pools",
            "pool-mounts",
            "node-loss",
            "volume-audit"
        ]
    );
    p.remove(STEP_PROMETHEUS).unwrap();
    assert!(p.remove(STEP_PROMETHEUS).is_err());
    p.replace(STEP_SCC, Box::new(hpp_reconcile::reconcilers::Scc)).unwrap();
    p.insert_before(STEP_RBAC, Box::new(hpp_reconcile::reconcilers::Prometheus))
        .unwrap();
    assert_eq!(p.names()[..3], [STEP_SERVICE_ACCOUNTS, STEP_PROMETHEUS, STEP_RBAC]);
    assert_eq!(p.names()[3..5], ["csi-driver", STEP_SCC]);
}

#[test]
fn render_prints_every_object_as_yaml() {
    let hpp = example("hostpathprovisioner_legacy_cr");
    let yaml = hpp_reconcile::render::render_yaml(
        &Pipeline::standard(),
        &hpp,
        &cfg(),
        &ClusterFacts::offline(&[], false, false),
    )
    .unwrap();
    let docs = yaml.matches("---\n").count();
    assert_eq!(docs, 11, "{yaml}");
    assert!(yaml.contains("name: hostpath-provisioner-csi"));
    assert!(yaml.contains("kind: CSIDriver"));
}

#[test]
fn long_pool_and_node_names_are_hashed() {
    let mut hpp = example("hostpathprovisioner_pvctemplate_cr");
    let node = "a-really-long-node-name-that-goes-on.example.internal";
    let objs = pool_objs(&hpp, &facts(&[node]));
    assert!(objs.iter().all(|(_, n, _)| n.len() <= 63), "{objs:?}");
    hpp.spec.storage_pools.as_mut().unwrap()[0].name = "p".repeat(50);
    assert_eq!(
        csi_daemonset::mount_name(&"p".repeat(50)),
        format!("{}-data-dir", "p".repeat(50))
    );
}

#[test]
fn pool_nodes_follow_the_required_node_affinity_of_the_workload() {
    let mut hpp = example("hostpathprovisioner_pvctemplate_cr");
    let workload: hpp_api::v1beta1::NodePlacement = serde_json::from_value(serde_json::json!({
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}]
        }}}
    }))
    .unwrap();
    hpp.spec.workload = Some(workload);
    let mut f = facts(&["plain"]);
    let mut ssd = linux_node("fast");
    ssd.labels.insert("disk".into(), "ssd".into());
    f.nodes.push(ssd);
    let names: Vec<String> = pool_objs(&hpp, &f).iter().map(|(k, n, _)| format!("{k}:{n}")).collect();
    assert!(
        names.contains(&"Deployment:hpp-pool-local-fast".to_string()),
        "{names:?}"
    );
    assert!(
        !names.iter().any(|n| n.ends_with("-plain")),
        "the CSI DaemonSet does not run on a node outside the affinity, so no pool objects there: {names:?}"
    );
}

/// Issues 11 and 13: the per-pool ephemeral switch and cap and the quota settings reach the
/// driver's `--datadir` under the keys it reads (`ephemeral`, `ephemeralMaxBytes`, `quota`,
/// `overcommitPercent`); pools without them render exactly as before.
#[test]
fn pool_ephemeral_and_quota_settings_render_into_the_datadir() {
    let mut hpp = example("hostpathprovisioner_cr");
    let mut second = hpp.spec.storage_pools.as_ref().unwrap()[0].clone();
    let first = &mut hpp.spec.storage_pools.as_mut().unwrap()[0];
    first.ephemeral = Some(hpp_api::v1beta1::EphemeralVolumes {
        allowed: Some(false),
        max_size: None,
    });
    first.quota = Some(hpp_api::quota::QuotaMode::Btrfs);
    first.overcommit_percent = Some(150);
    second.name = "fast".into();
    second.path = "/mnt/fast".into();
    second.ephemeral = Some(hpp_api::v1beta1::EphemeralVolumes {
        allowed: None,
        max_size: Some("1Gi".into()),
    });
    hpp.spec.storage_pools.as_mut().unwrap().push(second);
    let ds = value(&csi_daemonset::desired_csi_daemonset(&hpp, &cfg()).unwrap());
    assert_eq!(
        env(container(&ds, "hostpath-provisioner"), "PV_DIR")["value"],
        concat!(
            r#"[{"name":"local","path":"local-data-dir/csi","shared":false,"ephemeral":false,"quota":"btrfs","overcommitPercent":150},"#,
            r#"{"name":"fast","path":"fast-data-dir/csi","shared":false,"ephemeralMaxBytes":1073741824}]"#
        )
    );
    // A cap that is not a quantity (only possible with the webhook off) is refused, not dropped.
    hpp.spec.storage_pools.as_mut().unwrap()[1].ephemeral = Some(hpp_api::v1beta1::EphemeralVolumes {
        allowed: None,
        max_size: Some("lots".into()),
    });
    let err = csi_daemonset::desired_csi_daemonset(&hpp, &cfg()).unwrap_err();
    assert!(err.to_string().contains("fast"), "{err}");
}

/// Issue 28: a pool's `trash` reaches the driver's `--datadir` as `trashRetention` (as the CR
/// wrote it, trimmed) and `trashMinFreePercent` (only when given); a pool without it renders
/// exactly as before, and a retention the webhook would refuse is an error, not a silent off.
#[test]
fn pool_trash_settings_render_into_the_datadir() {
    use hpp_api::v1beta1::PoolTrash;
    let mut hpp = example("hostpathprovisioner_cr");
    let mut second = hpp.spec.storage_pools.as_ref().unwrap()[0].clone();
    let mut third = second.clone();
    hpp.spec.storage_pools.as_mut().unwrap()[0].trash = Some(PoolTrash {
        retention: Some(" 72h ".into()),
        min_free_percent: Some(15),
    });
    second.name = "fast".into();
    second.path = "/mnt/fast".into();
    second.trash = Some(PoolTrash {
        retention: Some("0".into()),
        min_free_percent: None,
    });
    third.name = "plain".into();
    third.path = "/mnt/plain".into();
    hpp.spec.storage_pools.as_mut().unwrap().extend([second, third]);
    let ds = value(&csi_daemonset::desired_csi_daemonset(&hpp, &cfg()).unwrap());
    assert_eq!(
        env(container(&ds, "hostpath-provisioner"), "PV_DIR")["value"],
        concat!(
            r#"[{"name":"local","path":"local-data-dir/csi","shared":false,"trashRetention":"72h","trashMinFreePercent":15},"#,
            r#"{"name":"fast","path":"fast-data-dir/csi","shared":false,"trashRetention":"0"},"#,
            r#"{"name":"plain","path":"plain-data-dir/csi","shared":false}]"#
        )
    );
    hpp.spec.storage_pools.as_mut().unwrap()[1].trash = Some(PoolTrash {
        retention: Some("three days".into()),
        min_free_percent: None,
    });
    let err = csi_daemonset::desired_csi_daemonset(&hpp, &cfg()).unwrap_err();
    assert!(err.to_string().contains("fast: trash.retention"), "{err}");
    hpp.spec.storage_pools.as_mut().unwrap()[1].trash = Some(PoolTrash {
        retention: Some("1h".into()),
        min_free_percent: Some(100),
    });
    let err = csi_daemonset::desired_csi_daemonset(&hpp, &cfg()).unwrap_err();
    assert!(err.to_string().contains("minFreePercent 100"), "{err}");
}
