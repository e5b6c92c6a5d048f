//! `cargo xtask bench --legacy-burst N`: the legacy provisioner (KubeVirt mode, as
//! `hpp-provisioner` runs it) against a burst of N claims, in-process against the fake API
//! server: every claim created at once, then every claim deleted at once (the delete leg is
//! timed from the moment every PV is marked `Released`).
//!
//! The provisioner runs its real controllers (watches, per-claim reconcile, Events) with the
//! client the binary ships with: kube-rs, which has no client-side rate limit. The bench plays
//! the PV controller: it binds each claim once its PV exists and marks a PV `Released` when its
//! claim is deleted. It prints how long the burst took each way, the requests and Events per
//! claim, and what client-go's default limit (5 requests/s, burst 10, which KubeVirt's legacy
//! provisioner keeps) makes of the same request count. That last figure is computed, not
//! measured: there is no KubeVirt binary on this machine.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use hpp_api::constants::{ANNOTATION_PROVISION_ON_NODE, ANNOTATION_STORAGE_PROVISIONER, LEGACY_PROVISIONER_NAME};
use hpp_legacy::metrics::Metrics;
use hpp_legacy::provisioner::Provisioner;
use hpp_legacy::{Mode, ProvisionerConfig};
use hpp_testkit::FakeApiServer;
use k8s_openapi::api::core::v1::{
    Node, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;

/// The node the provisioner instance serves.
const NODE: &str = "node-a";
/// Where the claims live.
const NAMESPACE: &str = "burst";
/// client-go's default client-side limit, requests per second.
const CLIENT_GO_QPS: f64 = 5.0;
/// How often the bench looks at the PVs (each look lists them all from the fake, under its
/// lock, so looking often slows the provisioner's own requests down).
const POLL: Duration = Duration::from_millis(100);
/// Longest wait for one direction of the burst.
const PATIENCE: Duration = Duration::from_secs(600);

/// One direction of the burst.
struct Leg {
    took: Duration,
    requests: usize,
    writes: usize,
    events: usize,
}

/// Runs the burst of `claims` claims and prints the figures.
pub async fn run(claims: usize) -> anyhow::Result<()> {
    let fake = FakeApiServer::new();
    fake.track_managed_fields();
    fake.seed(&StorageClass {
        metadata: ObjectMeta {
            name: Some("hpp".into()),
            ..Default::default()
        },
        provisioner: LEGACY_PROVISIONER_NAME.into(),
        reclaim_policy: Some("Delete".into()),
        volume_binding_mode: Some("Immediate".into()),
        ..Default::default()
    });
    fake.seed(&Node {
        metadata: ObjectMeta {
            name: Some(NODE.into()),
            labels: Some([("kubernetes.io/hostname".to_owned(), NODE.to_owned())].into()),
            ..Default::default()
        },
        ..Default::default()
    });
    let dir = tempfile::tempdir()?;
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = std::sync::Arc::new(Metrics::register(&mut registry));
    let cfg = ProvisionerConfig::new(Mode::Kubevirt, Some(NODE.into()), Some(dir.path().to_path_buf()));
    let prov = std::sync::Arc::new(Provisioner::new(fake.client(), cfg, metrics, Some(NODE.into())));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let controllers = tokio::spawn(hpp_legacy::controller::run(prov, async move {
        let _ = stop_rx.await;
    }));
    // Let the watches list before the burst.
    tokio::time::sleep(Duration::from_millis(500)).await;
    println!("legacy provisioner (KubeVirt mode, node {NODE}) against the fake API server, a burst of {claims} claims");

    fake.clear_requests();
    let events_before = events(&fake);
    let started = Instant::now();
    for i in 0..claims {
        let stored = fake.seed(&claim(&format!("disk-{i}")));
        fake.set_status::<PersistentVolumeClaim>(
            Some(NAMESPACE),
            stored.metadata.name.as_deref().unwrap_or_default(),
            json!({"phase": "Pending"}),
        );
    }
    let mut bound = std::collections::BTreeSet::new();
    while bound.len() < claims {
        anyhow::ensure!(
            started.elapsed() < PATIENCE,
            "only {} of {claims} claims provisioned",
            bound.len()
        );
        for pv in fake.list::<PersistentVolume>() {
            let name = pv.metadata.name.clone().unwrap_or_default();
            if bound.contains(&name) {
                continue;
            }
            let Some(claim) = claim_of(&pv) else { continue };
            fake.set_status::<PersistentVolume>(None, &name, json!({"phase": "Bound"}));
            fake.set_status::<PersistentVolumeClaim>(Some(NAMESPACE), &claim, json!({"phase": "Bound"}));
            bound.insert(name);
        }
        tokio::time::sleep(POLL).await;
    }
    let provisioned = leg(&fake, started, events_before);

    // The claims go first, with their PVs still Bound (the provisioner has nothing to do
    // yet): the fake's garbage collection scans every object per deletion, which took ~10 s of
    // the 1,000 deletions in a debug build and is not the provisioner's cost. The clock starts
    // when the PV controller's part begins: every PV marked Released at once.
    let pvs = fake.list::<PersistentVolume>();
    for pv in &pvs {
        if let Some(claim) = claim_of(pv) {
            fake.remove::<PersistentVolumeClaim>(Some(NAMESPACE), &claim);
        }
    }
    fake.clear_requests();
    let events_before = events(&fake);
    let started = Instant::now();
    for pv in pvs.iter().filter(|pv| claim_of(pv).is_some()) {
        fake.set_status::<PersistentVolume>(
            None,
            pv.metadata.name.as_deref().unwrap_or_default(),
            json!({"phase": "Released"}),
        );
    }
    loop {
        let left = fake.list::<PersistentVolume>().len();
        if left == 0 {
            break;
        }
        anyhow::ensure!(started.elapsed() < PATIENCE, "{left} of {claims} volumes not deleted");
        tokio::time::sleep(POLL).await;
    }
    let deleted = leg(&fake, started, events_before);
    let left = std::fs::read_dir(dir.path())
        .context("reading the volume directory")?
        .count();
    let _ = stop_tx.send(());
    let _ = controllers.await;

    println!(
        "{:<22} {:>9} {:>11} {:>10} {:>9} {:>9} {:>26}",
        "", "time", "claims/s", "requests", "writes", "Events", "at client-go's 5 req/s"
    );
    for (name, l) in [("provision and bind", &provisioned), ("delete", &deleted)] {
        println!(
            "{name:<22} {:>8.2}s {:>11.0} {:>10} {:>9} {:>9} {:>25.0}s",
            l.took.as_secs_f64(),
            claims as f64 / l.took.as_secs_f64().max(1e-9),
            l.requests,
            l.writes,
            l.events,
            l.requests as f64 / CLIENT_GO_QPS
        );
    }
    println!(
        "per claim: {:.2} requests and {:.2} Events to provision, {:.2} requests to delete; {left} directories left",
        per(provisioned.requests, claims),
        per(provisioned.events, claims),
        per(deleted.requests, claims)
    );
    Ok(())
}

fn leg(fake: &FakeApiServer, started: Instant, events_before: usize) -> Leg {
    let requests = fake.requests();
    if std::env::var_os("HPP_BENCH_REQUESTS").is_some() {
        let mut kinds = std::collections::BTreeMap::<String, usize>::new();
        for r in &requests {
            // The path without the object's name: one line per kind of request.
            let shape = match r.path.rsplit_once('/') {
                Some((parent, _)) if r.method != "POST" && !r.query.contains("watch") => format!("{parent}/NAME"),
                _ => r.path.clone(),
            };
            *kinds.entry(format!("{} {shape}", r.method)).or_default() += 1;
        }
        for (k, n) in kinds {
            println!("  {n:>6} {k}");
        }
    }
    Leg {
        took: started.elapsed(),
        requests: requests.len(),
        writes: requests.iter().filter(|r| r.is_write()).count(),
        events: events(fake).saturating_sub(events_before),
    }
}

/// The name of the claim a PV is for.
fn claim_of(pv: &PersistentVolume) -> Option<String> {
    pv.spec.as_ref()?.claim_ref.as_ref()?.name.clone()
}

fn events(fake: &FakeApiServer) -> usize {
    fake.list::<k8s_openapi::api::events::v1::Event>().len() + fake.list::<k8s_openapi::api::core::v1::Event>().len()
}

fn per(n: usize, d: usize) -> f64 {
    n as f64 / d.max(1) as f64
}

/// A Pending claim for this node, as the PV controller leaves it for the provisioner.
fn claim(name: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NAMESPACE.into()),
            annotations: Some(
                [
                    (
                        ANNOTATION_STORAGE_PROVISIONER.to_owned(),
                        LEGACY_PROVISIONER_NAME.to_owned(),
                    ),
                    (ANNOTATION_PROVISION_ON_NODE.to_owned(), NODE.to_owned()),
                ]
                .into(),
            ),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            storage_class_name: Some("hpp".into()),
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some([("storage".to_owned(), Quantity("1Mi".into()))].into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}
