//! Tests of the built stock images (images/build.sh builds them; images/test.sh and `.ci/run`
//! run this with the image names set):
//! - each image's binaries answer `--version`;
//! - every command deploy/ and the operator's rendered pods run exists in the image it runs from,
//!   the image entrypoint serves containers without a `command`, and the mounter's tools run;
//! - the CSI driver image serves a bind-mounted pool over a socket, answering Probe, CreateVolume
//!   and NodePublishVolume from the host side through this build's `hpp-csi-driver call`;
//! - the operator image renders the example CRs exactly as the host build does.
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
