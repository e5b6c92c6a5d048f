//! `Applier::apply_all`: several writes in flight, answers in the order given, and a failure
//! stops what has not started.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use hpp_reconcile::DesiredObject;
use hpp_reconcile::apply::{APPLY_CONCURRENCY, Applier};
use hpp_reconcile::reconcilers::common::typed_ssa;
use hpp_testkit::{FailureRule, FakeApiServer};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;

const NS: &str = "hpp";

fn config_maps(n: usize) -> Vec<DesiredObject> {
    (0..n)
        .map(|i| {
            typed_ssa(&ConfigMap {
                metadata: ObjectMeta {
                    name: Some(format!("cm-{i:02}")),
                    namespace: Some(NS.into()),
                    ..Default::default()
                },
                data: Some([("i".to_owned(), i.to_string())].into()),
                ..Default::default()
            })
            .unwrap()
        })
        .collect()
}

fn names(objects: &[kube::api::DynamicObject]) -> Vec<String> {
    objects.iter().map(|o| o.metadata.name.clone().unwrap()).collect()
}

#[tokio::test]
async fn answers_come_in_the_order_given_and_keep_sees_each() {
    let fake = FakeApiServer::new();
    let desired = config_maps(20);
    let live = Applier::new(fake.client())
        .apply_all_keeping("test", &desired, |o| {
            o.data.as_object_mut().unwrap().remove("data");
        })
        .await
        .unwrap();
    let want: Vec<String> = (0..20).map(|i| format!("cm-{i:02}")).collect();
    assert_eq!(names(&live), want);
    assert!(
        live.iter().all(|o| o.data.get("data").is_none()),
        "keep ran on every answer"
    );
    assert_eq!(fake.list::<ConfigMap>().len(), 20, "the objects themselves are whole");
}

#[tokio::test]
async fn a_failure_stops_the_writes_not_yet_started() {
    let fake = FakeApiServer::new();
    fake.fail_requests(FailureRule::new(500).path_contains("/configmaps/cm-03"));
    let desired = config_maps(30);
    let err = Applier::new(fake.client())
        .apply_all("test", &desired)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("cm-03"), "{err}");
    let written = fake.list::<ConfigMap>().len();
    // Those before it, and at most the ones in flight with it, are written; none later.
    assert!(written >= 3, "{written}");
    assert!(written <= 3 + APPLY_CONCURRENCY, "{written}");
    assert!(fake.get::<ConfigMap>(Some(NS), "cm-29").is_none());
}
