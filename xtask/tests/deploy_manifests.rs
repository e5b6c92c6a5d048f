//! Every manifest in `deploy/` parses into its Kubernetes type without losing a field, the
//! manifests agree with each other (service accounts, selectors, secrets, webhook wiring, ports,
//! image variables), they agree with what the operator renders for each example CR, and the
//! Containerfiles ship the binaries the manifests run.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use hpp_api::constants::{DRIVER_NAME, LEGACY_PROVISIONER_NAME, PARAM_STORAGE_POOL};
use hpp_reconcile::facts::ClusterFacts;
use hpp_reconcile::{OperatorConfig, Pipeline};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Namespace, PodTemplateSpec, Secret, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding, Subject};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::de::DeserializeOwned;
use serde_json::Value;

const NAMESPACE: &str = "hostpath-provisioner";
const WEBHOOK_PATH: &str = "/validate-hostpathprovisioner-kubevirt-io-v1beta1-hostpathprovisioner";
const WEBHOOK_CERT_DIR: &str = "/tmp/k8s-webhook-server/serving-certs";
const IMAGE_VARS: &[&str] = &[
    "OPERATOR_IMAGE",
    "PROVISIONER_IMAGE",
    "CSI_PROVISIONER_IMAGE",
    "NODE_DRIVER_REG_IMAGE",
    "LIVENESS_PROBE_IMAGE",
    "CSI_SIG_STORAGE_PROVISIONER_IMAGE",
    "CSI_SNAPSHOT_IMAGE",
    "CSI_RESIZER_IMAGE",
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One YAML document with the file it came from.
#[derive(Clone)]
struct Doc {
    file: String,
    value: Value,
}

impl Doc {
    fn kind(&self) -> &str {
        self.value["kind"].as_str().unwrap_or_default()
    }
    fn name(&self) -> &str {
        self.value["metadata"]["name"].as_str().unwrap_or_default()
    }
    fn namespace(&self) -> Option<&str> {
        self.value["metadata"]["namespace"].as_str()
    }
    fn typed<T: DeserializeOwned>(&self) -> T {
        serde_json::from_value(self.value.clone())
            .unwrap_or_else(|e| panic!("{}: {} {}: {e}", self.file, self.kind(), self.name()))
    }
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
}

fn load(path: &Path) -> Vec<Doc> {
    let text = std::fs::read_to_string(path).unwrap();
    let file = path.strip_prefix(repo()).unwrap_or(path).display().to_string();
    let values: Vec<Value> =
        serde_saphyr::from_str_multiple(&text).unwrap_or_else(|e| panic!("{file}: not valid YAML: {e}"));
    values
        .into_iter()
        .filter(|v| !v.is_null())
        .map(|value| Doc {
            file: file.clone(),
            value,
        })
        .collect()
}

/// Every document under `deploy/` except kustomizations.
fn all_docs() -> Vec<Doc> {
    let mut files = Vec::new();
    yaml_files(&repo().join("deploy"), &mut files);
    files.sort();
    files
        .iter()
        // kustomize's own files are not Kubernetes objects.
        .filter(|f| {
            f.file_name()
                .is_some_and(|n| n != "kustomization.yaml" && n != "kustomizeconfig.yaml")
        })
        .flat_map(|f| load(f))
        .collect()
}

/// The first path at which `a` and `b` differ, if any.
fn first_difference(a: &Value, b: &Value, path: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| {
                let (l, r) = (x.get(k).unwrap_or(&Value::Null), y.get(k).unwrap_or(&Value::Null));
                first_difference(l, r, &format!("{path}.{k}"))
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (l, r))| first_difference(l, r, &format!("{path}[{i}]"))),
        (Value::Number(x), Value::Number(y)) if x.as_f64() == y.as_f64() => None,
        _ if a == b => None,
        _ => Some(format!("{path}: {a} != {b}")),
    }
}

/// Parses into `T` and back: a misspelled or misplaced field would be dropped on the way.
fn round_trips<T: DeserializeOwned + serde::Serialize>(doc: &Doc) {
    let typed: T = doc.typed();
    let back = serde_json::to_value(&typed).unwrap();
    if let Some(diff) = first_difference(&doc.value, &back, "") {
        panic!(
            "{}: {} {} does not survive a round trip through its type (unknown or misplaced field?): {diff}",
            doc.file,
            doc.kind(),
            doc.name()
        );
    }
}

#[test]
fn round_trip_catches_misspelled_fields() {
    let doc = Doc {
        file: "inline".into(),
        value: serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
            "spec": {"replica": 1, "selector": {}, "template": {}}
        }),
    };
    let result = std::panic::catch_unwind(|| round_trips::<Deployment>(&doc));
    assert!(result.is_err(), "a misspelled field must be reported");
}

#[test]
fn every_manifest_parses_into_its_type() {
    let docs = all_docs();
    assert!(docs.len() > 40, "only {} documents found", docs.len());
    for doc in &docs {
        let api_version = doc.value["apiVersion"].as_str().unwrap_or_default();
        assert!(!doc.name().is_empty(), "{}: a {} without a name", doc.file, doc.kind());
        match (api_version, doc.kind()) {
            ("v1", "Namespace") => round_trips::<Namespace>(doc),
            ("v1", "ServiceAccount") => round_trips::<ServiceAccount>(doc),
            ("v1", "Service") => round_trips::<Service>(doc),
            ("v1", "Secret") => round_trips::<Secret>(doc),
            ("apps/v1", "Deployment") => round_trips::<Deployment>(doc),
            ("apps/v1", "DaemonSet") => round_trips::<DaemonSet>(doc),
            ("rbac.authorization.k8s.io/v1", "ClusterRole") => round_trips::<ClusterRole>(doc),
            ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => round_trips::<ClusterRoleBinding>(doc),
            ("rbac.authorization.k8s.io/v1", "Role") => round_trips::<Role>(doc),
            ("rbac.authorization.k8s.io/v1", "RoleBinding") => round_trips::<RoleBinding>(doc),
            ("storage.k8s.io/v1", "StorageClass") => round_trips::<StorageClass>(doc),
            ("storage.k8s.io/v1", "CSIDriver") => round_trips::<CSIDriver>(doc),
            ("networking.k8s.io/v1", "NetworkPolicy") => {
                round_trips::<k8s_openapi::api::networking::v1::NetworkPolicy>(doc)
            }
            ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration") => {
                round_trips::<ValidatingWebhookConfiguration>(doc)
            }
            ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => round_trips::<CustomResourceDefinition>(doc),
            ("hostpathprovisioner.kubevirt.io/v1beta1", "HostPathProvisioner") => {
                round_trips::<hpp_api::HostPathProvisioner>(doc)
            }
            ("cert-manager.io/v1", "Issuer") => assert!(doc.value["spec"].is_object(), "{}", doc.file),
            ("cert-manager.io/v1", "Certificate") => {
                assert!(doc.value["spec"]["secretName"].is_string(), "{}", doc.file);
                assert!(doc.value["spec"]["issuerRef"]["name"].is_string(), "{}", doc.file);
            }
            ("snapshot.storage.k8s.io/v1", "VolumeSnapshotClass") => {
                assert_eq!(doc.value["driver"], DRIVER_NAME, "{}", doc.file);
                assert!(doc.value["deletionPolicy"].is_string(), "{}", doc.file);
            }
            ("security.openshift.io/v1", "SecurityContextConstraints") => {
                assert!(doc.value["users"].is_array(), "{}", doc.file);
            }
            (v, k) => panic!("{}: unexpected document {v} {k}: add it to this test", doc.file),
        }
    }
}

#[test]
fn kustomizations_name_existing_files() {
    let mut files = Vec::new();
    yaml_files(&repo().join("deploy"), &mut files);
    let kustomizations: Vec<_> = files
        .iter()
        .filter(|f| f.file_name().is_some_and(|n| n == "kustomization.yaml"))
        .collect();
    assert!(kustomizations.len() >= 2, "deploy/ and deploy/csi/ have kustomizations");
    for k in kustomizations {
        let doc = &load(k)[0];
        assert_eq!(doc.value["kind"], "Kustomization", "{}", doc.file);
        let resources = doc.value["resources"].as_array().unwrap();
        let mut kinds_names = BTreeSet::new();
        for r in resources {
            let path = k.parent().unwrap().join(r.as_str().unwrap());
            assert!(
                path.exists(),
                "{}: resource {} does not exist",
                doc.file,
                path.display()
            );
            for d in load(&path) {
                // One object per name and kind, or `kubectl apply -k` fails.
                let key = (
                    d.kind().to_string(),
                    d.namespace().map(str::to_string),
                    d.name().to_string(),
                );
                assert!(kinds_names.insert(key.clone()), "{}: {key:?} appears twice", doc.file);
            }
        }
    }
    // The top-level install brings the namespace, the CRD and the operator; the webhook (which
    // needs cert-manager) is its own layer (see deploy_kustomize.rs).
    let listed = |file: &str| -> Vec<String> {
        load(&repo().join(file))[0].value["resources"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect()
    };
    let top = listed("deploy/kustomization.yaml");
    for needed in ["namespace.yaml", "operator/rbac.yaml", "operator/deployment.yaml"] {
        assert!(
            top.iter().any(|l| l == needed),
            "deploy/kustomization.yaml lacks {needed}"
        );
    }
    assert!(
        top.iter()
            .any(|l| l == "crds/hostpathprovisioner.kubevirt.io_hostpathprovisioners.yaml")
    );
    let webhook = listed("deploy/webhook/kustomization.yaml");
    assert!(webhook.iter().any(|l| l == "webhook.yaml"));
    assert!(
        webhook
            .iter()
            .any(|l| l == "hostpathprovisioner.kubevirt.io_hostpathprovisioners.yaml")
    );
}

/// Documents of one install unit: a directory of `deploy/` together with the shared top level.
fn pod_templates(docs: &[Doc]) -> Vec<(Doc, PodTemplateSpec, BTreeMap<String, String>)> {
    docs.iter()
        .filter_map(|d| match d.kind() {
            "Deployment" => {
                let dep: Deployment = d.typed();
                let spec = dep.spec.unwrap();
                Some((d.clone(), spec.template, spec.selector.match_labels.unwrap_or_default()))
            }
            "DaemonSet" => {
                let ds: DaemonSet = d.typed();
                let spec = ds.spec.unwrap();
                Some((d.clone(), spec.template, spec.selector.match_labels.unwrap_or_default()))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn workloads_reference_what_exists() {
    let docs = all_docs();
    let service_accounts: BTreeSet<(String, String)> = docs
        .iter()
        .filter(|d| d.kind() == "ServiceAccount")
        .map(|d| (d.namespace().unwrap_or_default().to_string(), d.name().to_string()))
        .collect();
    let certificate_secrets: BTreeSet<String> = docs
        .iter()
        .filter(|d| d.kind() == "Certificate")
        .map(|d| d.value["spec"]["secretName"].as_str().unwrap().to_string())
        .collect();
    for (doc, template, selector) in pod_templates(&docs) {
        let labels = template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        assert!(!selector.is_empty(), "{}: {} has no selector", doc.file, doc.name());
        for (k, v) in &selector {
            assert_eq!(
                labels.get(k),
                Some(v),
                "{}: selector {k}={v} does not match the pod labels",
                doc.file
            );
        }
        let spec = template.spec.unwrap();
        let ns = doc.namespace().unwrap_or_default().to_string();
        assert_eq!(ns, NAMESPACE, "{}: workloads live in {NAMESPACE}", doc.file);
        let sa = spec.service_account_name.clone().unwrap_or_default();
        assert!(
            service_accounts.contains(&(ns.clone(), sa.clone())),
            "{}: service account {ns}/{sa} is not defined in deploy/",
            doc.file
        );
        for volume in spec.volumes.iter().flatten() {
            if let Some(secret) = &volume.secret {
                let name = secret.secret_name.clone().unwrap_or_default();
                assert!(
                    certificate_secrets.contains(&name),
                    "{}: secret {name} is neither defined nor issued by a Certificate",
                    doc.file
                );
            }
        }
        for c in &spec.containers {
            let mounts: BTreeSet<_> = c.volume_mounts.iter().flatten().map(|m| m.name.clone()).collect();
            let volumes: BTreeSet<_> = spec.volumes.iter().flatten().map(|v| v.name.clone()).collect();
            assert!(
                mounts.is_subset(&volumes),
                "{}: {} mounts an undefined volume",
                doc.file,
                c.name
            );
            let ports: BTreeSet<String> = c.ports.iter().flatten().filter_map(|p| p.name.clone()).collect();
            for probe in [&c.liveness_probe, &c.readiness_probe].into_iter().flatten() {
                if let Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(port)) =
                    probe.http_get.as_ref().map(|h| &h.port)
                {
                    assert!(
                        ports.contains(port),
                        "{}: {} probes unknown port {port}",
                        doc.file,
                        c.name
                    );
                }
            }
            assert!(
                c.image.as_deref().is_some_and(|i| i.contains(':')),
                "{}: {} has no image tag",
                doc.file,
                c.name
            );
        }
    }
}

#[test]
fn bindings_reference_existing_roles_and_accounts() {
    let docs = all_docs();
    let defined: BTreeSet<(String, String, String)> = docs
        .iter()
        .map(|d| {
            (
                d.kind().to_string(),
                d.namespace().unwrap_or_default().to_string(),
                d.name().to_string(),
            )
        })
        .collect();
    let check_subjects = |doc: &Doc, subjects: &[Subject]| {
        for s in subjects {
            if s.kind == "ServiceAccount" {
                let ns = s.namespace.clone().unwrap_or_default();
                assert!(
                    defined.contains(&("ServiceAccount".into(), ns.clone(), s.name.clone())),
                    "{}: {} binds service account {ns}/{} that deploy/ does not define",
                    doc.file,
                    doc.name(),
                    s.name
                );
            }
        }
    };
    for doc in docs.iter().filter(|d| d.kind().ends_with("Binding")) {
        let (role_ref, subjects) = if doc.kind() == "ClusterRoleBinding" {
            let b: ClusterRoleBinding = doc.typed();
            (b.role_ref, b.subjects.unwrap_or_default())
        } else {
            let b: RoleBinding = doc.typed();
            (b.role_ref, b.subjects.unwrap_or_default())
        };
        check_subjects(doc, &subjects);
        let ns = if role_ref.kind == "Role" {
            doc.namespace().unwrap_or_default()
        } else {
            ""
        };
        assert!(
            defined.contains(&(role_ref.kind.clone(), ns.to_string(), role_ref.name.clone())),
            "{}: {} refers to {} {} that deploy/ does not define",
            doc.file,
            doc.name(),
            role_ref.kind,
            role_ref.name
        );
    }
}

#[test]
fn webhook_is_wired_to_the_operator() {
    let docs = all_docs();
    let find = |kind: &str, name: &str| {
        docs.iter()
            .find(|d| d.kind() == kind && d.name() == name)
            .unwrap_or_else(|| panic!("deploy/ has no {kind} {name}"))
            .clone()
    };
    let config: ValidatingWebhookConfiguration =
        find("ValidatingWebhookConfiguration", "hostpathprovisioner.kubevirt.io").typed();
    let hook = &config.webhooks.unwrap()[0];
    let svc_ref = hook.client_config.service.clone().unwrap();
    assert_eq!(svc_ref.path.as_deref(), Some(WEBHOOK_PATH));
    assert_eq!(svc_ref.namespace, NAMESPACE);
    let service: Service = find("Service", &svc_ref.name).typed();
    let service_spec = service.spec.unwrap();
    let port = service_spec
        .ports
        .unwrap()
        .into_iter()
        .find(|p| p.port == svc_ref.port.unwrap_or(443))
        .expect("the webhook service port exists");
    // The service selects the operator pod and targets its webhook container port.
    let operator: Deployment = find("Deployment", "hostpath-provisioner-operator").typed();
    let template = operator.spec.unwrap().template;
    let pod_labels = template.metadata.unwrap().labels.unwrap();
    for (k, v) in service_spec.selector.unwrap() {
        assert_eq!(
            pod_labels.get(&k),
            Some(&v),
            "webhook service selector {k}={v} misses the operator pod"
        );
    }
    let pod = template.spec.unwrap();
    let container = &pod.containers[0];
    let target = match port.target_port.unwrap() {
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(p) => p,
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(_) => panic!("numeric target port expected"),
    };
    assert!(
        container.ports.iter().flatten().any(|p| p.container_port == target),
        "the operator container does not expose webhook port {target}"
    );
    // The serving certificate comes from the Certificate the CA is injected from.
    let inject = config.metadata.annotations.unwrap()["cert-manager.io/inject-ca-from"].clone();
    let (cert_ns, cert_name) = inject.split_once('/').unwrap();
    let cert = find("Certificate", cert_name);
    assert_eq!(cert.namespace(), Some(cert_ns));
    let dns: Vec<&str> = cert.value["spec"]["dnsNames"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        dns.contains(&format!("{}.{NAMESPACE}.svc", svc_ref.name).as_str()),
        "{dns:?}"
    );
    let secret = cert.value["spec"]["secretName"].as_str().unwrap();
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.secret.as_ref().and_then(|s| s.secret_name.as_deref()) == Some(secret))
        .expect("the operator mounts the webhook certificate");
    let mount = container
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == volume.name)
        .unwrap();
    assert_eq!(mount.mount_path, WEBHOOK_CERT_DIR);
    // The conversion webhook of the CRD uses the same service.
    let crd = docs
        .iter()
        .find(|d| d.kind() == "CustomResourceDefinition" && d.file.starts_with("deploy/webhook"))
        .expect("deploy/webhook has the CRD with conversion");
    let conversion_service = &crd.value["spec"]["conversion"]["webhook"]["clientConfig"]["service"];
    assert_eq!(conversion_service["name"], svc_ref.name.as_str());
    assert_eq!(conversion_service["namespace"], NAMESPACE);
}

fn operator_env() -> BTreeMap<String, String> {
    let doc = load(&repo().join("deploy/operator/deployment.yaml"))
        .into_iter()
        .find(|d| d.kind() == "Deployment")
        .unwrap();
    let dep: Deployment = doc.typed();
    let container = dep.spec.unwrap().template.spec.unwrap().containers.remove(0);
    container
        .env
        .unwrap_or_default()
        .into_iter()
        .filter_map(|e| e.value.map(|v| (e.name, v)))
        .collect()
}

#[test]
fn operator_runs_locked_down_with_every_image_variable() {
    let env = operator_env();
    for var in IMAGE_VARS {
        assert!(
            env.get(*var).is_some_and(|v| v.contains(':')),
            "operator Deployment lacks a tagged {var}"
        );
    }
    let doc = load(&repo().join("deploy/operator/deployment.yaml"))
        .into_iter()
        .find(|d| d.kind() == "Deployment")
        .unwrap();
    let dep: Deployment = doc.typed();
    let pod = dep.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.security_context.unwrap().run_as_non_root, Some(true));
    for c in pod.containers {
        let sc = c.security_context.expect("operator container security context");
        assert_eq!(sc.read_only_root_filesystem, Some(true), "read-only root filesystem");
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert!(!sc.privileged.unwrap_or(false), "not privileged");
        assert_eq!(sc.capabilities.unwrap().drop, Some(vec!["ALL".to_string()]));
    }
}

#[test]
fn only_node_plugins_are_privileged() {
    for (doc, template, _) in pod_templates(&all_docs()) {
        for c in template.spec.unwrap().containers {
            let privileged = c.security_context.and_then(|s| s.privileged).unwrap_or(false);
            if privileged {
                // The CSI driver and its registrar on every node; the legacy provisioners, which
                // create and label directories on the host for other users' pods.
                let node_plugin = matches!(
                    c.name.as_str(),
                    "hostpath-provisioner" | "node-driver-registrar" | "hpp-provisioner"
                );
                assert!(node_plugin, "{}: container {} is privileged", doc.file, c.name);
            }
        }
    }
}

#[test]
fn storage_classes_name_known_provisioners_and_pools() {
    let docs = all_docs();
    let pools: BTreeSet<String> = docs
        .iter()
        .filter(|d| d.kind() == "HostPathProvisioner")
        .flat_map(|d| {
            d.typed::<hpp_api::HostPathProvisioner>()
                .spec
                .storage_pools
                .unwrap_or_default()
        })
        .map(|p| p.name)
        .chain([hpp_api::constants::DEFAULT_POOL_NAME.to_string()])
        .collect();
    let mut csi_classes = 0;
    for doc in docs.iter().filter(|d| d.kind() == "StorageClass") {
        let sc: StorageClass = doc.typed();
        if sc.provisioner == DRIVER_NAME {
            csi_classes += 1;
            let pool = sc.parameters.unwrap_or_default().get(PARAM_STORAGE_POOL).cloned();
            let pool = pool.unwrap_or_else(|| hpp_api::constants::DEFAULT_POOL_NAME.to_string());
            assert!(
                pools.contains(&pool),
                "{}: pool {pool} is not defined by any example CR",
                doc.file
            );
        } else if doc.file.starts_with("deploy/storageclass") {
            assert_eq!(sc.provisioner, LEGACY_PROVISIONER_NAME, "{}", doc.file);
        }
    }
    assert!(csi_classes >= 3, "{csi_classes}");
    for doc in docs.iter().filter(|d| d.kind() == "VolumeSnapshotClass") {
        let pool = doc.value["parameters"][PARAM_STORAGE_POOL].as_str().unwrap();
        assert!(pools.contains(pool), "{}: pool {pool} is not defined", doc.file);
    }
}

/// What the operator would create for `example` with the images the operator Deployment sets.
fn rendered(example: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(repo().join("deploy/examples").join(example)).unwrap();
    let hpp: hpp_api::HostPathProvisioner = serde_saphyr::from_str(&text).unwrap();
    let mut env = operator_env();
    env.insert("POD_NAMESPACE".into(), NAMESPACE.into());
    let cfg = OperatorConfig::from_env(env);
    let nodes = ["node01".to_string(), "node02".to_string()];
    let facts: ClusterFacts = hpp_reconcile::render::offline_facts(&hpp, &nodes, true, true);
    let yaml = hpp_reconcile::render::render_yaml(&Pipeline::standard(), &hpp, &cfg, &facts).unwrap();
    serde_saphyr::from_str_multiple(&yaml).unwrap()
}

const EXAMPLES: &[&str] = &[
    "hostpathprovisioner_cr.yaml",
    "hostpathprovisioner_legacy_cr.yaml",
    "hostpathprovisioner_pvctemplate_cr.yaml",
    "hostpathprovisioner_overlay_csi_cr.yaml",
];

#[test]
fn rendered_objects_match_deploy() {
    let env = operator_env();
    let images: BTreeSet<&str> = IMAGE_VARS.iter().map(|v| env[*v].as_str()).collect();
    let standalone_driver: CSIDriver = load(&repo().join("deploy/csi/csidriver.yaml"))[0].typed();
    let standalone_ds = &pod_templates(&load(&repo().join("deploy/csi/daemonset.yaml")))[0].1;
    let registration = |containers: &[k8s_openapi::api::core::v1::Container]| {
        containers
            .iter()
            .flat_map(|c| c.args.iter().flatten())
            .find(|a| a.starts_with("--kubelet-registration-path="))
            .cloned()
            .expect("registration path")
    };
    let standalone_registration = registration(&standalone_ds.spec.as_ref().unwrap().containers);
    let operator_rbac = load(&repo().join("deploy/operator/rbac.yaml"));
    let operator_sa = operator_rbac.iter().find(|d| d.kind() == "ServiceAccount").unwrap();
    assert_eq!(operator_sa.namespace(), Some(NAMESPACE));

    for example in EXAMPLES {
        let objects = rendered(example);
        assert!(objects.len() >= 7, "{example}: {} objects", objects.len());
        let mut names = BTreeSet::new();
        for obj in &objects {
            let kind = obj["kind"].as_str().unwrap();
            let name = obj["metadata"]["name"].as_str().unwrap();
            assert!(
                names.insert((kind.to_string(), name.to_string())),
                "{example}: {kind} {name} twice"
            );
            if let Some(ns) = obj["metadata"]["namespace"].as_str() {
                assert_eq!(ns, NAMESPACE, "{example}: {kind} {name} outside the install namespace");
            }
            // Every image comes from the operator Deployment's variables.
            for path in ["/spec/template/spec/containers", "/spec/template/spec/initContainers"] {
                for c in obj.pointer(path).and_then(Value::as_array).into_iter().flatten() {
                    let image = c["image"].as_str().unwrap();
                    assert!(images.contains(image), "{example}: {kind} {name} uses image {image}");
                }
            }
        }
        let by_kind = |k: &'static str| objects.iter().filter(move |o| o["kind"] == k);
        let driver: CSIDriver = serde_json::from_value(by_kind("CSIDriver").next().unwrap().clone()).unwrap();
        assert_eq!(driver.metadata.name.as_deref(), Some(DRIVER_NAME));
        assert_eq!(
            driver.spec, standalone_driver.spec,
            "{example}: deploy/csi/csidriver.yaml differs from the operator's"
        );
        let ds: DaemonSet = serde_json::from_value(
            by_kind("DaemonSet")
                .find(|o| o["metadata"]["name"] == "hostpath-provisioner-csi")
                .unwrap()
                .clone(),
        )
        .unwrap();
        let pod = ds.spec.unwrap().template.spec.unwrap();
        assert_eq!(registration(&pod.containers), standalone_registration, "{example}");
        // Both expand node-local volumes on their node, with one leader-elected resizer.
        for containers in [&pod.containers, &standalone_ds.spec.as_ref().unwrap().containers] {
            let has = |name: &str, arg: &str| {
                containers
                    .iter()
                    .find(|c| c.name == name)
                    .is_some_and(|c| c.args.iter().flatten().any(|a| a == arg))
            };
            assert!(has("hostpath-provisioner", "--expansion=node"), "{example}");
            assert!(has("csi-resizer", "--leader-election"), "{example}");
        }
        // Every service account a rendered binding or pod uses is rendered too.
        let accounts: BTreeSet<&str> = by_kind("ServiceAccount")
            .filter_map(|o| o["metadata"]["name"].as_str())
            .collect();
        assert!(accounts.contains(pod.service_account_name.as_deref().unwrap()));
        for binding in by_kind("ClusterRoleBinding").chain(by_kind("RoleBinding")) {
            for s in binding["subjects"].as_array().into_iter().flatten() {
                if s["kind"] == "ServiceAccount" && s["namespace"] == NAMESPACE {
                    assert!(accounts.contains(s["name"].as_str().unwrap()), "{example}: {s}");
                }
            }
        }
    }
}

/// The binaries a Containerfile installs (`COPY ... /usr/bin/NAME` of a prebuilt hpp-bin
/// executable), by install path. Base images are `ARG` defaults and must be pinned by tag.
fn containerfile_binaries(name: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(repo().join("images").join(name)).unwrap();
    let built: BTreeSet<String> = text
        .lines()
        .filter(|l| l.trim_start().starts_with("COPY ") && !l.contains("--from="))
        .filter_map(|l| l.split_whitespace().last()?.strip_prefix("/usr/bin/"))
        .map(str::to_string)
        .collect();
    let bins = std::fs::read_to_string(repo().join("hpp-bin/Cargo.toml")).unwrap();
    for b in &built {
        assert!(
            bins.contains(&format!("name = \"{b}\"")),
            "{name} installs {b}, which hpp-bin does not define"
        );
    }
    let arg_default = |var: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("ARG {var}=")))
            .unwrap_or_else(|| panic!("{name}: no default for ARG {var}"))
            .to_string()
    };
    for line in text.lines().filter(|l| l.trim_start().starts_with("FROM ")) {
        let image = line.split_whitespace().nth(1).unwrap();
        let image = match image.strip_prefix("${").and_then(|v| v.strip_suffix('}')) {
            Some(var) => arg_default(var),
            None => image.to_string(),
        };
        let tag = image.rsplit_once(':').map(|(_, t)| t).unwrap_or_default();
        assert!(
            !tag.is_empty() && !image.contains('@'),
            "{name}: base image {image} must be pinned by tag"
        );
        let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
        assert!(
            readme.contains(&image),
            "{name}: base image {image} is not documented in README.md"
        );
    }
    built.into_iter().map(|b| format!("/usr/bin/{b}")).collect()
}

#[test]
fn images_ship_the_binaries_the_manifests_run() {
    let operator_image = containerfile_binaries("Containerfile.operator");
    let driver_image = containerfile_binaries("Containerfile.csi-driver");
    assert!(operator_image.contains("/usr/bin/hpp-operator"));
    assert!(driver_image.contains("/usr/bin/hpp-csi-driver"));
    // Commands the operator puts into the pods it creates.
    for example in EXAMPLES {
        for obj in rendered(example) {
            for c in obj
                .pointer("/spec/template/spec/containers")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let Some(command) = c["command"][0].as_str() else {
                    continue;
                };
                let image = c["image"].as_str().unwrap();
                let env = operator_env();
                let shipped = if image == env["OPERATOR_IMAGE"] {
                    &operator_image
                } else if image == env["CSI_PROVISIONER_IMAGE"] || image == env["PROVISIONER_IMAGE"] {
                    &driver_image
                } else {
                    continue;
                };
                assert!(
                    shipped.contains(command),
                    "{example}: {command} is not in the image {image}"
                );
            }
        }
    }
    // Commands in the hand-written manifests.
    for (doc, template, _) in pod_templates(&all_docs()) {
        for c in template.spec.unwrap().containers {
            let image = c.image.unwrap_or_default();
            let shipped = if image.contains("hpp-operator") {
                &operator_image
            } else if image.contains("hpp-csi-driver") {
                &driver_image
            } else {
                continue;
            };
            if let Some(command) = c.command.as_ref().and_then(|c| c.first()) {
                assert!(shipped.contains(command), "{}: {command} is not in {image}", doc.file);
            }
        }
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &to.join(entry.file_name()));
        } else {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

/// Pointing deploy/ at another registry is one edit of its `images:`: the operator container and
/// the operator's image variables (the images of the pods it creates) all follow.
#[test]
fn kustomize_images_reach_the_operator_image_variables() {
    if std::process::Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_err()
    {
        eprintln!("SKIPPED kustomize_images_reach_the_operator_image_variables: kubectl is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let deploy = dir.path().join("deploy");
    copy_dir(&repo().join("deploy"), &deploy);
    let k = deploy.join("kustomization.yaml");
    let text = std::fs::read_to_string(&k).unwrap();
    assert_eq!(text.matches("newName: ghcr.io/hpp-project/").count(), 2, "{text}");
    std::fs::write(
        &k,
        text.replace("newName: ghcr.io/hpp-project/", "newName: registry.example/mirror/")
            .replace("newTag: latest", "newTag: v9"),
    )
    .unwrap();
    let out = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(&deploy)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let docs: Vec<Value> = serde_saphyr::from_str_multiple(&String::from_utf8_lossy(&out.stdout)).unwrap();
    let operator = docs
        .iter()
        .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "hostpath-provisioner-operator")
        .unwrap();
    let container = &operator["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "registry.example/mirror/hpp-operator:v9");
    let env = |name: &str| {
        container["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .unwrap()["value"]
            .clone()
    };
    assert_eq!(env("OPERATOR_IMAGE"), "registry.example/mirror/hpp-operator:v9");
    assert_eq!(
        env("CSI_PROVISIONER_IMAGE"),
        "registry.example/mirror/hpp-csi-driver:v9"
    );
    assert_eq!(env("PROVISIONER_IMAGE"), "registry.example/mirror/hpp-csi-driver:v9");
}
