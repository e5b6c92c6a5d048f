//! Leader election against the fake API server: two candidates, one leads; when the leader steps
//! down or its lease lapses, the other takes over.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::time::Duration;

use hpp_reconcile::leader::{Election, LeaderError, LeaseSettings};
use hpp_testkit::{Access, FailureRule, FakeApiServer, RbacPolicy};
use k8s_openapi::api::coordination::v1::Lease;

const NS: &str = "hpp";
const LEASE: &str = "test-lock";
/// Hang guard only: every wait below ends on an event, not on this.
const HANG: Duration = Duration::from_secs(60);

fn settings(identity: &str) -> LeaseSettings {
    // Short leases so a lapse takes seconds (renewed every 2 s, each renewal given 1 s before
    // the hold runs out, room enough on a loaded machine); each candidate writes with its own
    // field manager so a test can cut off one candidate's renewals.
    LeaseSettings::new(LEASE, NS, identity)
        .with_timing(4, 2)
        .with_field_manager(format!("candidate-{identity}"))
}

fn holder(fake: &FakeApiServer) -> Option<String> {
    fake.get::<Lease>(Some(NS), LEASE)
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

/// Starts `a`, waits until it leads, then starts `b`.
async fn a_leads_b_waits(fake: &FakeApiServer) -> (Election, Election) {
    let mut a = Election::start(fake.client_in(NS), settings("a")).await.unwrap();
    tokio::time::timeout(HANG, a.acquired()).await.unwrap().unwrap();
    assert!(a.is_leader());
    assert_eq!(holder(fake).as_deref(), Some("a"));
    let b = Election::start(fake.client_in(NS), settings("b")).await.unwrap();
    (a, b)
}

#[tokio::test]
async fn the_other_candidate_takes_over_when_the_leader_steps_down() {
    let fake = FakeApiServer::new();
    let (a, mut b) = a_leads_b_waits(&fake).await;
    a.step_down().await.unwrap();
    tokio::time::timeout(HANG, b.acquired()).await.unwrap().unwrap();
    assert_eq!(holder(&fake).as_deref(), Some("b"));
}

#[tokio::test]
async fn the_election_needs_no_more_than_the_permissions_it_declares() {
    let fake = FakeApiServer::new();
    let rules = hpp_reconcile::OperatorRules::new(settings("a").permissions());
    fake.enforce_rbac(RbacPolicy::new().namespace_rules(NS, rules.namespace_rules()));
    let (a, mut b) = a_leads_b_waits(&fake).await;
    a.step_down().await.unwrap();
    tokio::time::timeout(HANG, b.acquired()).await.unwrap().unwrap();
    assert_eq!(holder(&fake).as_deref(), Some("b"));
    assert!(fake.denied_requests().is_empty(), "{:#?}", fake.denied_requests());
    // The rules name this Lease only.
    let other = Access::new("update", "coordination.k8s.io", "leases")
        .in_namespace(NS)
        .named("another-lock");
    assert!(
        !RbacPolicy::new()
            .namespace_rules(NS, rules.namespace_rules())
            .allows(&other)
    );
}

#[tokio::test]
async fn the_other_candidate_takes_over_when_the_leaders_lease_lapses() {
    let fake = FakeApiServer::new();
    let (mut a, mut b) = a_leads_b_waits(&fake).await;
    // The leader can no longer renew (its writes fail, as in a partition): its lease lapses.
    fake.fail_requests(FailureRule::new(503).query_contains("fieldManager=candidate-a"));
    tokio::time::timeout(HANG, b.acquired()).await.unwrap().unwrap();
    assert_eq!(holder(&fake).as_deref(), Some("b"));
    // The old leader sees it lost the lease and stops acting.
    tokio::time::timeout(HANG, a.lost()).await.unwrap();
    assert!(!a.is_leader());
}

#[tokio::test]
async fn a_leader_cut_off_from_the_api_server_stops_acting_and_leads_again_after() {
    let fake = FakeApiServer::new();
    let mut a = Election::start(fake.client_in(NS), settings("a")).await.unwrap();
    tokio::time::timeout(HANG, a.acquired()).await.unwrap().unwrap();
    // Every call fails, reads included: the lease manager alone would go on reporting "leader"
    // while another replica takes the lease over once it lapses.
    fake.set_unavailable(true);
    tokio::time::timeout(HANG, a.lost())
        .await
        .expect("a cut-off leader stops acting");
    assert!(!a.is_leader());
    // Back online: the lease is released and acquired afresh, and the candidate leads again.
    fake.set_unavailable(false);
    tokio::time::timeout(HANG, a.acquired()).await.unwrap().unwrap();
    assert_eq!(holder(&fake).as_deref(), Some("a"));
    a.step_down().await.unwrap();
}

/// A partition, or a hung API server: no call fails, none is answered. The leader must not
/// wait on its renewal for ever, and stepping down must not wait on the release.
#[tokio::test]
async fn a_leader_whose_api_server_stops_answering_stops_acting_and_can_step_down() {
    let fake = FakeApiServer::new();
    let mut a = Election::start(fake.client_in(NS), settings("a")).await.unwrap();
    tokio::time::timeout(HANG, a.acquired()).await.unwrap().unwrap();
    fake.set_unresponsive(true);
    tokio::time::timeout(HANG, a.lost())
        .await
        .expect("a leader whose renewals go unanswered stops acting");
    assert!(!a.is_leader());
    tokio::time::timeout(HANG, a.step_down())
        .await
        .expect("the release gives up on an API server that does not answer")
        .unwrap();
    assert_eq!(holder(&fake).as_deref(), Some("a"), "nothing reached the API server");
    fake.set_unresponsive(false);
}

#[tokio::test]
async fn bad_settings_are_reported() {
    let fake = FakeApiServer::new();
    // The grace period must be shorter than the lease.
    let err = Election::start(fake.client_in(NS), settings("a").with_timing(2, 5))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            LeaderError::InvalidTiming {
                duration_seconds: 2,
                grace_seconds: 5,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("hpp/test-lock"), "{err}");
}

/// KubeVirt's operator Role grants `leases` get, list, watch, create, update and delete, not
/// patch, and a swap that changes only the operator's image runs hpp's operator with it: the
/// election works without a single PATCH (every PATCH of a Lease is refused here).
#[tokio::test]
async fn the_election_needs_no_patch_permission() {
    let fake = FakeApiServer::new();
    fake.fail_requests(
        FailureRule::new(403)
            .method(http::Method::PATCH)
            .path_contains("/leases/"),
    );
    let (a, mut b) = a_leads_b_waits(&fake).await;
    a.step_down().await.unwrap();
    tokio::time::timeout(HANG, b.acquired()).await.unwrap().unwrap();
    assert_eq!(holder(&fake).as_deref(), Some("b"));
    b.step_down().await.unwrap();
    assert_eq!(holder(&fake), None, "released for the next candidate");
    let patches = fake
        .requests()
        .iter()
        .filter(|r| r.method == http::Method::PATCH)
        .count();
    assert_eq!(patches, 0);
}
