//! Leader election on a Lease (KubeVirt's lock name), so only one operator replica reconciles.

use std::time::Duration;

use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::watch;
use tracing::info;

/// KubeVirt's leader-election lock name, kept so an upgrade does not run two leaders.
pub const LEASE_NAME: &str = "hostpath-provisioner-operator-lock";

/// Starts contending for the lease; the receiver says whether we hold it.
pub async fn elect(client: Client, namespace: &str, identity: &str) -> anyhow::Result<watch::Receiver<bool>> {
    let manager = LeaseManagerBuilder::new(client, LEASE_NAME)
        .with_namespace(namespace)
        .with_identity(identity)
        .with_duration(15)
        .with_grace(5)
        .with_field_manager("hpp-operator/leader")
        .build()
        .await?;
    let (rx, _task) = manager.watch().await;
    info!(lease = LEASE_NAME, identity, "contending for leadership");
    Ok(rx)
}

/// Waits until we hold the lease.
pub async fn until_leader(rx: &mut watch::Receiver<bool>) -> anyhow::Result<()> {
    while !*rx.borrow_and_update() {
        rx.changed().await?;
    }
    Ok(())
}

/// Resolves when leadership is lost (or the election task ends).
pub async fn lost(mut rx: watch::Receiver<bool>) {
    loop {
        if !*rx.borrow_and_update() {
            return;
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// Default pause before exiting after losing the lease, so logs flush.
pub const LOST_GRACE: Duration = Duration::from_millis(200);
