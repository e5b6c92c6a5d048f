//! Events still reach the cluster when RBAC grants only core `events` (KubeVirt's roles).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use hpp_reconcile::events::EventRecorder;
use hpp_testkit::{FailureRule, FakeApiServer};
use k8s_openapi::api::core::v1::{Event as CoreEvent, ObjectReference};
use k8s_openapi::api::events::v1::Event as NewEvent;
use kube::runtime::events::{Event, EventType, Reporter};

fn claim() -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        name: Some("data".into()),
        namespace: Some("apps".into()),
        uid: Some("uid-1".into()),
        ..Default::default()
    }
}

fn event(reason: &str) -> Event {
    Event {
        type_: EventType::Warning,
        reason: reason.into(),
        note: Some("the base directory is not mounted".into()),
        action: "Provisioning".into(),
        secondary: None,
    }
}

fn reporter() -> Reporter {
    Reporter {
        controller: "hpp-provisioner".into(),
        instance: Some("node-1".into()),
    }
}

#[tokio::test]
async fn forbidden_events_k8s_io_falls_back_to_core_events() {
    let server = FakeApiServer::new();
    server.fail_requests(FailureRule::new(403).path_contains("/apis/events.k8s.io/"));
    let recorder = EventRecorder::new(server.client(), reporter());
    recorder
        .publish(&event("BaseDirectoryNotMounted"), &claim())
        .await
        .unwrap();
    recorder.publish(&event("StillNotMounted"), &claim()).await.unwrap();
    assert!(recorder.uses_core_events());
    let core: Vec<CoreEvent> = server.list();
    assert_eq!(core.len(), 2, "{core:?}");
    let first = core
        .iter()
        .find(|e| e.reason.as_deref() == Some("BaseDirectoryNotMounted"))
        .unwrap();
    assert_eq!(first.type_.as_deref(), Some("Warning"));
    assert_eq!(first.involved_object.name.as_deref(), Some("data"));
    assert_eq!(first.metadata.namespace.as_deref(), Some("apps"));
    assert_eq!(first.reporting_component.as_deref(), Some("hpp-provisioner"));
    assert!(server.list::<NewEvent>().is_empty());
}

#[tokio::test]
async fn events_k8s_io_is_used_when_allowed() {
    let server = FakeApiServer::new();
    let recorder = EventRecorder::new(server.client(), reporter());
    recorder.publish(&event("Provisioned"), &claim()).await.unwrap();
    assert!(!recorder.uses_core_events());
    assert_eq!(server.list::<NewEvent>().len(), 1);
    assert!(server.list::<CoreEvent>().is_empty());
}

#[tokio::test]
async fn other_errors_are_returned_not_hidden_by_the_fallback() {
    let server = FakeApiServer::new();
    server.fail_requests(FailureRule::new(500).path_contains("/events"));
    let recorder = EventRecorder::new(server.client(), reporter());
    assert!(recorder.publish(&event("X"), &claim()).await.is_err());
    assert!(!recorder.uses_core_events());
}
