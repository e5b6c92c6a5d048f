//! Getting in and out safely, checked on what `kubectl kustomize` renders for every layer of
//! `deploy/`: the base install needs no cert-manager and registers no webhook; whatever makes
//! the API server call the webhook ships in the same layer as the certificate it trusts; no
//! class marks itself default; the legacy provisioner layers ship no StorageClass; and every
//! documented install path has a documented uninstall that removes every cluster-scoped object
//! it created.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every kustomization under `deploy/`, by directory.
const LAYERS: &[&str] = &[
    "deploy",
    "deploy/webhook",
    "deploy/csi",
    "deploy/snapshot",
    "deploy/storageclass/pathconfig",
    "deploy/legacy/kubevirt",
    "deploy/legacy/kubevirt/storageclass",
    "deploy/legacy/single-node",
    "deploy/legacy/single-node/storageclass",
    "deploy/legacy/shared",
    "deploy/legacy/shared/storageclass",
];

/// A source of objects in a documented command: `-k DIR` or `-f FILE`.
#[derive(Clone, Copy)]
enum Src {
    K(&'static str),
    F(&'static str),
}

/// One documented way in, and its way out (both as they appear in docs/user-guide.md).
struct InstallPath {
    name: &'static str,
    install: &'static [Src],
    uninstall: &'static [Src],
}

const PATHS: &[InstallPath] = &[
    InstallPath {
        name: "operator (deploy/, webhook, snapshot class, pathConfig classes)",
        install: &[
            Src::K("deploy"),
            Src::K("deploy/webhook"),
            Src::K("deploy/snapshot"),
            Src::K("deploy/storageclass/pathconfig"),
        ],
        uninstall: &[
            Src::K("deploy/snapshot"),
            Src::K("deploy/storageclass/pathconfig"),
            Src::K("deploy/webhook"),
            Src::K("deploy"),
        ],
    },
    InstallPath {
        name: "CSI driver without the operator",
        install: &[
            Src::F("deploy/namespace.yaml"),
            Src::K("deploy/csi"),
            Src::K("deploy/snapshot"),
        ],
        uninstall: &[
            Src::K("deploy/snapshot"),
            Src::K("deploy/csi"),
            Src::F("deploy/namespace.yaml"),
        ],
    },
    InstallPath {
        name: "legacy kubevirt",
        install: &[
            Src::F("deploy/namespace.yaml"),
            Src::K("deploy/legacy/kubevirt"),
            Src::K("deploy/legacy/kubevirt/storageclass"),
        ],
        uninstall: &[
            Src::K("deploy/legacy/kubevirt/storageclass"),
            Src::K("deploy/legacy/kubevirt"),
            Src::F("deploy/namespace.yaml"),
        ],
    },
    InstallPath {
        name: "legacy single-node",
        install: &[
            Src::F("deploy/namespace.yaml"),
            Src::K("deploy/legacy/single-node"),
            Src::K("deploy/legacy/single-node/storageclass"),
        ],
        uninstall: &[
            Src::K("deploy/legacy/single-node/storageclass"),
            Src::K("deploy/legacy/single-node"),
            Src::F("deploy/namespace.yaml"),
        ],
    },
    InstallPath {
        name: "legacy shared",
        install: &[
            Src::F("deploy/namespace.yaml"),
            Src::K("deploy/legacy/shared"),
            Src::K("deploy/legacy/shared/storageclass"),
        ],
        uninstall: &[
            Src::K("deploy/legacy/shared/storageclass"),
            Src::K("deploy/legacy/shared"),
            Src::F("deploy/namespace.yaml"),
        ],
    },
];

fn kubectl_missing(test: &str) -> bool {
    let missing = Command::new("kubectl").args(["version", "--client"]).output().is_err();
    if missing {
        eprintln!("SKIPPED {test}: kubectl is not installed");
    }
    missing
}

fn parse(text: &str) -> Vec<Value> {
    let docs: Vec<Value> = serde_saphyr::from_str_multiple(text).unwrap();
    docs.into_iter().filter(|v| !v.is_null()).collect()
}

fn render(dir: &str) -> Vec<Value> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(repo().join(dir))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl kustomize {dir}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    parse(&String::from_utf8_lossy(&out.stdout))
}

fn objects(src: Src) -> Vec<Value> {
    match src {
        Src::K(dir) => render(dir),
        Src::F(file) => parse(&std::fs::read_to_string(repo().join(file)).unwrap()),
    }
}

fn kind(o: &Value) -> &str {
    o["kind"].as_str().unwrap_or_default()
}

fn name(o: &Value) -> &str {
    o["metadata"]["name"].as_str().unwrap_or_default()
}

fn group(o: &Value) -> &str {
    o["apiVersion"]
        .as_str()
        .unwrap_or_default()
        .split('/')
        .rev()
        .nth(1)
        .unwrap_or("")
}

fn kustomizations(dir: &Path, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            kustomizations(&path, out);
        } else if path.file_name().is_some_and(|n| n == "kustomization.yaml") {
            let rel = path.parent().unwrap().strip_prefix(repo()).unwrap();
            out.insert(rel.display().to_string());
        }
    }
}

#[test]
fn every_kustomization_is_checked_here() {
    let mut found = BTreeSet::new();
    kustomizations(&repo().join("deploy"), &mut found);
    let listed: BTreeSet<String> = LAYERS.iter().map(|s| (*s).to_owned()).collect();
    assert_eq!(
        found, listed,
        "add new kustomizations to LAYERS (and to an install path)"
    );
}

#[test]
fn the_base_install_needs_no_cert_manager_and_registers_no_webhook() {
    if kubectl_missing("the_base_install_needs_no_cert_manager_and_registers_no_webhook") {
        return;
    }
    for o in render("deploy") {
        assert_ne!(
            group(&o),
            "cert-manager.io",
            "deploy/ must not need cert-manager: {} {}",
            kind(&o),
            name(&o)
        );
        assert!(
            !kind(&o).ends_with("WebhookConfiguration"),
            "deploy/ must not register a webhook: {}",
            name(&o)
        );
        if kind(&o) == "CustomResourceDefinition" {
            assert_ne!(
                o["spec"]["conversion"]["strategy"], "Webhook",
                "deploy/ must not install a converting CRD"
            );
        }
    }
}

/// `namespace/name` of the Certificate cert-manager injects into this object, if it asks.
fn injected_from(o: &Value) -> Option<&str> {
    o["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].as_str()
}

#[test]
fn webhook_registrations_ship_with_their_certificate() {
    if kubectl_missing("webhook_registrations_ship_with_their_certificate") {
        return;
    }
    for layer in LAYERS {
        let objs = render(layer);
        let certificates: BTreeSet<String> = objs
            .iter()
            .filter(|o| kind(o) == "Certificate" && group(o) == "cert-manager.io")
            .map(|o| {
                format!(
                    "{}/{}",
                    o["metadata"]["namespace"].as_str().unwrap_or_default(),
                    name(o)
                )
            })
            .collect();
        for o in &objs {
            let calls_webhook = kind(o) == "ValidatingWebhookConfiguration"
                || kind(o) == "MutatingWebhookConfiguration"
                || (kind(o) == "CustomResourceDefinition" && o["spec"]["conversion"]["strategy"] == "Webhook");
            if !calls_webhook {
                continue;
            }
            let from =
                injected_from(o).unwrap_or_else(|| panic!("{layer}: {} {} trusts no certificate", kind(o), name(o)));
            assert!(
                certificates.contains(from),
                "{layer}: {} {} trusts {from}, which this layer does not issue",
                kind(o),
                name(o)
            );
        }
    }
}

#[test]
fn no_class_marks_itself_default_and_provisioner_layers_ship_none() {
    if kubectl_missing("no_class_marks_itself_default_and_provisioner_layers_ship_none") {
        return;
    }
    for layer in LAYERS {
        for o in render(layer).iter().filter(|o| kind(o) == "StorageClass") {
            for key in [
                "storageclass.kubernetes.io/is-default-class",
                "storageclass.beta.kubernetes.io/is-default-class",
            ] {
                assert_ne!(
                    o["metadata"]["annotations"][key],
                    "true",
                    "{layer}: StorageClass {} marks itself default",
                    name(o)
                );
            }
            assert!(
                !layer.starts_with("deploy/legacy/") || layer.ends_with("/storageclass"),
                "{layer}: the provisioner manifests ship StorageClass {} (move it to storageclass/)",
                name(o)
            );
        }
    }
}

fn cluster_scoped(o: &Value) -> bool {
    o["metadata"]["namespace"].is_null() && kind(o) != "Kustomization"
}

fn key(o: &Value) -> (String, String) {
    (kind(o).to_owned(), name(o).to_owned())
}

fn command(verb: &str, src: Src) -> String {
    match src {
        Src::K(dir) => format!("kubectl {verb} -k {dir}/"),
        Src::F(file) => format!("kubectl {verb} -f {file}"),
    }
}

#[test]
fn every_install_path_has_a_documented_uninstall_that_removes_what_it_created() {
    if kubectl_missing("every_install_path_has_a_documented_uninstall_that_removes_what_it_created") {
        return;
    }
    let guide = std::fs::read_to_string(repo().join("docs/user-guide.md")).unwrap();
    let mut rendered: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut objs = |src: Src| -> Vec<Value> {
        let id = command("x", src);
        rendered.entry(id).or_insert_with(|| objects(src)).clone()
    };
    for path in PATHS {
        for &src in path.install {
            let cmd = command("apply", src);
            assert!(guide.contains(&cmd), "{}: the user guide never says `{cmd}`", path.name);
        }
        for &src in path.uninstall {
            let cmd = command("delete", src);
            assert!(guide.contains(&cmd), "{}: the user guide never says `{cmd}`", path.name);
        }
        let installed: BTreeSet<_> = path
            .install
            .iter()
            .flat_map(|&s| objs(s))
            .filter(cluster_scoped)
            .map(|o| key(&o))
            .collect();
        let removed: BTreeSet<_> = path
            .uninstall
            .iter()
            .flat_map(|&s| objs(s))
            .filter(cluster_scoped)
            .map(|o| key(&o))
            .collect();
        let left: Vec<_> = installed.difference(&removed).collect();
        assert!(left.is_empty(), "{}: uninstall leaves {left:?}", path.name);
        for expected in ["StorageClass", "VolumeSnapshotClass"] {
            if installed.iter().any(|(k, _)| k == expected) {
                assert!(removed.iter().any(|(k, _)| k == expected), "{}: {expected}", path.name);
            }
        }
    }
}

/// Runs `deploy/webhook/preflight.sh` against a stand-in `kubectl` that answers `get` with
/// `status` (0: found, 1: not found) for names containing `cert-manager` and 0 otherwise.
fn preflight(cert_manager: bool) -> std::process::Output {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let stub = dir.path().join("kubectl");
    let missing = if cert_manager { 0 } else { 1 };
    std::fs::write(
        &stub,
        format!("#!/bin/sh\ncase \"$*\" in *cert-manager*) exit {missing};; esac\nexit 0\n"),
    )
    .unwrap();
    std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", dir.path().display(), std::env::var("PATH").unwrap_or_default());
    Command::new("sh")
        .arg(repo().join("deploy/webhook/preflight.sh"))
        .env("PATH", path)
        .output()
        .unwrap()
}

#[test]
fn the_webhook_preflight_refuses_without_cert_manager_before_anything_is_applied() {
    if Command::new("sh").arg("-c").arg("true").output().is_err() {
        eprintln!("SKIPPED the_webhook_preflight_refuses_without_cert_manager_before_anything_is_applied: no sh");
        return;
    }
    let without = preflight(false);
    assert!(!without.status.success());
    let err = String::from_utf8_lossy(&without.stderr);
    assert!(
        err.contains("needs cert-manager") && err.contains("certificates.cert-manager.io"),
        "{err}"
    );
    let with = preflight(true);
    assert!(with.status.success(), "{}", String::from_utf8_lossy(&with.stderr));
}
