//! Adoption against the fake API server (with claim in-use protection on): every recognised
//! source adopted in place, every refusal, a crash between every two steps followed by a second
//! run, undoing, waiting for a held claim, and a second run that does nothing.
//!
//! The old PVs are the shapes the provisioners write (see `hpp_reconcile::adopt::source` for
//! the code each is copied from); their directories sit in hpp pool directories, as they do
//! when the provisioner was configured with a pool's `<path>/csi` as its base, or after
//! `--moved`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::time::Duration;

use hpp_api::HostPathProvisioner;
use hpp_api::constants as c;
use hpp_reconcile::adopt::{self, Reason, RunOptions, Scope, Status, keys};
use hpp_testkit::FakeApiServer;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use kube::ResourceExt;
use serde_json::{Value, json};

const APPS: &str = "apps";

fn cr(spec: Value) -> HostPathProvisioner {
    serde_json::from_value(json!({
        "apiVersion": "hostpathprovisioner.kubevirt.io/v1beta1", "kind": "HostPathProvisioner",
        "metadata": {"name": "hostpath-provisioner"}, "spec": spec,
    }))
    .unwrap()
}

/// The pools of most tests: `local` (node-local, `/srv/hpp/csi`), `shared` (one ReadWriteMany
/// claim, `/mnt/cephfs/hpp/csi`), `fast` (btrfs quota, `/srv/fast/csi`), `bare` (no class).
fn standard_cr() -> HostPathProvisioner {
    cr(json!({"imagePullPolicy": "IfNotPresent", "storagePools": [
        {"name": "local", "path": "/srv/hpp"},
        {"name": "shared", "path": "/mnt/cephfs/hpp",
         "pvcTemplate": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "100Gi"}}}},
        {"name": "fast", "path": "/srv/fast", "quota": "btrfs"},
        {"name": "bare", "path": "/srv/bare"},
    ]}))
}

fn class(name: &str, provisioner: &str, params: Value) -> StorageClass {
    serde_json::from_value(
        json!({"metadata": {"name": name}, "provisioner": provisioner, "parameters": params,
                                  "reclaimPolicy": "Delete", "volumeBindingMode": "WaitForFirstConsumer"}),
    )
    .unwrap()
}

/// node-a (hostname label = name), node-b (hostname label `b.example.com`, as
/// local-path-provisioner issue #68 describes), both running hpp's driver, and node-c without it.
fn cluster_with(cr: HostPathProvisioner) -> FakeApiServer {
    let fake = FakeApiServer::new();
    fake.register::<HostPathProvisioner>(false, true);
    fake.protect_claims_in_use();
    fake.seed(&cr);
    for (name, hostname, driver) in [
        ("node-a", "node-a", true),
        ("node-b", "b.example.com", true),
        ("node-c", "node-c", false),
    ] {
        fake.seed::<Node>(
            &serde_json::from_value(
                json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": hostname}}}),
            )
            .unwrap(),
        );
        let drivers = if driver {
            json!([{"name": c::DRIVER_NAME, "nodeID": name}])
        } else {
            json!([])
        };
        fake.seed::<CSINode>(
            &serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"drivers": drivers}})).unwrap(),
        );
    }
    fake.seed(&class("hostpath-csi", c::DRIVER_NAME, json!({"storagePool": "local"})));
    fake.seed(&class(
        "hpp-shared",
        c::DRIVER_NAME,
        json!({"storagePool": "shared", "overlayCSI": "true"}),
    ));
    fake.seed(&class("hpp-fast", c::DRIVER_NAME, json!({"storagePool": "fast"})));
    fake.seed(&class("local-path", "rancher.io/local-path", json!({})));
    fake
}

fn cluster() -> FakeApiServer {
    cluster_with(standard_cr())
}

fn hostname_affinity(value: &str) -> Value {
    json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": [value]}]}]}})
}

/// KubeVirt's legacy provisioner (`cmd/provisioner/hostpath-provisioner.go`, `Provision`), its
/// `PV_DIR` set to the `local` pool's directory.
fn kubevirt_legacy_pv(name: &str, node: &str) -> Value {
    json!({
        "metadata": {"name": name, "annotations": {
            "hostPathProvisionerIdentity": "kubevirt.io/hostpath-provisioner",
            "kubevirt.io/provisionOnNode": node,
            "pv.kubernetes.io/provisioned-by": "kubevirt.io/hostpath-provisioner"}},
        "spec": {"persistentVolumeReclaimPolicy": "Delete", "accessModes": ["ReadWriteOnce"],
                 "capacity": {"storage": "10Gi"}, "hostPath": {"path": format!("/srv/hpp/csi/{name}")},
                 "nodeAffinity": hostname_affinity(node), "storageClassName": "kubevirt-hostpath-provisioner"},
    })
}

/// rancher's local-path-provisioner (`provisioner.go`, `provisionFor`) with `volumeType: local`
/// and its `nodePath` set to the `local` pool's directory, on node-b.
fn local_path_pv(name: &str, claim: &str) -> Value {
    json!({
        "metadata": {"name": name, "annotations": {
            "local.path.provisioner/selected-node": "node-b",
            "pv.kubernetes.io/provisioned-by": "rancher.io/local-path"}},
        "spec": {"persistentVolumeReclaimPolicy": "Delete", "accessModes": ["ReadWriteOnce"],
                 "volumeMode": "Filesystem", "capacity": {"storage": "2Gi"},
                 "local": {"path": format!("/srv/hpp/csi/{name}_{APPS}_{claim}")},
                 "nodeAffinity": hostname_affinity("b.example.com"), "storageClassName": "local-path"},
    })
}

/// OpenEBS LocalPV hostpath (`provisioner_hostpath.go`, `ProvisionHostPath`) with its
/// `BasePath` set to the `local` pool's directory.
fn openebs_pv(name: &str) -> Value {
    json!({
        "metadata": {"name": name, "labels": {"openebs.io/cas-type": "local-hostpath"},
                     "annotations": {"pv.kubernetes.io/provisioned-by": "openebs.io/local"}},
        "spec": {"persistentVolumeReclaimPolicy": "Delete", "accessModes": ["ReadWriteOnce"],
                 "volumeMode": "Filesystem", "capacity": {"storage": "5Gi"},
                 "local": {"path": format!("/srv/hpp/csi/{name}")},
                 "nodeAffinity": hostname_affinity("node-a"), "storageClassName": "openebs-hostpath"},
    })
}

/// torchbox's shared provisioner (`hostpath-provisioner.go`, `Provision`), its `pvDir` the
/// shared pool's directory: no node affinity, ReadWriteMany.
fn torchbox_pv(name: &str) -> Value {
    json!({
        "metadata": {"name": name, "annotations": {
            "torchbox.com/hostpath-provisioner-id": "torchbox.com/hostpath",
            "pv.kubernetes.io/provisioned-by": "torchbox.com/hostpath"}},
        "spec": {"persistentVolumeReclaimPolicy": "Delete", "accessModes": ["ReadWriteMany"],
                 "capacity": {"storage": "1Gi"}, "hostPath": {"path": format!("/mnt/cephfs/hpp/csi/{name}")},
                 "storageClassName": "cephfs"},
    })
}

/// A hand-made hostPath PV on node-a.
fn manual_pv(name: &str, path: &str) -> Value {
    json!({
        "metadata": {"name": name},
        "spec": {"persistentVolumeReclaimPolicy": "Retain", "accessModes": ["ReadWriteOnce"],
                 "capacity": {"storage": "1Gi"}, "hostPath": {"path": path, "type": "Directory"},
                 "nodeAffinity": hostname_affinity("node-a"), "storageClassName": "manual"},
    })
}

/// Seeds claim `name` in `apps` bound to `pv` (as the PV controller leaves a pair), and the PV.
fn seed_bound(fake: &FakeApiServer, name: &str, mut pv: Value) -> PersistentVolumeClaim {
    let spec = &pv["spec"];
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": APPS, "labels": {"app": name},
                     "annotations": {"pv.kubernetes.io/bind-completed": "yes", "pv.kubernetes.io/bound-by-controller": "yes",
                                     "volume.kubernetes.io/storage-provisioner": "someone", "team": "storage"}},
        "spec": {"accessModes": spec["accessModes"], "storageClassName": spec["storageClassName"],
                 "volumeName": pv["metadata"]["name"], "volumeMode": "Filesystem",
                 "resources": {"requests": {"storage": spec["capacity"]["storage"]}}},
        "status": {"phase": "Bound", "accessModes": spec["accessModes"], "capacity": spec["capacity"]},
    }))
    .unwrap();
    let claim = fake.seed(&claim);
    pv["spec"]["claimRef"] = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": APPS,
                                    "name": name, "uid": claim.metadata.uid});
    pv["status"] = json!({"phase": "Bound"});
    fake.seed::<PersistentVolume>(&serde_json::from_value(pv).unwrap());
    claim
}

fn run_opts() -> RunOptions {
    RunOptions {
        claim_wait: Duration::ZERO,
        poll: Duration::from_millis(10),
        ..RunOptions::default()
    }
}

async fn dry_run(fake: &FakeApiServer, scope: &Scope) -> adopt::Report {
    adopt::plan(&fake.client(), scope).await.unwrap().report()
}

async fn real_run(fake: &FakeApiServer, scope: &Scope, max_steps: Option<usize>) -> adopt::Report {
    let survey = adopt::plan(&fake.client(), scope).await.unwrap();
    adopt::adopt(
        &fake.client(),
        &survey,
        &RunOptions {
            max_steps,
            ..run_opts()
        },
    )
    .await
}

fn row<'a>(report: &'a adopt::Report, claim: &str) -> &'a adopt::Row {
    report
        .claims
        .iter()
        .find(|r| r.found.claim == claim)
        .unwrap_or_else(|| panic!("no row for {claim}: {report:#?}"))
}

fn reasons(report: &adopt::Report, claim: &str) -> Vec<Reason> {
    row(report, claim).found.refusals.iter().map(|r| r.reason).collect()
}

fn pv(fake: &FakeApiServer, name: &str) -> Option<PersistentVolume> {
    fake.get::<PersistentVolume>(None, name)
}

fn claim(fake: &FakeApiServer, name: &str) -> Option<PersistentVolumeClaim> {
    fake.get::<PersistentVolumeClaim>(Some(APPS), name)
}

fn events(fake: &FakeApiServer, reason: &str) -> Vec<Event> {
    fake.list::<Event>()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

fn seed_sources(fake: &FakeApiServer) {
    seed_bound(
        fake,
        "vm-disk",
        kubevirt_legacy_pv("pvc-11111111-0000-4000-8000-000000000001", "node-a"),
    );
    seed_bound(
        fake,
        "cache",
        local_path_pv("pvc-22222222-0000-4000-8000-000000000002", "cache"),
    );
    seed_bound(fake, "db", openebs_pv("pvc-33333333-0000-4000-8000-000000000003"));
    seed_bound(fake, "media", torchbox_pv("pvc-44444444-0000-4000-8000-000000000004"));
    seed_bound(fake, "manual", manual_pv("manual-data", "/srv/hpp/csi/manual-data"));
}

/// What the dry run says about each recognised source, then the real run: each claim bound to
/// a CSI PV of hpp's driver for the same directory, its labels and annotations kept, the old PV
/// gone, an `Adopted` Event, and the old reclaim policy on the new PV.
#[tokio::test]
async fn every_recognised_source_is_adopted_in_place() {
    let fake = cluster();
    seed_sources(&fake);
    let scope = Scope::default();
    let plan = dry_run(&fake, &scope).await;
    let expect = [
        (
            "vm-disk",
            "kubevirt-legacy",
            Some("node-a"),
            "/srv/hpp/csi/pvc-11111111-0000-4000-8000-000000000001",
            "local",
            "hostpath-csi",
        ),
        (
            "cache",
            "local-path-provisioner",
            Some("node-b"),
            "/srv/hpp/csi/pvc-22222222-0000-4000-8000-000000000002_apps_cache",
            "local",
            "hostpath-csi",
        ),
        (
            "db",
            "openebs-hostpath",
            Some("node-a"),
            "/srv/hpp/csi/pvc-33333333-0000-4000-8000-000000000003",
            "local",
            "hostpath-csi",
        ),
        (
            "media",
            "torchbox",
            None,
            "/mnt/cephfs/hpp/csi/pvc-44444444-0000-4000-8000-000000000004",
            "shared",
            "hpp-shared",
        ),
        (
            "manual",
            "hostpath",
            Some("node-a"),
            "/srv/hpp/csi/manual-data",
            "local",
            "hostpath-csi",
        ),
    ];
    for (name, source, node, dir, pool, class) in expect {
        let r = row(&plan, name);
        assert_eq!(r.status, Status::Adoptable, "{name}: {r:#?}");
        assert_eq!(r.found.source.unwrap().as_str(), source, "{name}");
        assert_eq!(r.found.node.as_deref(), node, "{name}");
        assert_eq!(r.found.directory.as_deref(), Some(dir), "{name}");
        assert_eq!(r.found.pool.as_deref(), Some(pool), "{name}");
        assert_eq!(
            r.found.volume_id.as_deref(),
            dir.rsplit('/').next(),
            "{name}: the directory's own name"
        );
        assert_eq!(r.found.storage_class.as_deref(), Some(class), "{name}");
    }
    assert!(fake.write_requests().is_empty(), "a dry run writes nothing");
    assert_eq!(plan.summary, "adopt (dry run, nothing changed): 5 Adoptable (5 claims)");

    let report = real_run(&fake, &scope, None).await;
    assert_eq!(report.summary, "adopt: 5 Adopted (5 claims)", "{report:#?}");
    assert!(!report.has_problems());
    for (name, _, node, dir, pool, class) in expect {
        let r = row(&report, name);
        let old = r.found.pv.clone();
        let new_name = format!("{old}-hpp");
        assert!(pv(&fake, &old).is_none(), "{name}: the old PV is gone");
        let new = pv(&fake, &new_name).unwrap();
        let spec = new.spec.clone().unwrap();
        let csi = spec.csi.clone().unwrap();
        assert_eq!(csi.driver, c::DRIVER_NAME);
        assert_eq!(csi.volume_handle, dir.rsplit('/').next().unwrap());
        let attributes = csi.volume_attributes.unwrap();
        assert_eq!(attributes[c::PARAM_STORAGE_POOL], pool);
        assert_eq!(attributes["csi.storage.k8s.io/pvc/name"], name);
        assert_eq!(spec.storage_class_name.as_deref(), Some(class));
        let pinned: Option<Vec<String>> = spec.node_affinity.and_then(|a| a.required).map(|r| {
            r.node_selector_terms[0].match_expressions.clone().unwrap()[0]
                .values
                .clone()
                .unwrap()
        });
        match node {
            Some(n) => assert_eq!(
                pinned,
                Some(vec![n.to_owned()]),
                "{name}: pinned by node name on the driver's key"
            ),
            None => assert_eq!(pinned, None, "{name}: a shared pool's volume is not pinned"),
        }
        let old_policy = if name == "manual" { "Retain" } else { "Delete" };
        assert_eq!(
            spec.persistent_volume_reclaim_policy.as_deref(),
            Some(old_policy),
            "{name}"
        );
        assert_eq!(new.annotations()[keys::STATE], keys::STATE_ADOPTED);
        assert!(!new.annotations().contains_key(keys::CLAIM_TEMPLATE));
        assert_eq!(new.annotations()[c::ANNOTATION_PROVISIONED_BY], c::DRIVER_NAME);

        let pvc = claim(&fake, name).unwrap();
        let pvc_spec = pvc.spec.clone().unwrap();
        assert_eq!(pvc_spec.volume_name.as_deref(), Some(new_name.as_str()));
        assert_eq!(pvc_spec.storage_class_name.as_deref(), Some(class));
        assert_eq!(pvc.labels()["app"], name);
        let ann = pvc.annotations();
        assert_eq!(ann["team"], "storage");
        assert_eq!(ann[keys::ADOPTED_FROM], old);
        assert!(!ann.contains_key("pv.kubernetes.io/bind-completed"));
        assert!(!ann.contains_key("volume.kubernetes.io/storage-provisioner"));
        assert_eq!(
            spec.claim_ref.unwrap().name.as_deref(),
            Some(name),
            "{name}: the PV is pre-bound to the claim"
        );
    }
    let adopted = events(&fake, adopt::REASON_ADOPTED);
    assert_eq!(adopted.len(), 5, "{adopted:#?}");
    let note = adopted
        .iter()
        .find(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("cache"))
        .and_then(|e| e.note.clone())
        .unwrap();
    assert!(
        note.contains("local-path-provisioner") && note.contains("no data was copied"),
        "{note}"
    );
}

/// A second run after a complete one finds nothing to do and writes nothing, not even Events.
#[tokio::test]
async fn a_second_run_does_nothing() {
    let fake = cluster();
    seed_sources(&fake);
    let first = real_run(&fake, &Scope::default(), None).await;
    assert_eq!(first.claims.len(), 5);
    let before: Vec<(String, String)> = fake
        .list::<PersistentVolume>()
        .iter()
        .map(|p| (p.name_any(), p.resource_version().unwrap()))
        .collect();
    fake.clear_requests();
    let again = real_run(&fake, &Scope::default(), None).await;
    assert!(again.claims.is_empty(), "{again:#?}");
    assert_eq!(again.summary, "adopt: nothing to adopt (0 claims)");
    assert!(fake.write_requests().is_empty(), "{:#?}", fake.write_requests());
    let after: Vec<(String, String)> = fake
        .list::<PersistentVolume>()
        .iter()
        .map(|p| (p.name_any(), p.resource_version().unwrap()))
        .collect();
    assert_eq!(before, after);
}

/// Every reason a claim is refused, each on a claim of its own; a real run changes none of them
/// and records `AdoptionFailed` on each.
#[tokio::test]
async fn every_refusal_is_reported_and_nothing_refused_is_touched() {
    let fake = cluster();
    let pvc = |name: &str| kubevirt_legacy_pv(name, "node-a");
    let with = |mut pv: Value, pointer: &str, value: Value| {
        *pv.pointer_mut(pointer).unwrap() = value;
        pv
    };
    // Not Bound: the PV was released.
    let released = seed_bound(&fake, "released", pvc("pvc-released"));
    let _ = released;
    fake.set_status::<PersistentVolume>(None, "pvc-released", json!({"phase": "Released"}));
    // Being deleted (held by a pod): deleting it is someone else's business.
    seed_bound(&fake, "deleting", pvc("pvc-deleting"));
    fake.seed::<Pod>(&pod("user-of-deleting", "deleting"));
    assert!(fake.remove::<PersistentVolumeClaim>(Some(APPS), "deleting"));
    // Not a directory: NFS.
    seed_bound(
        &fake,
        "nfs",
        json!({"metadata": {"name": "pv-nfs"}, "spec": {"accessModes": ["ReadWriteMany"], "capacity": {"storage": "1Gi"},
               "nfs": {"server": "nfs.example.com", "path": "/export"}, "storageClassName": "nfs"}}),
    );
    // Block.
    seed_bound(
        &fake,
        "block",
        with(openebs_pv("pvc-block"), "/spec/volumeMode", json!("Block")),
    );
    // Bad path.
    seed_bound(
        &fake,
        "badpath",
        with(pvc("pvc-badpath"), "/spec/hostPath/path", json!("/srv/hpp/csi/../x")),
    );
    // No pool: local-path-provisioner's default path.
    seed_bound(
        &fake,
        "nopool",
        with(
            local_path_pv("pvc-nopool", "nopool"),
            "/spec/local/path",
            json!("/opt/local-path-provisioner/pvc-nopool_apps_nopool"),
        ),
    );
    // Nested in a pool (a pathPattern of namespace/claim).
    seed_bound(
        &fake,
        "nested",
        with(
            pvc("pvc-nested"),
            "/spec/hostPath/path",
            json!("/srv/hpp/csi/apps/nested"),
        ),
    );
    // Beside a pool's directory.
    seed_bound(
        &fake,
        "beside",
        with(pvc("pvc-beside"), "/spec/hostPath/path", json!("/srv/hpp/pvc-beside")),
    );
    // The pool directory itself.
    seed_bound(
        &fake,
        "holds",
        with(pvc("pvc-holds"), "/spec/hostPath/path", json!("/srv/hpp/csi")),
    );
    // A name the driver cannot serve.
    seed_bound(
        &fake,
        "hidden",
        with(pvc("pvc-hidden"), "/spec/hostPath/path", json!("/srv/hpp/csi/.hidden")),
    );
    // A quota pool.
    seed_bound(
        &fake,
        "quota",
        with(
            pvc("pvc-quota"),
            "/spec/hostPath/path",
            json!("/srv/fast/csi/pvc-quota"),
        ),
    );
    // No node: hand-made, no affinity.
    let mut unpinned = manual_pv("pv-unpinned", "/srv/hpp/csi/pv-unpinned");
    unpinned["spec"].as_object_mut().unwrap().remove("nodeAffinity");
    seed_bound(&fake, "unpinned", unpinned.clone());
    // RWX across nodes into a node-local pool.
    let mut rwx = with(unpinned, "/spec/accessModes", json!(["ReadWriteMany"]));
    rwx["metadata"]["name"] = json!("pv-rwx");
    rwx["spec"]["hostPath"]["path"] = json!("/srv/hpp/csi/pv-rwx");
    seed_bound(&fake, "rwx", rwx);
    // A node without hpp's driver.
    seed_bound(&fake, "nodriver", kubevirt_legacy_pv("pvc-nodriver", "node-c"));
    // A pool no class serves.
    seed_bound(
        &fake,
        "noclass",
        with(
            pvc("pvc-noclass"),
            "/spec/hostPath/path",
            json!("/srv/bare/csi/pvc-noclass"),
        ),
    );
    // In use.
    seed_bound(&fake, "inuse", pvc("pvc-inuse"));
    fake.seed::<Pod>(&pod("web-0", "inuse"));
    // A request the PV cannot hold.
    seed_bound(&fake, "toolarge", pvc("pvc-toolarge"));
    let mut bigger = claim(&fake, "toolarge").unwrap();
    bigger.spec.as_mut().unwrap().resources.as_mut().unwrap().requests = Some(
        [(
            "storage".to_owned(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("20Gi".into()),
        )]
        .into(),
    );
    fake.seed(&bigger);
    // A volume id an hpp PV already serves on that node.
    seed_bound(&fake, "taken", pvc("pvc-taken"));
    fake.seed::<PersistentVolume>(
        &serde_json::from_value(json!({"metadata": {"name": "pvc-other"}, "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "csi": {"driver": c::DRIVER_NAME, "volumeHandle": "pvc-taken", "volumeAttributes": {"storagePool": "local"}},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": c::TOPOLOGY_KEY, "operator": "In", "values": ["node-a"]}]}]}}}}))
        .unwrap(),
    );
    // Two claims of one directory.
    seed_bound(
        &fake,
        "twin-1",
        with(pvc("pvc-twin-1"), "/spec/hostPath/path", json!("/srv/hpp/csi/twin")),
    );
    seed_bound(
        &fake,
        "twin-2",
        with(pvc("pvc-twin-2"), "/spec/hostPath/path", json!("/srv/hpp/csi/twin")),
    );
    // The new PV's name is taken.
    seed_bound(&fake, "named", pvc("pvc-named"));
    fake.seed::<PersistentVolume>(&serde_json::from_value(manual_pv("pvc-named-hpp", "/elsewhere")).unwrap());

    let plan = dry_run(&fake, &Scope::default()).await;
    let expect = [
        ("released", Reason::NotBound),
        ("deleting", Reason::BeingDeleted),
        ("nfs", Reason::NotADirectory),
        ("block", Reason::BlockVolume),
        ("badpath", Reason::BadPath),
        ("nopool", Reason::NoPool),
        ("nested", Reason::MoveFirst),
        ("beside", Reason::MoveFirst),
        ("holds", Reason::HoldsPool),
        ("hidden", Reason::InvalidVolumeId),
        ("quota", Reason::QuotaPool),
        ("unpinned", Reason::NoNode),
        ("rwx", Reason::RwxAcrossNodes),
        ("nodriver", Reason::DriverNotOnNode),
        ("noclass", Reason::NoStorageClass),
        ("inuse", Reason::InUse),
        ("toolarge", Reason::RequestTooLarge),
        ("taken", Reason::VolumeIdTaken),
        ("twin-1", Reason::SameVolume),
        ("twin-2", Reason::SameVolume),
        ("named", Reason::PvNameTaken),
    ];
    for (name, reason) in expect {
        let r = row(&plan, name);
        assert_eq!(r.status, Status::Refused, "{name}: {r:#?}");
        assert!(
            reasons(&plan, name).contains(&reason),
            "{name}: {:#?}",
            r.found.refusals
        );
    }
    assert_eq!(plan.claims.len(), expect.len(), "one row per claim: {plan:#?}");
    // The messages say what to do.
    let inuse = &row(&plan, "inuse").found.refusals[0].message;
    assert!(inuse.contains("web-0") && inuse.contains("scale"), "{inuse}");
    let beside = row(&plan, "beside").found.refusals[0].message.clone();
    assert!(
        beside.contains("mv /srv/hpp/pvc-beside /srv/hpp/csi/pvc-beside") && beside.contains(keys::MOVED_TO),
        "{beside}"
    );
    let nopool = row(&plan, "nopool").found.refusals[0].message.clone();
    assert!(nopool.contains("local (/srv/hpp/csi)"), "{nopool}");

    let before: Vec<PersistentVolume> = fake.list();
    let claims_before: Vec<PersistentVolumeClaim> = fake.list();
    fake.clear_requests();
    let report = real_run(&fake, &Scope::default(), None).await;
    assert!(report.claims.iter().all(|r| r.status == Status::Refused), "{report:#?}");
    assert!(report.has_problems());
    let writes: Vec<String> = fake
        .write_requests()
        .iter()
        .filter(|r| !r.path.contains("/events"))
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert!(writes.is_empty(), "refused claims are not touched: {writes:#?}");
    assert_eq!(fake.list::<PersistentVolume>(), before);
    assert_eq!(fake.list::<PersistentVolumeClaim>(), claims_before);
    let failed = events(&fake, adopt::REASON_ADOPTION_FAILED);
    assert_eq!(failed.len(), expect.len(), "{failed:#?}");
    assert!(failed.iter().all(|e| e.type_.as_deref() == Some("Warning")));
}

/// `--storage-class` picks the class; one serving another pool is a refusal, one that is not
/// hpp's is an error before anything is read further; several classes for a pool need it.
#[tokio::test]
async fn the_storage_class_is_the_pools_own_or_the_one_given() {
    let fake = cluster();
    seed_bound(&fake, "vm-disk", kubevirt_legacy_pv("pvc-1", "node-a"));
    fake.seed(&class(
        "hostpath-csi-2",
        c::DRIVER_NAME,
        json!({"storagePool": "local"}),
    ));
    let plan = dry_run(&fake, &Scope::default()).await;
    assert_eq!(reasons(&plan, "vm-disk"), [Reason::SeveralStorageClasses]);
    let chosen = Scope {
        storage_class: Some("hostpath-csi-2".into()),
        ..Scope::default()
    };
    let plan = dry_run(&fake, &chosen).await;
    assert_eq!(
        row(&plan, "vm-disk").found.storage_class.as_deref(),
        Some("hostpath-csi-2")
    );
    let other_pool = Scope {
        storage_class: Some("hpp-shared".into()),
        ..Scope::default()
    };
    assert_eq!(
        reasons(&dry_run(&fake, &other_pool).await, "vm-disk"),
        [Reason::StorageClassOtherPool]
    );
    for (name, why) in [
        ("local-path", "its provisioner is rancher.io/local-path"),
        ("nope", "no such StorageClass"),
    ] {
        let scope = Scope {
            storage_class: Some(name.into()),
            ..Scope::default()
        };
        let err = adopt::plan(&fake.client(), &scope).await.unwrap_err().to_string();
        assert!(err.contains(name) && err.contains(why), "{err}");
    }
}

/// A `pathConfig` CR keeps legacy volumes beside its pool's directory: refused until renamed;
/// `--moved` (or the annotation) says where they went, and they are adopted into pool `legacy`.
#[tokio::test]
async fn renamed_directories_are_adopted_where_they_now_are() {
    let fake = cluster_with(cr(
        json!({"imagePullPolicy": "IfNotPresent", "pathConfig": {"path": "/var/hpvolumes"}}),
    ));
    fake.seed(&class(
        "hostpath-csi-legacy",
        c::DRIVER_NAME,
        json!({"storagePool": "legacy"}),
    ));
    let mut legacy = kubevirt_legacy_pv("pvc-1", "node-a");
    legacy["spec"]["hostPath"]["path"] = json!("/var/hpvolumes/pvc-1");
    seed_bound(&fake, "vm-disk", legacy);
    let mut prefixed = kubevirt_legacy_pv("pvc-2", "node-a");
    prefixed["spec"]["hostPath"]["path"] = json!("/var/hpvolumes/other-pvc-2");
    seed_bound(&fake, "other", prefixed);
    let plan = dry_run(&fake, &Scope::default()).await;
    for name in ["vm-disk", "other"] {
        assert_eq!(reasons(&plan, name), [Reason::MoveFirst], "{name}");
    }
    let message = &row(&plan, "vm-disk").found.refusals[0].message;
    assert!(
        message.contains("legacy volume of pathConfig /var/hpvolumes"),
        "{message}"
    );

    // The user renamed pvc-2's directory to its PV name and said so on the PV.
    let mut old = pv(&fake, "pvc-2").unwrap();
    old.annotations_mut()
        .insert(keys::MOVED_TO.into(), "/var/hpvolumes/csi/pvc-2".into());
    fake.seed(&old);
    let moved = Scope {
        moved: vec![adopt::pools::parse_moved("/var/hpvolumes=/var/hpvolumes/csi").unwrap()],
        ..Scope::default()
    };
    let plan = dry_run(&fake, &moved).await;
    assert_eq!(
        row(&plan, "vm-disk").found.directory.as_deref(),
        Some("/var/hpvolumes/csi/pvc-1")
    );
    assert_eq!(
        row(&plan, "other").found.volume_id.as_deref(),
        Some("pvc-2"),
        "the annotation wins"
    );
    let report = real_run(&fake, &moved, None).await;
    assert_eq!(report.summary, "adopt: 2 Adopted (2 claims)", "{report:#?}");
    let new = pv(&fake, "pvc-1-hpp").unwrap().spec.unwrap().csi.unwrap();
    assert_eq!(
        (
            new.volume_handle.as_str(),
            new.volume_attributes.unwrap()["storagePool"].as_str()
        ),
        ("pvc-1", "legacy")
    );
}

fn pod(name: &str, claim: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": APPS},
        "spec": {"containers": [{"name": "c", "image": "i"}],
                 "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]},
        "status": {"phase": "Running"},
    }))
    .unwrap()
}

/// What must hold after any prefix of the steps: the directory is always named by a PV, a PV
/// that could delete it (`Delete`) is always bound to its live claim, and every delete carried
/// a uid precondition.
fn assert_data_safe(fake: &FakeApiServer, old_pv: &str, claim_name: &str, when: &str) {
    let old = pv(fake, old_pv);
    let new = pv(fake, &format!("{old_pv}-hpp"));
    assert!(old.is_some() || new.is_some(), "{when}: the directory is named by a PV");
    let current = claim(fake, claim_name);
    let live_claim_names = |pv: &PersistentVolume| {
        current.as_ref().is_some_and(|c| {
            c.metadata.deletion_timestamp.is_none()
                && c.spec.as_ref().and_then(|s| s.volume_name.as_deref()) == pv.metadata.name.as_deref()
        })
    };
    for p in old.iter().chain(new.iter()) {
        let policy = p.spec.as_ref().and_then(|s| s.persistent_volume_reclaim_policy.clone());
        if policy.as_deref() != Some("Retain") {
            assert!(
                live_claim_names(p),
                "{when}: {} is {policy:?} without its claim",
                p.name_any()
            );
        }
    }
    for r in fake
        .write_requests()
        .iter()
        .filter(|r| r.method == http::Method::DELETE && !r.path.contains("/events"))
    {
        assert!(
            r.body.pointer("/preconditions/uid").and_then(Value::as_str).is_some(),
            "{when}: {} without a uid precondition",
            r.path
        );
    }
}

/// The end state of an adoption, without uids and versions.
fn end_state(fake: &FakeApiServer) -> Vec<Value> {
    let strip = |mut v: Value| {
        for f in ["uid", "resourceVersion", "creationTimestamp", "generation"] {
            v["metadata"].as_object_mut().unwrap().remove(f);
        }
        if let Some(r) = v.pointer_mut("/spec/claimRef").and_then(Value::as_object_mut) {
            r.remove("uid");
        }
        v
    };
    let mut all: Vec<Value> = fake
        .list::<PersistentVolume>()
        .into_iter()
        .map(|p| strip(serde_json::to_value(p).unwrap()))
        .collect();
    all.extend(
        fake.list::<PersistentVolumeClaim>()
            .into_iter()
            .map(|p| strip(serde_json::to_value(p).unwrap())),
    );
    all
}

fn seed_two(fake: &FakeApiServer) {
    seed_bound(fake, "vm-disk", kubevirt_legacy_pv("pvc-1", "node-a"));
    seed_bound(fake, "cache", local_path_pv("pvc-2", "cache"));
}

/// A crash after every number of steps (two claims, six steps each), then the same command
/// again: it converges to exactly what an uninterrupted run makes, and no step ever leaves the
/// directory unprotected.
#[tokio::test]
async fn a_crash_between_any_two_steps_is_finished_by_the_next_run() {
    let reference = cluster();
    seed_two(&reference);
    let whole = real_run(&reference, &Scope::default(), None).await;
    assert_eq!(whole.summary, "adopt: 2 Adopted (2 claims)");
    let expected = end_state(&reference);
    const STEPS: usize = 12;
    for k in 0..=STEPS {
        let fake = cluster();
        seed_two(&fake);
        let first = real_run(&fake, &Scope::default(), Some(k)).await;
        let when = format!("after {k} steps");
        if k < STEPS {
            assert!(
                first.claims.iter().any(|r| r.status == Status::Interrupted),
                "{when}: {first:#?}"
            );
        }
        for (old_pv, name) in [("pvc-1", "vm-disk"), ("pvc-2", "cache")] {
            assert_data_safe(&fake, old_pv, name, &when);
        }
        // What the dry run of the same command says in between.
        let between = dry_run(&fake, &Scope::default()).await;
        assert!(
            between
                .claims
                .iter()
                .all(|r| matches!(r.status, Status::Adoptable | Status::InProgress)),
            "{when}: {between:#?}"
        );
        let second = real_run(&fake, &Scope::default(), None).await;
        assert!(
            !second.has_problems() && second.claims.iter().all(|r| r.status == Status::Adopted),
            "{when}: {second:#?}"
        );
        for (old_pv, name) in [("pvc-1", "vm-disk"), ("pvc-2", "cache")] {
            assert_data_safe(&fake, old_pv, name, &when);
        }
        assert_eq!(end_state(&fake), expected, "{when}");
        fake.clear_requests();
        let third = real_run(&fake, &Scope::default(), None).await;
        assert!(
            third.claims.is_empty() && fake.write_requests().is_empty(),
            "{when}: {third:#?}"
        );
    }
}

/// A pod that starts using the claim after steps 1 and 2 refuses the adoption: the next run
/// deletes the new (never bound, Retain) PV and gives the old PV its policy back.
#[tokio::test]
async fn a_claim_used_again_before_its_deletion_is_rolled_back() {
    let fake = cluster();
    seed_bound(&fake, "vm-disk", kubevirt_legacy_pv("pvc-1", "node-a"));
    let original = pv(&fake, "pvc-1").unwrap();
    let first = real_run(&fake, &Scope::default(), Some(2)).await;
    assert_eq!(row(&first, "vm-disk").status, Status::Interrupted);
    assert!(pv(&fake, "pvc-1-hpp").is_some());
    fake.seed::<Pod>(&pod("virt-launcher-vm-abcde", "vm-disk"));
    let plan = dry_run(&fake, &Scope::default()).await;
    assert_eq!(row(&plan, "vm-disk").status, Status::InProgress);
    assert_eq!(reasons(&plan, "vm-disk"), [Reason::InUse]);
    let report = real_run(&fake, &Scope::default(), None).await;
    let r = row(&report, "vm-disk");
    assert_eq!(r.status, Status::RolledBack, "{r:#?}");
    assert!(pv(&fake, "pvc-1-hpp").is_none());
    let restored = pv(&fake, "pvc-1").unwrap();
    assert_eq!(restored.spec, original.spec, "the old PV is as it was");
    assert_eq!(restored.metadata.annotations, original.metadata.annotations);
    assert_eq!(
        claim(&fake, "vm-disk").unwrap().metadata.uid,
        original.spec.unwrap().claim_ref.unwrap().uid
    );
    let failed = events(&fake, adopt::REASON_ADOPTION_FAILED);
    assert!(
        failed.iter().any(|e| e
            .note
            .as_deref()
            .is_some_and(|n| n.contains("undone") && n.contains("virt-launcher-vm-abcde"))),
        "{failed:#?}"
    );
    // Once the pod is gone the same command adopts it.
    assert!(fake.remove::<Pod>(Some(APPS), "virt-launcher-vm-abcde"));
    assert_eq!(
        real_run(&fake, &Scope::default(), None).await.summary,
        "adopt: 1 Adopted (1 claim)"
    );
}

/// An old claim whose deletion waits (another controller's finalizer holds it) is reported
/// `Waiting`, with the pods that use it; the same command finishes once it is gone.
#[tokio::test]
async fn a_held_claim_is_waited_for_and_finished_later() {
    let fake = cluster();
    let seeded = seed_bound(&fake, "vm-disk", kubevirt_legacy_pv("pvc-1", "node-a"));
    let mut held = seeded.clone();
    held.metadata
        .finalizers
        .get_or_insert_with(Vec::new)
        .push("backup.example.com/hold".into());
    fake.seed(&held);
    let first = real_run(&fake, &Scope::default(), None).await;
    let r = row(&first, "vm-disk");
    assert_eq!(r.status, Status::Waiting, "{r:#?}");
    assert!(claim(&fake, "vm-disk").unwrap().metadata.deletion_timestamp.is_some());
    // No pod used it when it was deleted, so pvc-protection let go at once; only the other
    // finalizer holds it.
    assert_eq!(
        claim(&fake, "vm-disk").unwrap().metadata.finalizers,
        Some(vec!["backup.example.com/hold".to_owned()])
    );
    // A pod that shows up meanwhile is named (past the point of no return it refuses nothing:
    // it will use the new claim of that name).
    fake.seed::<Pod>(&pod("late", "vm-disk"));
    let second = real_run(&fake, &Scope::default(), None).await;
    let r = row(&second, "vm-disk");
    assert_eq!(r.status, Status::Waiting, "{r:#?}");
    assert!(r.message.as_deref().unwrap().contains("(late)"), "{r:#?}");
    assert_data_safe(&fake, "pvc-1", "vm-disk", "while waiting");
    let waiting = events(&fake, adopt::REASON_ADOPTION_FAILED);
    assert!(waiting.iter().all(|e| {
        e.note
            .as_deref()
            .is_some_and(|n| n.contains("run the same command again"))
    }));
    let mut pending = claim(&fake, "vm-disk").unwrap();
    pending.metadata.finalizers = None;
    fake.seed(&pending);
    assert!(
        claim(&fake, "vm-disk").is_none(),
        "its last finalizer gone, the old claim is"
    );
    let third = real_run(&fake, &Scope::default(), None).await;
    assert_eq!(third.summary, "adopt: 1 Adopted (1 claim)", "{third:#?}");
    assert_eq!(
        claim(&fake, "vm-disk").unwrap().spec.unwrap().volume_name.as_deref(),
        Some("pvc-1-hpp")
    );
}

/// `-n` and `-l` narrow the claims; an adoption already started is finished whatever its labels.
#[tokio::test]
async fn namespace_and_selector_narrow_the_claims() {
    let fake = cluster();
    seed_two(&fake);
    let only_cache = Scope {
        selector: Some("app=cache".into()),
        ..Scope::default()
    };
    let plan = dry_run(&fake, &only_cache).await;
    assert_eq!(
        plan.claims.iter().map(|r| r.found.claim.as_str()).collect::<Vec<_>>(),
        ["cache"]
    );
    let elsewhere = Scope {
        namespace: Some("other".into()),
        ..Scope::default()
    };
    assert!(dry_run(&fake, &elsewhere).await.claims.is_empty());
    // vm-disk stopped after its old claim was deleted: a run for app=cache finishes it too.
    let only_vm = Scope {
        selector: Some("app=vm-disk".into()),
        ..Scope::default()
    };
    real_run(&fake, &only_vm, Some(3)).await;
    assert!(claim(&fake, "vm-disk").is_none());
    let report = real_run(&fake, &only_cache, None).await;
    assert_eq!(report.summary, "adopt: 2 Adopted (2 claims)", "{report:#?}");
    // Stopped after step 1 (its claim still there, without the label asked for): the same.
    let fake = cluster();
    seed_two(&fake);
    real_run(&fake, &only_vm, Some(1)).await;
    assert!(pv(&fake, "pvc-1").unwrap().annotations().contains_key(keys::ADOPT_INTO));
    let plan = dry_run(&fake, &only_cache).await;
    assert_eq!(row(&plan, "vm-disk").status, Status::InProgress, "{plan:#?}");
    assert_eq!(
        real_run(&fake, &only_cache, None).await.summary,
        "adopt: 2 Adopted (2 claims)"
    );
}

/// A patch that finds its object changed since it was read (the PV controller binding the new
/// claim) is decided again from a fresh read; an API error fails the claim, and the same
/// command goes on from there.
#[tokio::test]
async fn conflicts_are_read_again_and_errors_are_resumed() {
    use hpp_testkit::FailureRule;
    let fake = cluster();
    seed_bound(&fake, "vm-disk", kubevirt_legacy_pv("pvc-1", "node-a"));
    seed_bound(&fake, "cache", local_path_pv("pvc-2", "cache"));
    fake.fail_requests(
        FailureRule::new(409)
            .method(http::Method::PATCH)
            .path_contains("/persistentvolumes/pvc-1-hpp")
            .times(2),
    );
    fake.fail_requests(
        FailureRule::new(503)
            .method(http::Method::DELETE)
            .path_contains("/persistentvolumeclaims/cache")
            .times(1),
    );
    let first = real_run(&fake, &Scope::default(), None).await;
    assert_eq!(row(&first, "vm-disk").status, Status::Adopted, "{first:#?}");
    let failed = row(&first, "cache");
    assert_eq!(failed.status, Status::Failed, "{failed:#?}");
    assert!(
        failed.message.as_deref().unwrap().contains("DeleteOldClaim"),
        "{failed:#?}"
    );
    assert_data_safe(&fake, "pvc-2", "cache", "after a failed delete");
    assert_eq!(
        real_run(&fake, &Scope::default(), None).await.summary,
        "adopt: 1 Adopted (1 claim)"
    );

    // An object that keeps changing is given up on, to be run again.
    let fake = cluster();
    seed_bound(&fake, "vm-disk", kubevirt_legacy_pv("pvc-1", "node-a"));
    fake.fail_requests(
        FailureRule::new(409)
            .method(http::Method::PATCH)
            .path_contains("/persistentvolumes/pvc-1"),
    );
    let r = real_run(&fake, &Scope::default(), None).await;
    let stuck = row(&r, "vm-disk");
    assert_eq!(stuck.status, Status::Failed, "{stuck:#?}");
    assert!(
        stuck.message.as_deref().unwrap().contains("kept changing"),
        "{stuck:#?}"
    );
    fake.clear_failures();
    assert_eq!(
        real_run(&fake, &Scope::default(), None).await.summary,
        "adopt: 1 Adopted (1 claim)"
    );
}
