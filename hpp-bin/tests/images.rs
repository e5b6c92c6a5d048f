//! Tests of the built stock images (images/build.sh builds them; images/test.sh and `.ci/run`
//! run this with the image names set):
//! - each image's binaries answer `--version`;
//! - every command deploy/ and the operator's rendered pods run exists in the image it runs from,
//!   the image entrypoint serves containers without a `command`, and the mounter's tools run;
//! - the CSI driver image serves a bind-mounted pool over a socket, answering Probe, CreateVolume
//!   and NodePublishVolume from the host side through this build's `hpp-csi-driver call`;
//! - the operator image renders the example CRs exactly as the host build does;
//! - KubeVirt's operator Deployment, CSI and legacy DaemonSet containers and mounter commands,
//!   with only the image changed, run against the hpp images as the kubelet would run them
//!   (fixtures in tests/fixtures/kubevirt/).
//!
//! Skipped, with a message, unless `HPP_TEST_OPERATOR_IMAGE` and `HPP_TEST_CSI_DRIVER_IMAGE`
//! name the images and podman is installed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use clap::Parser as _;
use serde_json::Value;

const OPERATOR_VAR: &str = "HPP_TEST_OPERATOR_IMAGE";
const CSI_VAR: &str = "HPP_TEST_CSI_DRIVER_IMAGE";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The two images under test, or `None` (with the reason printed) when the tests cannot run.
struct Images {
    operator: String,
    csi: String,
}

fn images(test: &str) -> Option<Images> {
    let (Ok(operator), Ok(csi)) = (std::env::var(OPERATOR_VAR), std::env::var(CSI_VAR)) else {
        eprintln!("SKIPPED {test}: set {OPERATOR_VAR} and {CSI_VAR} to test built images (images/test.sh does)");
        return None;
    };
    if Command::new("podman").arg("--version").output().is_err() {
        eprintln!("SKIPPED {test}: podman is not installed (apt-get install podman runc)");
        return None;
    }
    Some(Images { operator, csi })
}

/// podman with the runtime flags that work on hybrid-cgroup hosts (see images/build.sh).
fn podman() -> Command {
    let mut cmd = Command::new("podman");
    cmd.args(["--runtime", "runc", "--cgroup-manager", "cgroupfs"]);
    cmd
}

/// `podman run --rm` flags: no network, explicit limits runc may set.
fn run_flags() -> Vec<String> {
    let nofile = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .maximum
        .unwrap_or(1 << 20)
        .min(1 << 20);
    vec![
        "run".into(),
        "--rm".into(),
        "--network".into(),
        "none".into(),
        "--ulimit".into(),
        format!("nofile={nofile}:{nofile}"),
        "--ulimit".into(),
        "nproc=4096:4096".into(),
    ]
}

fn output(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs `command args` in `image` (as its entrypoint) and returns stdout.
fn run_in(image: &str, command: &str, args: &[&str]) -> String {
    let out = output(
        podman()
            .args(run_flags())
            .args(["--entrypoint", command, image])
            .args(args),
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn entrypoint(image: &str) -> Vec<String> {
    let out = output(podman().args(["image", "inspect", "--format", "{{json .Config.Entrypoint}}", image]));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn each_image_answers_version_and_carries_its_labels() {
    let Some(images) = images("each_image_answers_version_and_carries_its_labels") else {
        return;
    };
    for (image, bins) in [
        (&images.operator, ["/usr/bin/hpp-operator", "/usr/bin/hpp-mounter"]),
        (&images.csi, ["/usr/bin/hpp-csi-driver", "/usr/bin/hpp-provisioner"]),
    ] {
        // The entrypoint itself, as `podman run IMAGE --version` runs it.
        let out = output(podman().args(run_flags()).args([image.as_str(), "--version"]));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(env!("CARGO_PKG_VERSION")), "{image}: {text}");
        for bin in bins {
            let text = run_in(image, bin, &["--version"]);
            assert!(text.contains(env!("CARGO_PKG_VERSION")), "{image} {bin}: {text}");
        }
        let out = output(podman().args(["image", "inspect", "--format", "{{json .Config.Labels}}", image]));
        let labels: Value = serde_json::from_slice(&out.stdout).unwrap();
        for label in ["source", "revision", "version", "licenses"] {
            let value = labels[format!("org.opencontainers.image.{label}")]
                .as_str()
                .unwrap_or_default();
            assert!(!value.is_empty(), "{image}: no org.opencontainers.image.{label} label");
        }
        assert_eq!(labels["org.opencontainers.image.version"], env!("CARGO_PKG_VERSION"));
        assert_eq!(labels["org.opencontainers.image.licenses"], env!("CARGO_PKG_LICENSE"));
    }
}

/// The driver image carries what the `image` quota backend runs (hpp-fs checks the same list at
/// start-up): each tool starts and prints its version with only the libraries copied in.
#[test]
fn csi_driver_image_carries_the_image_backend_tools() {
    let Some(images) = images("csi_driver_image_carries_the_image_backend_tools") else {
        return;
    };
    // resize2fs has no version flag: run bare, it prints its usage (and version) and exits 1.
    for (tool, args) in [
        ("/usr/sbin/mkfs.ext4", &["-V"][..]),
        ("/usr/sbin/e2fsck", &["-V"][..]),
        ("/usr/sbin/resize2fs", &[][..]),
        ("/usr/sbin/mkfs.xfs", &["-V"][..]),
        ("/usr/sbin/xfs_growfs", &["-V"][..]),
    ] {
        let out = podman()
            .args(run_flags())
            .args(["--entrypoint", tool, images.csi.as_str()])
            .args(args)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            matches!(out.status.code(), Some(0 | 1)) && !text.contains("error while loading shared libraries"),
            "{tool} does not run in {}: {:?} {text}",
            images.csi,
            out.status
        );
    }
}

/// Which stock image a container image reference names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Stock {
    Operator,
    Csi,
}

/// The operator Deployment's environment: the image variables the operator renders pods with.
fn operator_env() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo().join("deploy/operator/deployment.yaml")).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_str_multiple(&text).unwrap();
    let dep = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    dep["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| Some((e["name"].as_str()?.to_owned(), e["value"].as_str()?.to_owned())))
        .collect()
}

/// Containers (and init containers) of every pod template in `objects`.
fn containers(objects: &[Value]) -> Vec<Value> {
    objects
        .iter()
        .flat_map(|o| {
            [
                "/spec/template/spec/containers",
                "/spec/template/spec/initContainers",
                "/spec/jobTemplate/spec/template/spec/containers",
            ]
            .into_iter()
            .filter_map(|p| o.pointer(p).and_then(Value::as_array))
            .flatten()
            .cloned()
            .collect::<Vec<_>>()
        })
        .collect()
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml") {
            out.push(path);
        }
    }
}

/// Every command (or the entrypoint, `None`) each stock image is asked to run, by deploy/ and by
/// the operator for every example CR (with nodes, OpenShift and prometheus objects).
fn commands() -> BTreeSet<(Stock, Option<String>)> {
    let env = operator_env();
    let var = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()).unwrap();
    let (operator_image, csi_image, legacy_image) = (
        var("OPERATOR_IMAGE"),
        var("CSI_PROVISIONER_IMAGE"),
        var("PROVISIONER_IMAGE"),
    );
    let mut objects = Vec::new();
    let mut files = Vec::new();
    yaml_files(&repo().join("deploy"), &mut files);
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let docs: Vec<Value> = serde_saphyr::from_str_multiple(&text).unwrap_or_default();
        objects.extend(docs);
    }
    for example in std::fs::read_dir(repo().join("deploy/examples")).unwrap() {
        let file = example.unwrap().path();
        let args = hpp_bin::operator::Args::parse_from([
            "hpp-operator",
            "render",
            "--node",
            "node01,node02",
            "--openshift",
            "--prometheus",
            "-f",
            file.to_str().unwrap(),
        ]);
        let Some(hpp_bin::operator::Command::Render(r)) = args.command else {
            panic!("render expected")
        };
        objects.extend(
            hpp_bin::operator::render::render_with_env(&r, env.clone())
                .unwrap()
                .objects,
        );
    }
    let mut out = BTreeSet::new();
    for c in containers(&objects) {
        let image = c["image"].as_str().unwrap_or_default();
        let stock = if image == operator_image || image.contains("/hpp-operator:") {
            Stock::Operator
        } else if image == csi_image || image == legacy_image || image.contains("/hpp-csi-driver:") {
            Stock::Csi
        } else {
            continue;
        };
        out.insert((stock, c["command"][0].as_str().map(str::to_owned)));
    }
    out
}

#[test]
fn every_command_the_manifests_run_is_in_its_image() {
    let Some(images) = images("every_command_the_manifests_run_is_in_its_image") else {
        return;
    };
    let commands = commands();
    assert!(
        commands.contains(&(Stock::Csi, None)),
        "the CSI DaemonSet runs the entrypoint"
    );
    assert!(commands.contains(&(Stock::Operator, Some("/usr/bin/hpp-mounter".into()))));
    for (stock, command) in &commands {
        let image = match stock {
            Stock::Operator => &images.operator,
            Stock::Csi => &images.csi,
        };
        match command {
            // No `command`: the image's entrypoint runs, and must be the driver.
            None => assert_eq!(entrypoint(image), ["/usr/bin/hpp-csi-driver"], "{image}"),
            Some(command) => {
                let text = run_in(image, command, &["--version"]);
                assert!(text.contains(env!("CARGO_PKG_VERSION")), "{image} {command}: {text}");
            }
        }
    }
    // The tools the mounter runs, with the libraries they load.
    for tool in hpp_bin::operator::mounter::TOOLS {
        run_in(&images.operator, tool, &["-V"]);
    }
}

/// Removes the container and the test mounts when the test ends, passed or not.
struct Cleanup {
    container: String,
    mounts: Vec<PathBuf>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = podman().args(["rm", "-f", "-t", "0", &self.container]).output();
        for m in self.mounts.iter().rev() {
            let _ = rustix::mount::unmount(m, rustix::mount::UnmountFlags::DETACH);
        }
    }
}

/// `hpp-csi-driver call --endpoint ENDPOINT -o json ARGS` with the host build.
fn call(endpoint: &str, args: &[&str]) -> Value {
    let out = output(
        Command::new(env!("CARGO_BIN_EXE_hpp-csi-driver"))
            .args(["call", "--endpoint", endpoint, "-o", "json"])
            .args(args),
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn csi_driver_image_serves_a_bind_mounted_pool_to_the_host() {
    let Some(images) = images("csi_driver_image_serves_a_bind_mounted_pool_to_the_host") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let container = format!("hpp-image-test-{}", std::process::id());
    let mut cleanup = Cleanup {
        container: container.clone(),
        mounts: Vec::new(),
    };
    // A shared mount, so what the driver mounts in its container shows on the host, as the
    // kubelet sees it through the DaemonSet's Bidirectional mount.
    let shared = rustix::process::geteuid().is_root() && rustix::mount::mount_bind(&root, &root).is_ok() && {
        cleanup.mounts.push(root.clone());
        rustix::mount::mount_change(&root, rustix::mount::MountPropagationFlags::SHARED).is_ok()
    };
    std::fs::create_dir_all(root.join("pool")).unwrap();
    std::fs::create_dir_all(root.join("target")).unwrap();
    let r = root.display().to_string();
    let socket = root.join("csi.sock");
    let endpoint = format!("unix://{}", socket.display());
    let datadir = format!(r#"[{{"name":"legacy","path":"{r}/pool"}}]"#);
    let mut run = run_flags();
    run[1] = "-d".into(); // detached; removed by `Cleanup`
    output(
        podman()
            .args(&run)
            .args(["--name", &container, "--privileged", "-v"])
            .arg(format!("{r}:{r}{}", if shared { ":rshared" } else { "" }))
            .arg(&images.csi)
            .args(["--endpoint", &endpoint, "--nodeid", "image-test", "--datadir", &datadir])
            .args(["--metrics-insecure-http", "--metrics-address", "127.0.0.1:0"]),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while !socket.exists() {
        if Instant::now() > deadline {
            let logs = podman().args(["logs", &container]).output().unwrap();
            panic!("no socket from the driver: {}", String::from_utf8_lossy(&logs.stderr));
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    assert_eq!(call(&endpoint, &["probe"])["ready"], true);
    let created = call(&endpoint, &["create-volume", "image-test-vol"]);
    assert_eq!(created["volumeId"], "image-test-vol");
    assert!(
        root.join("pool/image-test-vol").is_dir(),
        "the volume is a directory of the host pool"
    );
    let target = root.join("target/image-test-vol");
    let t = target.display().to_string();
    assert_eq!(
        call(&endpoint, &["publish", "image-test-vol", &t])["action"],
        "published"
    );
    if shared {
        std::fs::write(root.join("pool/image-test-vol/data"), "hello").unwrap();
        assert_eq!(std::fs::read_to_string(target.join("data")).unwrap(), "hello");
        cleanup.mounts.push(target.clone());
    } else {
        eprintln!("not root: the published mount is checked inside the container only");
    }
    assert_eq!(
        call(&endpoint, &["unpublish", "image-test-vol", &t])["action"],
        "unpublished"
    );
    drop(cleanup);
}

#[test]
fn operator_image_renders_the_example_crs_as_the_host_build() {
    let Some(images) = images("operator_image_renders_the_example_crs_as_the_host_build") else {
        return;
    };
    let env = operator_env();
    let examples = repo().join("deploy/examples").canonicalize().unwrap();
    for example in std::fs::read_dir(&examples).unwrap() {
        let name = example.unwrap().file_name().to_string_lossy().into_owned();
        let mut cmd = podman();
        cmd.args(run_flags())
            .arg("-v")
            .arg(format!("{}:/examples:ro", examples.display()));
        for (k, v) in &env {
            cmd.arg("-e").arg(format!("{k}={v}"));
        }
        cmd.arg(&images.operator)
            .args(["render", "--node", "node01", "-o", "json", "-f"])
            .arg(format!("/examples/{name}"));
        let out = output(&mut cmd);
        let in_image: Vec<Value> = serde_json::Deserializer::from_slice(&out.stdout)
            .into_iter::<Value>()
            .collect::<Result<_, _>>()
            .unwrap();
        let args = hpp_bin::operator::Args::parse_from(
            ["hpp-operator", "render", "--node", "node01", "-f"]
                .into_iter()
                .map(String::from)
                .chain([examples.join(&name).display().to_string()]),
        );
        let Some(hpp_bin::operator::Command::Render(r)) = args.command else {
            panic!("render expected")
        };
        let on_host = hpp_bin::operator::render::render_with_env(&r, env.clone())
            .unwrap()
            .objects;
        assert!(in_image.len() >= 7, "{name}: {} objects", in_image.len());
        assert_eq!(
            in_image, on_host,
            "{name}: the image renders differently from the host build"
        );
    }
}

// KubeVirt's manifests and the objects its operator renders, run against the hpp images: the
// image-only swap of docs/migration.md. Fixtures in tests/fixtures/kubevirt/ say where each
// comes from.

fn kubevirt_fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/kubevirt")
        .join(name)
}

/// The containers KubeVirt's operator renders (`rendered-containers.yaml`).
fn kubevirt_rendered() -> Vec<Value> {
    let text = std::fs::read_to_string(kubevirt_fixture("rendered-containers.yaml")).unwrap();
    serde_saphyr::from_str(&text).unwrap()
}

/// The container of KubeVirt's operator Deployment (`operator-deployment.yaml`).
fn kubevirt_operator_container() -> Value {
    let text = std::fs::read_to_string(kubevirt_fixture("operator-deployment.yaml")).unwrap();
    let dep: Value = serde_saphyr::from_str(&text).unwrap();
    dep["spec"]["template"]["spec"]["containers"][0].clone()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

/// `$(VAR)` references expanded from `env`, as the kubelet does for `command` and `args`.
fn expand(arg: &str, env: &[(String, String)]) -> String {
    let mut out = arg.to_owned();
    for (k, v) in env {
        out = out.replace(&format!("$({k})"), v);
    }
    out
}

fn rendered_env(c: &Value) -> Vec<(String, String)> {
    c["env"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect()
}

/// The stock image a fixture container runs, from the variable KubeVirt's operator takes it from.
fn image_for<'a>(images: &'a Images, variable: &str) -> &'a str {
    match variable {
        "OPERATOR_IMAGE" => &images.operator,
        "CSI_PROVISIONER_IMAGE" | "PROVISIONER_IMAGE" => &images.csi,
        other => panic!("no stock image for {other}"),
    }
}

/// `podman logs` of a container, stdout and stderr.
fn logs(container: &str) -> String {
    let out = podman().args(["logs", container]).output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Every command KubeVirt's Deployment and rendered objects run in the images hpp's replace
/// exists in the hpp image and is hpp's: `hostpath-provisioner-operator` found on PATH as the
/// kubelet finds it, `/usr/bin/mounter`; containers without a command get hpp-csi-driver.
#[test]
fn kubevirts_commands_exist_in_the_hpp_images() {
    let Some(images) = images("kubevirts_commands_exist_in_the_hpp_images") else {
        return;
    };
    let operator = kubevirt_operator_container();
    let command = strings(&operator["command"]);
    assert_eq!(command, ["hostpath-provisioner-operator"]);
    let text = run_in(&images.operator, &command[0], &["--version"]);
    assert!(text.starts_with("hpp-operator "), "{text}");
    // runAsNonRoot: the kubelet refuses an image whose user is root.
    let out = output(podman().args(["image", "inspect", "--format", "{{.Config.User}}", &images.operator]));
    let user = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        !user.is_empty() && !user.starts_with("0") && !user.starts_with("root"),
        "{user}"
    );
    for c in kubevirt_rendered() {
        let image = image_for(&images, c["image"].as_str().unwrap());
        match strings(&c["command"]).first() {
            Some(command) => {
                let text = run_in(image, command, &["--version"]);
                assert!(text.starts_with("hpp-mounter "), "{command}: {text}");
            }
            None => assert_eq!(entrypoint(image), ["/usr/bin/hpp-csi-driver"], "{image}"),
        }
    }
}

/// KubeVirt's mounter Deployment command mounts a pool PVC onto the host path and keeps it;
/// its cleanup Job command takes it away again. As root with a shared mount, the mount is
/// checked from the host, as the CSI driver sees it.
#[test]
fn kubevirts_mounter_and_cleanup_commands_mount_and_unmount_a_pool() {
    let Some(images) = images("kubevirts_mounter_and_cleanup_commands_mount_and_unmount_a_pool") else {
        return;
    };
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIPPED kubevirts_mounter_and_cleanup_commands_mount_and_unmount_a_pool: needs root (mounts)");
        return;
    }
    let rendered = kubevirt_rendered();
    let mounter: Vec<&Value> = rendered.iter().filter(|c| c["name"] == "mounter").collect();
    let (deploy, cleanup) = (strings(&mounter[0]["command"]), strings(&mounter[1]["command"]));
    assert!(!cleanup.contains(&"--storagePoolPath".to_owned()) && cleanup.contains(&"--unmount".to_owned()));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let (source, host) = (root.join("pvc"), root.join("host"));
    std::fs::create_dir_all(&source).unwrap();
    std::fs::create_dir_all(&host).unwrap();
    std::fs::write(source.join("on-the-pvc"), "pool data").unwrap();
    let container = format!("hpp-kubevirt-mounter-{}", std::process::id());
    let mut cleanup_guard = Cleanup {
        container: container.clone(),
        mounts: Vec::new(),
    };
    rustix::mount::mount_bind(&host, &host).unwrap();
    cleanup_guard.mounts.push(host.clone());
    rustix::mount::mount_change(&host, rustix::mount::MountPropagationFlags::SHARED).unwrap();
    let target = host.join("var/hpvolumes/csi");
    cleanup_guard.mounts.push(target.clone());
    let user = mounter[0]["securityContext"]["runAsUser"].as_u64().unwrap();
    assert_eq!(mounter[0]["securityContext"]["privileged"], true);
    let volumes = |cmd: &mut Command| {
        cmd.arg("--privileged")
            .arg("--user")
            .arg(user.to_string())
            .arg("-v")
            .arg(format!("{}:/source", source.display()))
            .arg("-v")
            .arg(format!("{}:/host:rshared", host.display()));
    };
    let mut run = run_flags();
    run[1] = "-d".into();
    let mut cmd = podman();
    cmd.args(&run).args(["--name", &container]);
    volumes(&mut cmd);
    output(
        cmd.arg("--entrypoint")
            .arg(&deploy[0])
            .arg(&images.operator)
            .args(&deploy[1..]),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while !target.join("on-the-pvc").exists() {
        assert!(
            Instant::now() < deadline,
            "the pool is not mounted: {}",
            logs(&container)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(std::fs::read_to_string(target.join("on-the-pvc")).unwrap(), "pool data");
    output(podman().args(["stop", "-t", "10", &container]));
    // The cleanup Job, run to completion as its pod would be.
    let mut cmd = podman();
    cmd.args(run_flags());
    volumes(&mut cmd);
    output(
        cmd.arg("--entrypoint")
            .arg(&cleanup[0])
            .arg(&images.operator)
            .args(&cleanup[1..]),
    );
    assert!(
        !target.join("on-the-pvc").exists(),
        "the cleanup Job left the pool mounted"
    );
    drop(cleanup_guard);
}

/// KubeVirt's legacy DaemonSet runs `PROVISIONER_IMAGE` (hpp-csi-driver's image after the swap)
/// with no command and no arguments: the legacy provisioner starts, not the CSI driver. Without
/// a cluster it stops at its in-cluster configuration, which is as far as it can get here.
#[test]
fn kubevirts_legacy_daemonset_container_runs_the_legacy_provisioner() {
    let Some(images) = images("kubevirts_legacy_daemonset_container_runs_the_legacy_provisioner") else {
        return;
    };
    let rendered = kubevirt_rendered();
    let legacy = rendered.iter().find(|c| c["image"] == "PROVISIONER_IMAGE").unwrap();
    assert!(legacy.get("command").is_none() && legacy.get("args").is_none());
    let mut cmd = podman();
    cmd.args(run_flags());
    for (k, v) in rendered_env(legacy) {
        cmd.arg("-e").arg(format!("{k}={v}"));
    }
    let out = cmd.arg(image_for(&images, "PROVISIONER_IMAGE")).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("running /usr/bin/hpp-provisioner"), "{text}");
    assert!(text.contains("in-cluster Kubernetes configuration"), "{text}");
    assert!(!text.contains("serving CSI"), "{text}");
}

/// Address of a running container on podman's bridge network: the pod IP the kubelet probes.
fn container_ip(container: &str) -> std::net::IpAddr {
    let out = output(podman().args(["inspect", "--format", "{{.NetworkSettings.IPAddress}}", container]));
    let ip = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    ip.parse()
        .unwrap_or_else(|_| panic!("no address for {container}: {ip:?}"))
}

/// The body of an HTTP/1.1 response (plain or chunked).
fn body_of(response: &str) -> String {
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((response, ""));
    if !head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        return body.to_owned();
    }
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

/// One HTTP/1.1 request over plain TCP; the whole response, or why there is none.
fn http(addr: std::net::SocketAddr, method: &str, path: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// Accepts any server certificate, as the ServiceMonitor does (`insecureSkipVerify`).
#[derive(Debug)]
struct AnyCert(std::sync::Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// One HTTPS request: verified against `ca` for `server_name`, or, without `ca`, accepting any
/// certificate (TLS 1.3 only, as KubeVirt's ServiceMonitor asks).
fn https(
    addr: std::net::SocketAddr,
    server_name: &str,
    ca: Option<&rustls::pki_types::CertificateDer<'static>>,
    request: &[u8],
) -> Result<String, String> {
    use std::io::{Read, Write};
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?;
    let config = match ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(ca.clone()).map_err(|e| e.to_string())?;
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(std::sync::Arc::new(AnyCert(provider)))
            .with_no_client_auth(),
    };
    let name = rustls::pki_types::ServerName::try_from(server_name.to_owned()).map_err(|e| e.to_string())?;
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name).map_err(|e| e.to_string())?;
    let tcp = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    tls.write_all(request).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    match tls.read_to_end(&mut out) {
        Ok(_) => {}
        // A server that closes without close_notify still sent its whole response.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !out.is_empty() => {}
        Err(e) => return Err(e.to_string()),
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Polls `probe` until it answers 200, as the kubelet's readiness probe does, for at most a
/// minute; the last answer otherwise.
fn wait_ok(mut probe: impl FnMut() -> Result<String, String>) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let answer = probe();
        if matches!(&answer, Ok(r) if r.starts_with("HTTP/1.1 200")) || Instant::now() > deadline {
            return answer;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// KubeVirt's CSI DaemonSet container (`hostpath-provisioner` in `hostpath-provisioner-csi`) with
/// only its image changed: its exact arguments (references expanded as the kubelet does), its
/// environment, its privileged mode and its two volumes (the socket directory at /csi and the
/// pool at /local-data-dir, which its `--datadir` names relatively). The driver serves the pool
/// on the socket the registrar and csi-provisioner use, reports KubeVirt's version, serves
/// metrics over HTTPS on the pod address at 8443, and leaves 9898 to the livenessprobe sidecar.
#[test]
fn kubevirts_csi_daemonset_container_serves_its_pool() {
    let Some(images) = images("kubevirts_csi_daemonset_container_serves_its_pool") else {
        return;
    };
    let rendered = kubevirt_rendered();
    let c = rendered.iter().find(|c| c["image"] == "CSI_PROVISIONER_IMAGE").unwrap();
    assert!(c.get("command").is_none(), "the image's entrypoint runs");
    let env = rendered_env(c);
    let args: Vec<String> = strings(&c["args"]).iter().map(|a| expand(a, &env)).collect();
    assert!(args.iter().all(|a| !a.contains("$(")), "{args:?}");
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let (sockets, pool) = (root.join("csi"), root.join("hpvolumes"));
    std::fs::create_dir_all(&sockets).unwrap();
    std::fs::create_dir_all(&pool).unwrap();
    let container = format!("hpp-kubevirt-csi-{}", std::process::id());
    let guard = Cleanup {
        container: container.clone(),
        mounts: Vec::new(),
    };
    let mut run = run_flags();
    run.drain(..4); // the pod network, not none
    let mut cmd = podman();
    cmd.args(["run", "-d"])
        .args(&run)
        .args(["--name", &container, "--privileged"])
        .arg("-v")
        .arg(format!("{}:/csi", sockets.display()))
        .arg("-v")
        .arg(format!("{}:/local-data-dir", pool.display()));
    for (k, v) in &env {
        cmd.arg("-e").arg(format!("{k}={v}"));
    }
    output(cmd.arg(&images.csi).args(&args));
    let socket = sockets.join("csi.sock");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !socket.exists() {
        assert!(
            Instant::now() < deadline,
            "no socket from the driver: {}",
            logs(&container)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let endpoint = format!("unix://{}", socket.display());
    assert_eq!(call(&endpoint, &["probe"])["ready"], true);
    let info = call(&endpoint, &["info"]);
    assert_eq!(info["name"], "kubevirt.io.hostpath-provisioner");
    assert_eq!(info["vendorVersion"], "v0.25.2", "--version=$(VERSION)");
    let created = call(&endpoint, &["create-volume", "pvc-kubevirt-args"]);
    assert_eq!(created["volumeId"], "pvc-kubevirt-args");
    assert!(
        pool.join("csi/pvc-kubevirt-args").is_dir(),
        "the volume is <pool path>/csi/<id> on the host, as with KubeVirt's driver"
    );
    let ip = container_ip(&container);
    let metrics = wait_ok(|| {
        https(
            std::net::SocketAddr::new(ip, 8443),
            "localhost",
            None,
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
    })
    .unwrap();
    assert!(metrics.contains("kubevirt_hpp_pool_path_shared_with_os"), "{metrics}");
    // Port 9898 (`healthz`) is the livenessprobe sidecar's in KubeVirt's pod: the driver must not
    // take it, or the sidecar could not start.
    let sidecar_port = http(std::net::SocketAddr::new(ip, 9898), "GET", "/healthz");
    assert!(sidecar_port.is_err(), "{sidecar_port:?}");
    drop(guard);
}

/// What the kubelet gives KubeVirt's operator pod besides its container spec: the pod's name
/// and namespace for the downward API, and the service-account volume.
const POD_NAME: &str = "hostpath-provisioner-operator-6d8f9c7b5d-x2x9q";
const POD_NAMESPACE: &str = "hostpath-provisioner";
/// The name KubeVirt's deploy/webhook.yaml gives the webhook's certificate (and Service).
const WEBHOOK_DNS_NAME: &str = "hostpath-provisioner-operator-webhook-service.hostpath-provisioner.svc";

/// The container's environment as the kubelet resolves it: values as they are, the downward API
/// from the pod (a label the pod does not carry gives ""), plus the API server's address, which
/// here reaches nothing.
fn kubelet_env(container: &Value) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let name = e["name"].as_str().unwrap().to_owned();
            let value = match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("metadata.namespace") => POD_NAMESPACE.to_owned(),
                Some("metadata.name") => POD_NAME.to_owned(),
                Some(path) if path.starts_with("metadata.labels[") => String::new(),
                Some(other) => panic!("the kubelet would resolve {other}; add it here"),
                None => e["value"].as_str().unwrap_or_default().to_owned(),
            };
            (name, value)
        })
        .collect();
    env.push(("KUBERNETES_SERVICE_HOST".into(), "127.0.0.1".into()));
    env.push(("KUBERNETES_SERVICE_PORT".into(), "1".into()));
    env
}

/// A directory others may read (the operator runs as 65532), with these files.
fn readable_dir(path: &Path, files: &[(&str, &[u8])]) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(path).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    for (name, content) in files {
        std::fs::write(path.join(name), content).unwrap();
        // defaultMode 420 of KubeVirt's secret volume.
        std::fs::set_permissions(path.join(name), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
}

/// KubeVirt's operator Deployment with only the image changed, run with podman the way the
/// kubelet runs it: its command (`hostpath-provisioner-operator`, no arguments), its environment
/// (KubeVirt's image variables, no hpp variable), its security context, the webhook certificate
/// secret at /tmp/k8s-webhook-server/serving-certs and a service-account volume. There is no API
/// server here, so the operator cannot get the leader lease: it must stay up as a standby that
/// says why, answer the Deployment's probes (`/livez`, `/readyz` on port 6060 of the pod
/// address), validate CR changes on 9443 with the mounted certificate (an AdmissionReview
/// `v1beta1`, the version KubeVirt's webhook configuration sends), serve metrics over HTTPS on
/// 8443, and stop cleanly on SIGTERM.
#[test]
fn kubevirts_operator_deployment_runs_the_hpp_operator_image() {
    let Some(images) = images("kubevirts_operator_deployment_runs_the_hpp_operator_image") else {
        return;
    };
    let spec = kubevirt_operator_container();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    // The webhook's certificate, as cert-manager issues it for KubeVirt's Certificate.
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec![WEBHOOK_DNS_NAME.to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    let (certs, sa) = (root.join("serving-certs"), root.join("serviceaccount"));
    readable_dir(&root, &[]);
    readable_dir(
        &certs,
        &[
            ("tls.crt", leaf.pem().as_bytes()),
            ("tls.key", leaf_key.serialize_pem().as_bytes()),
        ],
    );
    readable_dir(
        &sa,
        &[
            ("token", b"not-a-real-token"),
            ("ca.crt", ca.pem().as_bytes()),
            ("namespace", POD_NAMESPACE.as_bytes()),
        ],
    );
    let mount = |spec: &Value| spec["volumeMounts"][0]["mountPath"].as_str().unwrap().to_owned();
    assert_eq!(mount(&spec), "/tmp/k8s-webhook-server/serving-certs");
    let command = strings(&spec["command"]);
    assert!(spec.get("args").is_none());
    let container = format!("hpp-kubevirt-operator-{}", std::process::id());
    let guard = Cleanup {
        container: container.clone(),
        mounts: Vec::new(),
    };
    let mut run = run_flags();
    run.drain(..4); // the pod network, not none
    let mut cmd = podman();
    cmd.args(["run", "-d"])
        .args(&run)
        .args(["--name", &container, "--hostname", POD_NAME])
        // securityContext: allowPrivilegeEscalation false, capabilities drop ALL, seccomp
        // RuntimeDefault (podman's default profile), runAsNonRoot (the image's user).
        .args(["--security-opt", "no-new-privileges", "--cap-drop", "ALL"])
        .arg("-v")
        .arg(format!("{}:{}:ro", certs.display(), mount(&spec)))
        .arg("-v")
        .arg(format!(
            "{}:/var/run/secrets/kubernetes.io/serviceaccount:ro",
            sa.display()
        ));
    for (k, v) in kubelet_env(&spec) {
        cmd.arg("-e").arg(format!("{k}={v}"));
    }
    cmd.arg("--entrypoint")
        .arg(serde_json::to_string(&command).unwrap())
        .arg(&images.operator);
    output(&mut cmd);
    let ip = container_ip(&container);
    // The Deployment's probes, where it says: httpGet on the pod address.
    let probe = |name: &str| {
        let get = &spec[name]["httpGet"];
        let port = u16::try_from(get["port"].as_u64().unwrap()).unwrap();
        (
            std::net::SocketAddr::new(ip, port),
            get["path"].as_str().unwrap().to_owned(),
        )
    };
    let (ready_addr, ready_path) = probe("readinessProbe");
    let (live_addr, live_path) = probe("livenessProbe");
    assert_eq!((ready_addr.port(), live_addr.port()), (6060, 6060));
    let ready = wait_ok(|| http(ready_addr, "GET", &ready_path).map_err(|e| e.to_string()));
    assert!(
        matches!(&ready, Ok(r) if r.starts_with("HTTP/1.1 200")),
        "{ready:?}\n{}",
        logs(&container)
    );
    let live = http(live_addr, "GET", &live_path).unwrap();
    assert!(live.starts_with("HTTP/1.1 200"), "{live}");

    // The webhook, as the API server reaches it through KubeVirt's Service (443 -> 9443): a CR
    // with both pathConfig and storagePools, which KubeVirt refuses too.
    let review = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1beta1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0b6bd4f9-2c59-4f1e-8a41-6b1c1d5e0a01",
            "kind": {"group": "hostpathprovisioner.kubevirt.io", "version": "v1beta1", "kind": "HostPathProvisioner"},
            "resource": {"group": "hostpathprovisioner.kubevirt.io", "version": "v1beta1", "resource": "hostpathprovisioners"},
            "name": "hostpath-provisioner",
            "operation": "CREATE",
            "userInfo": {"username": "kubernetes-admin"},
            "object": {
                "apiVersion": "hostpathprovisioner.kubevirt.io/v1beta1", "kind": "HostPathProvisioner",
                "metadata": {"name": "hostpath-provisioner"},
                "spec": {"pathConfig": {"path": "/var/hpvolumes"},
                         "storagePools": [{"name": "local", "path": "/var/hpvolumes"}]},
            },
        },
    })
    .to_string();
    let request = format!(
        "POST /validate-hostpathprovisioner-kubevirt-io-v1beta1-hostpathprovisioner HTTP/1.1\r\nHost: {WEBHOOK_DNS_NAME}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{review}",
        review.len()
    );
    let ca_der = ca.der().clone();
    let answer = https(
        std::net::SocketAddr::new(ip, 9443),
        WEBHOOK_DNS_NAME,
        Some(&ca_der),
        request.as_bytes(),
    )
    .unwrap_or_else(|e| panic!("webhook: {e}\n{}", logs(&container)));
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let reply: Value = serde_json::from_str(&body_of(&answer)).unwrap();
    assert_eq!(reply["apiVersion"], "admission.k8s.io/v1beta1", "{reply}");
    assert_eq!(reply["response"]["allowed"], false, "{reply}");
    let message = reply["response"]["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("spec.storagePools") && message.contains("spec.pathConfig"),
        "{reply}"
    );

    // Metrics over HTTPS where the hpp-prometheus-metrics Service sends Prometheus.
    let metrics = https(
        std::net::SocketAddr::new(ip, 8443),
        "localhost",
        None,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    assert!(metrics.contains("kubevirt_hpp_cr_ready"), "{metrics}");

    // A standby that says why, still running, and still ready.
    let text = logs(&container);
    assert!(text.contains("cannot read or write the leader Lease"), "{text}");
    assert!(!text.contains("acquired leadership"), "{text}");
    let out = output(podman().args(["inspect", "--format", "{{.State.Running}}", &container]));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "true", "{text}");
    assert!(
        http(ready_addr, "GET", &ready_path)
            .unwrap()
            .starts_with("HTTP/1.1 200")
    );
    // SIGTERM, as the kubelet stops the old pod of a rollout: a clean exit.
    output(podman().args(["stop", "-t", "30", &container]));
    let out = output(podman().args(["inspect", "--format", "{{.State.ExitCode}}", &container]));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0", "{}", logs(&container));
    drop(guard);
}
