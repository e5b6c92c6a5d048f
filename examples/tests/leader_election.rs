//! Leader election for an embedder's own controller, against the test kit: the snippet in
//! docs/embedding.md ("Run one active replica").
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::time::Duration;

use hpp_reconcile::deps::k8s_openapi::api::coordination::v1::Lease;
use hpp_reconcile::leader::{Election, LeaseSettings};
use hpp_testkit::FakeApiServer;

#[tokio::test]
async fn a_replica_leads_then_hands_over_on_step_down() {
    let fake = FakeApiServer::new();
    let client = fake.client();
    let guard = Duration::from_secs(60);
    tokio::time::timeout(guard, async {
        // ANCHOR: leader
        let settings = LeaseSettings::new("my-controller-lock", "default", "replica-a");
        let mut election = Election::start(client, settings).await?;
        election.acquired().await?; // only one replica gets past this line
        // ... run your controller here; stop it when `election.lost()` resolves ...
        election.step_down().await?; // on shutdown: the standby takes over at once
        // ANCHOR_END: leader
        Ok::<_, hpp_reconcile::leader::LeaderError>(())
    })
    .await
    .unwrap()
    .unwrap();
    // The lease was released, so the next replica leads at once.
    let mut next = Election::start(
        fake.client(),
        LeaseSettings::new("my-controller-lock", "default", "replica-b"),
    )
    .await
    .unwrap();
    tokio::time::timeout(guard, next.acquired()).await.unwrap().unwrap();
    let lease = fake.get::<Lease>(Some("default"), "my-controller-lock").unwrap();
    assert_eq!(lease.spec.unwrap().holder_identity.as_deref(), Some("replica-b"));
}
