//! Least privilege of the pods the operator renders: the CSI sidecars are not privileged;
//! mounter and cleanup pods mount the pool's parent directory, not the host's `/`. (The RBAC
//! that hpp ships or renders is checked in xtask/tests/deploy_least_privilege.rs, which sees
//! deploy/.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use hpp_api::HostPathProvisioner;
use hpp_reconcile::OperatorConfig;
use hpp_reconcile::reconcilers::{csi_daemonset, pool_objects};
use serde_json::Value;

fn example(name: &str) -> HostPathProvisioner {
    // deploy/examples/ as copied into the crate (xtask/tests/deploy_example_copies.rs keeps them equal).
    let path = format!("{}/tests/fixtures/examples/{name}.yaml", env!("CARGO_MANIFEST_DIR"));
    serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn cfg() -> OperatorConfig {
    OperatorConfig::from_env([("OPERATOR_VERSION", "v1.0.0")])
}

fn pod_spec(ds: &Value) -> &Value {
    &ds["spec"]["template"]["spec"]
}

#[test]
fn only_the_driver_and_registrar_are_privileged() {
    let mut hpp = example("hostpathprovisioner_cr");
    hpp.spec.feature_gates = Some(vec!["Snapshotting".into()]);
    hpp.spec.storage_pools.as_mut().unwrap()[0].snapshot_provider = Some("reflink".into());
    let ds = csi_daemonset::desired_csi_daemonset(&hpp, &cfg())
        .unwrap()
        .to_value()
        .unwrap();
    let containers = pod_spec(&ds)["containers"].as_array().unwrap();
    assert_eq!(
        containers.len(),
        6,
        "driver, registrar, liveness, provisioner, resizer, snapshotter"
    );
    for c in containers {
        let privileged = c["securityContext"]["privileged"] == true;
        let name = c["name"].as_str().unwrap();
        match name {
            "hostpath-provisioner" | "node-driver-registrar" => assert!(privileged, "{name}"),
            _ => {
                assert!(!privileged, "{name} is privileged");
                assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false, "{name}");
                assert_eq!(c["securityContext"]["capabilities"]["drop"][0], "ALL", "{name}");
                assert_eq!(
                    c["securityContext"]["seLinuxOptions"]["type"],
                    csi_daemonset::SIDECAR_SELINUX_TYPE,
                    "{name}"
                );
            }
        }
    }
}

fn host_paths(pod: &Value) -> Vec<String> {
    pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["hostPath"]["path"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn mounter_and_cleanup_pods_mount_the_pool_parent_not_the_host_root() {
    let hpp = example("hostpathprovisioner_pvctemplate_cr");
    let pool = &hpp.spec.storage_pools.as_ref().unwrap()[0];
    let dep = pool_objects::mounter_deployment(&hpp, pool, "n1", "claim", &cfg())
        .unwrap()
        .to_value()
        .unwrap();
    let pod = pod_spec(&dep);
    assert_eq!(host_paths(pod), [pool.path.trim_end_matches('/')]);
    let mount = pod["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPropagation"] == "Bidirectional")
        .unwrap();
    // `--hostPath /host` + `--mountPath <path>/csi` still lands on the host's `<path>/csi`.
    assert_eq!(mount["mountPath"], format!("/host{}", pool.path.trim_end_matches('/')));

    let job = pool_objects::cleanup_job(&hpp, "cleanup", "x-hpp", "n1", "/var/hpvolumes/csi", &cfg())
        .unwrap()
        .to_value()
        .unwrap();
    assert_eq!(host_paths(pod_spec(&job)), ["/var/hpvolumes"]);
    assert_eq!(pool_objects::host_parent("/var/hpvolumes/csi/"), "/var/hpvolumes");
    assert_eq!(pool_objects::host_parent("/csi"), "/");
}
