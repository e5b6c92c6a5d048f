//! Watch loops: one controller for claims, one for volumes, optionally only while holding a
//! Lease (shared mode: exactly one active instance).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use hpp_reconcile::leader::Election;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::decision::{IgnoreReason, RefusalReason};
use crate::provisioner::{ClaimOutcome, Provisioner, VolumeOutcome};
use crate::{Error, Result};

/// Retry delay after an API or filesystem error.
pub const ERROR_REQUEUE: Duration = Duration::from_secs(15);
/// Re-check delay for refusals that can heal by themselves (mount back, space freed).
pub const TRANSIENT_REFUSAL_REQUEUE: Duration = Duration::from_secs(60);
/// Re-check delay for refusals that need the user to change something.
pub const PERMANENT_REFUSAL_REQUEUE: Duration = Duration::from_secs(600);

/// How a claim outcome maps to the next look at it.
pub fn claim_action(outcome: &ClaimOutcome) -> Action {
    match outcome {
        ClaimOutcome::Refused(RefusalReason::MountGuard | RefusalReason::NodeUnknown | RefusalReason::NoBaseDir) => {
            Action::requeue(TRANSIENT_REFUSAL_REQUEUE)
        }
        ClaimOutcome::Refused(_) => Action::requeue(PERMANENT_REFUSAL_REQUEUE),
        // The class may appear later; claims are re-listed on every watch restart anyway.
        ClaimOutcome::Ignored(IgnoreReason::OtherProvisioner) => Action::requeue(PERMANENT_REFUSAL_REQUEUE),
        _ => Action::await_change(),
    }
}

/// How a volume outcome maps to the next look at it.
pub fn volume_action(outcome: &VolumeOutcome) -> Action {
    match outcome {
        VolumeOutcome::Refused(_) => Action::requeue(TRANSIENT_REFUSAL_REQUEUE),
        _ => Action::await_change(),
    }
}

/// Pending claims of a StorageClass, to be re-checked when the class changes.
pub fn claims_of_class(claims: &[Arc<PersistentVolumeClaim>], class: &str) -> Vec<ObjectRef<PersistentVolumeClaim>> {
    claims
        .iter()
        .filter(|c| crate::provisioner::claim_class(c).as_deref() == Some(class))
        .filter(|c| c.spec.as_ref().is_none_or(|s| s.volume_name.is_none()))
        .map(|c| ObjectRef::from_obj(c.as_ref()))
        .collect()
}

async fn stopped(mut stop: watch::Receiver<bool>) {
    // An error means the sender is gone, which also means stop.
    let _ = stop.wait_for(|s| *s).await;
}

/// Runs both controllers until `stop` turns true.
pub async fn run_controllers(prov: Arc<Provisioner>, stop: watch::Receiver<bool>) {
    let client = prov.client().clone();
    let (class_store, class_writer) = reflector::store::<StorageClass>();
    prov.set_class_cache(Some(class_store));
    let classes = reflector::reflector(
        class_writer,
        watcher::watcher(Api::<StorageClass>::all(client.clone()), watcher::Config::default()).default_backoff(),
    )
    .take_until(stopped(stop.clone()))
    .for_each(|_| futures::future::ready(()));
    let claims = Controller::new(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        watcher::Config::default(),
    );
    // A new or fixed StorageClass re-checks its Pending claims at once instead of at the next requeue.
    let cache = claims.store();
    let claims = claims
        .watches(
            Api::<StorageClass>::all(client.clone()),
            watcher::Config::default(),
            move |class| claims_of_class(&cache.state(), class.metadata.name.as_deref().unwrap_or("")),
        )
        .graceful_shutdown_on(stopped(stop.clone()))
        .run(
            |claim: Arc<PersistentVolumeClaim>, prov: Arc<Provisioner>| async move {
                prov.reconcile_claim(&claim).await.map(|o| claim_action(&o))
            },
            |_claim, err: &Error, _prov| {
                warn!(error = %err, "claim reconcile failed");
                Action::requeue(ERROR_REQUEUE)
            },
            prov.clone(),
        )
        .for_each(|_| futures::future::ready(()));
    let stop_purge = stop.clone();
    let volumes = Controller::new(Api::<PersistentVolume>::all(client), watcher::Config::default())
        .graceful_shutdown_on(stopped(stop))
        .run(
            |pv: Arc<PersistentVolume>, prov: Arc<Provisioner>| async move {
                prov.reconcile_volume(&pv).await.map(|o| volume_action(&o))
            },
            |_pv, err: &Error, _prov| {
                warn!(error = %err, "volume reconcile failed");
                Action::requeue(ERROR_REQUEUE)
            },
            prov.clone(),
        )
        .for_each(|_| futures::future::ready(()));
    let purger = purge_trash_every(prov.clone(), stop_purge);
    tokio::join!(classes, claims, volumes, purger);
    prov.set_class_cache(None);
}

/// Purges the trash every [`hpp_fs::trash::purge_interval`] of the retention until `stop`
/// (returns at once without a trash retention).
async fn purge_trash_every(prov: Arc<Provisioner>, stop: watch::Receiver<bool>) {
    let Some(settings) = prov.config().trash else {
        return;
    };
    let mut ticker = tokio::time::interval(hpp_fs::trash::purge_interval(settings.retention));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stop = stopped(stop);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = ticker.tick() => prov.purge_trash().await,
            () = &mut stop => return,
        }
    }
}

/// Runs the controllers until `shutdown` resolves (node-local modes: every instance active).
pub async fn run(prov: Arc<Provisioner>, shutdown: impl Future<Output = ()> + Send + 'static) {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = tx.send(true);
    });
    run_controllers(prov, rx).await;
}

/// Where the leader Lease lives and who we are (the shared `hpp_reconcile::leader` settings).
pub use hpp_reconcile::leader::LeaseSettings;

/// Runs the controllers only while this instance holds the Lease (shared mode): stops them when
/// another instance takes the lease over and contends again; releases the lease on shutdown.
pub async fn run_with_leader_election(
    prov: Arc<Provisioner>,
    lease: LeaseSettings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let identity = lease.identity.clone();
    let mut election = Election::start(prov.client().clone(), lease).await?;
    loop {
        tokio::select! {
            acquired = election.acquired() => acquired?,
            () = stopped(stop_rx.clone()) => break,
        }
        info!(%identity, "became leader; provisioning");
        let (lead_tx, lead_rx) = watch::channel(false);
        let mut running = tokio::spawn(run_controllers(prov.clone(), lead_rx));
        let stop_now = tokio::select! {
            () = election.lost() => false,
            () = stopped(stop_rx.clone()) => true,
        };
        let _ = lead_tx.send(true);
        // Stopping: what is in flight finishes, unless the lease goes first. Lost: what is
        // in flight is dropped, not waited for. Another instance may be leading by now, and
        // the calls may be waiting on an API server that does not answer. Every step is one
        // a crash could have cut short, and converges again.
        let finished = stop_now
            && tokio::select! {
                _ = &mut running => true,
                () = election.lost() => false,
            };
        if !finished {
            running.abort();
            let _ = running.await;
            // What the controllers would have cleared on their way out.
            prov.set_class_cache(None);
        }
        if stop_now {
            break;
        }
    }
    election.step_down().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_changes_map_to_its_unbound_claims() {
        use k8s_openapi::api::core::v1::PersistentVolumeClaimSpec;
        let claim = |name: &str, class: &str, bound: bool| {
            let mut c = PersistentVolumeClaim::default();
            c.metadata.name = Some(name.into());
            c.metadata.namespace = Some("ns".into());
            c.spec = Some(PersistentVolumeClaimSpec {
                storage_class_name: Some(class.into()),
                volume_name: bound.then(|| "pv".to_owned()),
                ..Default::default()
            });
            Arc::new(c)
        };
        let all = [
            claim("a", "fast", false),
            claim("b", "slow", false),
            claim("c", "fast", true),
        ];
        let refs = claims_of_class(&all, "fast");
        assert_eq!(refs.len(), 1);
        assert_eq!(refs[0].name, "a");
        assert!(claims_of_class(&all, "none").is_empty());
        // The beta annotation wins over the spec, as in Kubernetes' GetPersistentVolumeClaimClass.
        let mut annotated = (*claim("d", "slow", false)).clone();
        annotated.metadata.annotations =
            Some([("volume.beta.kubernetes.io/storage-class".to_owned(), "fast".to_owned())].into());
        assert_eq!(crate::provisioner::claim_class(&annotated).as_deref(), Some("fast"));
        let refs = claims_of_class(&[Arc::new(annotated)], "fast");
        assert_eq!(refs.len(), 1);
    }

    #[test]
    fn actions() {
        assert_eq!(
            claim_action(&ClaimOutcome::Refused(RefusalReason::MountGuard)),
            Action::requeue(TRANSIENT_REFUSAL_REQUEUE)
        );
        assert_eq!(
            claim_action(&ClaimOutcome::Refused(RefusalReason::BlockMode)),
            Action::requeue(PERMANENT_REFUSAL_REQUEUE)
        );
        assert_eq!(
            claim_action(&ClaimOutcome::Provisioned("pv".into())),
            Action::await_change()
        );
        assert_eq!(
            claim_action(&ClaimOutcome::Ignored(IgnoreReason::OtherNode)),
            Action::await_change()
        );
        assert_eq!(
            volume_action(&VolumeOutcome::Refused("x".into())),
            Action::requeue(TRANSIENT_REFUSAL_REQUEUE)
        );
        assert_eq!(volume_action(&VolumeOutcome::Ignored("x")), Action::await_change());
    }
}
