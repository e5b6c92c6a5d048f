//! Drop-in: `hpp-provisioner` started with each replaced provisioner's own arguments and
//! environment (only the image changed) resolves to the same provisioner.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::process::Command;

/// Runs hpp-provisioner with exactly `args` and `env` (plus --print-config) and returns stdout.
fn start(args: &[&str], env: &[(&str, &str)]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_hpp-provisioner"))
        .env_clear()
        .envs(env.iter().copied())
        .args(args)
        .arg("--print-config")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "args {args:?}: {stderr}{stdout}");
    stdout
}

#[test]
fn torchbox_deployment_args() {
    // torchbox/k8s-hostpath-provisioner's Deployment: Go flags, no mode.
    let out = start(
        &[
            "-name=torchbox.com/hostpath",
            "-kubeconfig=/etc/kube/config",
            "-master",
            "https://10.0.0.1:6443",
        ],
        &[],
    );
    assert!(out.contains("mode=shared"), "{out}");
    assert!(out.contains("name=torchbox.com/hostpath"), "{out}");
    assert!(out.contains("identity=torchbox.com/hostpath"), "{out}");
    assert!(out.contains("kubeconfig=/etc/kube/config"), "{out}");
    assert!(out.contains("master=https://10.0.0.1:6443"), "{out}");
    let out = start(&["-name", "torchbox.com/hostpath", "-id=old-id"], &[]);
    assert!(out.contains("mode=shared") && out.contains("identity=old-id"), "{out}");
}

#[test]
fn kubevirt_legacy_daemonset_env_and_klog_flags() {
    // quay.io/kubevirt/hostpath-provisioner: no own flags (klog's only), environment.
    let out = start(
        &["-v=3", "-logtostderr"],
        &[
            ("NODE_NAME", "node-1"),
            ("PV_DIR", "/var/hpvolumes"),
            ("USE_NAMING_PREFIX", "true"),
        ],
    );
    assert!(out.contains("mode=kubevirt"), "{out}");
    assert!(out.contains("name=kubevirt.io/hostpath-provisioner"), "{out}");
    assert!(
        out.contains("node=node-1") && out.contains("pv_dir=/var/hpvolumes"),
        "{out}"
    );
    assert!(out.contains("naming_prefix=true"), "{out}");
}

#[test]
fn single_node_incubator_deployment_env() {
    // The incubator demo / MaZderMind: NODE_NAME, PV_DIR, PV_RECLAIM_POLICY and the name `hostpath`.
    let out = start(
        &["-logtostderr", "-v", "2"],
        &[
            ("NODE_NAME", "box"),
            ("PV_DIR", "/srv/hostpath"),
            ("PV_RECLAIM_POLICY", "Retain"),
            ("PROVISIONER_NAME", "hostpath"),
        ],
    );
    assert!(out.contains("mode=single-node"), "{out}");
    assert!(out.contains("name=hostpath") && out.contains("identity=box"), "{out}");
}

/// KubeVirt's operator renders its legacy DaemonSet with `PROVISIONER_IMAGE`, no `command`, no
/// `args` and this environment (daemonset.go of kubevirt/hostpath-provisioner-operator); in
/// hpp's images that image is hpp-csi-driver's, whose entrypoint is the driver. Started that
/// way, the driver hands over to the legacy provisioner next to it (which here, without a
/// cluster, stops at its in-cluster configuration) instead of serving CSI.
#[test]
fn csi_driver_started_as_kubevirts_legacy_daemonset_runs_the_legacy_provisioner() {
    let pv_dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hpp-csi-driver"))
        .env_clear()
        .env("USE_NAMING_PREFIX", "false")
        .env("NODE_NAME", "node-1")
        .env("PV_DIR", pv_dir.path())
        .env("INSTALLER_PART_OF_LABEL", "")
        .env("INSTALLER_VERSION_LABEL", "")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "no cluster here: {stderr}");
    let provisioner = std::path::Path::new(env!("CARGO_BIN_EXE_hpp-csi-driver")).with_file_name("hpp-provisioner");
    assert!(
        stderr.contains(&format!("running {}", provisioner.display())),
        "{stderr}"
    );
    assert!(stderr.contains("in-cluster Kubernetes configuration"), "{stderr}");
    assert!(!stderr.contains("serving CSI"), "{stderr}");
}
