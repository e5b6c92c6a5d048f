//! Test kit: watch streams, kube-runtime's watcher and a whole Controller over the fake API server.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use hpp_testkit::FakeApiServer;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde_json::json;

/// Generous guard so a broken fake fails the test instead of hanging it.
const GUARD: Duration = Duration::from_secs(30);

fn cm(name: &str, app: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.metadata.labels = Some([("app".to_string(), app.to_string())].into());
    cm
}

async fn next<S: futures::Stream + Unpin>(stream: &mut S) -> S::Item {
    tokio::time::timeout(GUARD, stream.next())
        .await
        .expect("stream stalled")
        .expect("stream ended")
}

fn describe(ev: &WatchEvent<ConfigMap>) -> (String, String) {
    match ev {
        WatchEvent::Added(o) => ("ADDED".into(), o.name_any()),
        WatchEvent::Modified(o) => ("MODIFIED".into(), o.name_any()),
        WatchEvent::Deleted(o) => ("DELETED".into(), o.name_any()),
        WatchEvent::Bookmark(_) => ("BOOKMARK".into(), String::new()),
        WatchEvent::Error(e) => ("ERROR".into(), e.code.to_string()),
    }
}

#[tokio::test]
async fn watch_delivers_events_after_the_given_resource_version() {
    let fake = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    api.create(&PostParams::default(), &cm("before", "hpp")).await.unwrap();
    let rv = api
        .list(&Default::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();

    // Changes made after `rv` but before the watch starts are replayed from history.
    api.create(&PostParams::default(), &cm("a", "hpp")).await.unwrap();
    let mut stream = api.watch(&WatchParams::default(), &rv).await.unwrap().boxed();
    api.patch("a", &PatchParams::default(), &Patch::Merge(json!({"data": {"k": "v"}})))
        .await
        .unwrap();
    api.delete("a", &DeleteParams::default()).await.unwrap();

    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(describe(&next(&mut stream).await.unwrap()));
    }
    assert_eq!(
        seen,
        [
            ("ADDED".into(), "a".into()),
            ("MODIFIED".into(), "a".into()),
            ("DELETED".into(), "a".into())
        ]
    );
    let watch = fake.requests().into_iter().find(|r| r.is_watch()).unwrap();
    assert_eq!(watch.query_param("resourceVersion"), Some(rv));
}

#[tokio::test]
async fn watch_with_label_selector_sees_objects_enter_and_leave_the_selection() {
    let fake = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    let rv = fake.resource_version();
    let mut stream = api
        .watch(&WatchParams::default().labels("app=hpp"), &rv)
        .await
        .unwrap()
        .boxed();
    api.create(&PostParams::default(), &cm("other", "x")).await.unwrap();
    api.create(&PostParams::default(), &cm("mine", "hpp")).await.unwrap();
    api.patch(
        "other",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "hpp"}}})),
    )
    .await
    .unwrap();
    api.patch(
        "mine",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "x"}}})),
    )
    .await
    .unwrap();
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(describe(&next(&mut stream).await.unwrap()));
    }
    assert_eq!(
        seen,
        [
            ("ADDED".into(), "mine".into()),
            ("ADDED".into(), "other".into()),
            ("DELETED".into(), "mine".into())
        ]
    );
}

#[tokio::test]
async fn watch_from_a_compacted_resource_version_is_gone() {
    let fake = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    api.create(&PostParams::default(), &cm("a", "hpp")).await.unwrap();
    let old_rv = fake.resource_version();
    api.create(&PostParams::default(), &cm("b", "hpp")).await.unwrap();
    fake.compact_history();
    let mut stream = api.watch(&WatchParams::default(), &old_rv).await.unwrap().boxed();
    match next(&mut stream).await {
        Ok(WatchEvent::Error(status)) => assert_eq!((status.code, status.reason.as_str()), (410, "Expired")),
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
}

/// The API server's watch cache keeps a window of events; a watch resuming from before it
/// is gone, unless a bookmark (every minute, to a watch that allows them) moved it on.
#[tokio::test(start_paused = true)]
async fn bookmarks_keep_a_watch_resumable_past_the_history_window() {
    let fake = FakeApiServer::new();
    fake.keep_history_for(Duration::from_secs(75));
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    api.create(&PostParams::default(), &cm("a", "hpp")).await.unwrap();
    let listed_at = fake.resource_version();
    let mut stream = api.watch(&WatchParams::default(), &listed_at).await.unwrap().boxed();
    // Another kind's writes move the version on; this watch sees none of them but a bookmark.
    let other: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(fake.client(), "ns");
    let mut secret = k8s_openapi::api::core::v1::Secret::default();
    secret.metadata.name = Some("s".into());
    other.create(&PostParams::default(), &secret).await.unwrap();
    let latest = fake.resource_version();
    tokio::time::advance(Duration::from_secs(61)).await;
    let bookmarked = match next(&mut stream).await {
        Ok(WatchEvent::Bookmark(b)) => b.metadata.resource_version,
        other => panic!("expected a BOOKMARK, got {other:?}"),
    };
    assert_eq!(bookmarked, latest);
    drop(stream);
    // The secret's event is now past the window: resuming from before it is gone...
    tokio::time::advance(Duration::from_secs(60)).await;
    let mut stale = api.watch(&WatchParams::default(), &listed_at).await.unwrap().boxed();
    match next(&mut stale).await {
        Ok(WatchEvent::Error(status)) => assert_eq!(status.code, 410),
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    // ...from the bookmark's version is not.
    let mut resumed = api.watch(&WatchParams::default(), &bookmarked).await.unwrap().boxed();
    api.create(&PostParams::default(), &cm("b", "hpp")).await.unwrap();
    match next(&mut resumed).await {
        Ok(WatchEvent::Added(cm)) => assert_eq!(cm.name_any(), "b"),
        other => panic!("expected the new ConfigMap, got {other:?}"),
    }
}

/// As the API server's watch cache does, a watch that allows bookmarks gets one 2 s before
/// its timeout, with the latest version, so its client resumes from a version seconds old.
#[tokio::test(start_paused = true)]
async fn a_watch_gets_a_bookmark_just_before_its_timeout() {
    let fake = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    let listed_at = fake.resource_version();
    let mut stream = api
        .watch(&WatchParams::default().timeout(30), &listed_at)
        .await
        .unwrap()
        .boxed();
    let other: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(fake.client(), "ns");
    let mut secret = k8s_openapi::api::core::v1::Secret::default();
    secret.metadata.name = Some("s".into());
    other.create(&PostParams::default(), &secret).await.unwrap();
    let latest = fake.resource_version();
    tokio::time::advance(Duration::from_secs(27)).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(500), stream.next())
            .await
            .is_err(),
        "nothing before the last 2 s"
    );
    tokio::time::advance(Duration::from_millis(600)).await;
    match next(&mut stream).await {
        Ok(WatchEvent::Bookmark(b)) => assert_eq!(b.metadata.resource_version, latest),
        other => panic!("expected a BOOKMARK, got {other:?}"),
    }
    tokio::time::advance(Duration::from_secs(3)).await;
    assert!(stream.next().await.is_none(), "the watch ends at its timeout");
}

#[tokio::test]
async fn watch_ends_at_its_timeout() {
    let fake = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    let rv = fake.resource_version();
    let stream = api.watch(&WatchParams::default().timeout(1), &rv).await.unwrap();
    let events: Vec<_> = tokio::time::timeout(GUARD, stream.collect::<Vec<_>>()).await.unwrap();
    assert!(events.is_empty());
}

#[tokio::test]
async fn kube_runtime_watcher_lists_then_follows_changes() {
    let fake = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    api.create(&PostParams::default(), &cm("existing", "hpp"))
        .await
        .unwrap();
    let mut objects = watcher(api.clone(), watcher::Config::default().labels("app=hpp")).boxed();

    let mut initial = Vec::new();
    loop {
        match next(&mut objects).await.unwrap() {
            watcher::Event::Init => {}
            watcher::Event::InitApply(o) => initial.push(o.name_any()),
            watcher::Event::InitDone => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(initial, ["existing"]);

    api.create(&PostParams::default(), &cm("new", "hpp")).await.unwrap();
    api.create(&PostParams::default(), &cm("ignored", "other"))
        .await
        .unwrap();
    api.delete("existing", &DeleteParams::default()).await.unwrap();
    match next(&mut objects).await.unwrap() {
        watcher::Event::Apply(o) => assert_eq!(o.name_any(), "new"),
        other => panic!("unexpected {other:?}"),
    }
    match next(&mut objects).await.unwrap() {
        watcher::Event::Delete(o) => assert_eq!(o.name_any(), "existing"),
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn kube_runtime_watcher_supports_streaming_lists() {
    let fake = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    api.create(&PostParams::default(), &cm("existing", "hpp"))
        .await
        .unwrap();
    let mut objects = watcher(api.clone(), watcher::Config::default().streaming_lists()).boxed();
    let mut initial = Vec::new();
    loop {
        match next(&mut objects).await.unwrap() {
            watcher::Event::Init => {}
            watcher::Event::InitApply(o) => initial.push(o.name_any()),
            watcher::Event::InitDone => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(initial, ["existing"]);
    api.create(&PostParams::default(), &cm("new", "hpp")).await.unwrap();
    match next(&mut objects).await.unwrap() {
        watcher::Event::Apply(o) => assert_eq!(o.name_any(), "new"),
        other => panic!("unexpected {other:?}"),
    }
    let gets: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.method == http::Method::GET)
        .collect();
    assert!(gets.iter().all(|r| r.is_watch()), "no list request was needed");
    assert_eq!(gets[0].query_param("sendInitialEvents").as_deref(), Some("true"));
}

#[tokio::test]
async fn kube_runtime_watcher_relists_after_410_gone() {
    let fake = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    api.create(&PostParams::default(), &cm("a", "hpp")).await.unwrap();
    // The watcher's stream is lazy: after the initial list it only starts its watch when
    // polled again, from a resourceVersion compaction has made too old. It must get 410 Gone,
    // re-list, and still see the new object.
    let mut objects = watcher::watcher(api.clone(), watcher::Config::default())
        .applied_objects()
        .boxed();
    assert_eq!(next(&mut objects).await.unwrap().name_any(), "a");
    fake.compact_history();
    fake.seed(&{
        let mut c = cm("b", "hpp");
        c.metadata.namespace = Some("ns".into());
        c
    });
    fake.compact_history();
    let (mut names, mut gone) = (Vec::new(), 0);
    while !names.contains(&"b".to_string()) {
        match next(&mut objects).await {
            Ok(o) => names.push(o.name_any()),
            Err(watcher::Error::WatchError(s)) if s.code == 410 => gone += 1,
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    assert_eq!(gone, 1, "the stale watch was refused with 410 Gone");
    let relists = fake
        .requests()
        .iter()
        .filter(|r| !r.is_watch() && r.method == http::Method::GET)
        .count();
    assert!(relists >= 2, "the watcher listed again");
}

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;

#[tokio::test]
async fn a_controller_reconciles_objects_served_by_the_fake() {
    let fake = FakeApiServer::new();
    let client = fake.client();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "ns");
    api.create(&PostParams::default(), &cm("one", "hpp")).await.unwrap();

    let count = Arc::new(AtomicUsize::new(0));
    let reconcile = |obj: Arc<ConfigMap>, ctx: Arc<(Api<ConfigMap>, Arc<AtomicUsize>)>| async move {
        ctx.1.fetch_add(1, Ordering::SeqCst);
        let patch = json!({"metadata": {"annotations": {"reconciled": "yes"}}});
        if obj.annotations().get("reconciled").is_none() {
            ctx.0
                .patch(&obj.name_any(), &PatchParams::default(), &Patch::Merge(patch))
                .await
                .map_err(|_| Never)?;
        }
        Ok::<_, Never>(Action::await_change())
    };
    let error_policy = |_: Arc<ConfigMap>, _: &Never, _: Arc<_>| Action::requeue(Duration::from_secs(1));
    let ctx = Arc::new((api.clone(), count.clone()));
    let controller = Controller::new(api.clone(), watcher::Config::default())
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {});
    let handle = tokio::spawn(controller);

    api.create(&PostParams::default(), &cm("two", "hpp")).await.unwrap();
    let annotated = |f: &FakeApiServer| {
        ["one", "two"].iter().all(|n| {
            f.get::<ConfigMap>(Some("ns"), n).is_some_and(|c| {
                c.meta()
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key("reconciled"))
            })
        })
    };
    tokio::time::timeout(GUARD, fake.wait_until(annotated))
        .await
        .expect("controller reconciled both");
    assert!(count.load(Ordering::SeqCst) >= 2);
    handle.abort();
}

#[tokio::test]
async fn await_condition_and_the_event_recorder_work_against_the_fake() {
    use k8s_openapi::api::events::v1::Event as K8sEvent;
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    use kube::runtime::wait::await_condition;

    let fake = FakeApiServer::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    let created = api.create(&PostParams::default(), &cm("a", "hpp")).await.unwrap();

    let waiter = tokio::spawn(await_condition(api.clone(), "a", |o: Option<&ConfigMap>| {
        o.and_then(|c| c.data.as_ref()).is_some_and(|d| d.contains_key("ready"))
    }));
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"ready": "yes"}})),
    )
    .await
    .unwrap();
    let done = tokio::time::timeout(GUARD, waiter).await.unwrap().unwrap().unwrap();
    assert!(done.unwrap().data.unwrap().contains_key("ready"));

    let recorder = Recorder::new(
        fake.client(),
        Reporter {
            controller: "hpp-operator".into(),
            instance: None,
        },
    );
    let event = Event {
        type_: EventType::Normal,
        reason: "DeployStarted".into(),
        note: Some("deploying".into()),
        action: "Reconcile".into(),
        secondary: None,
    };
    let reference = created.object_ref(&());
    recorder.publish(&event, &reference).await.unwrap();
    recorder.publish(&event, &reference).await.unwrap();
    let events = fake.list::<K8sEvent>();
    assert_eq!(events.len(), 1, "the repeat is folded into a series");
    assert_eq!(events[0].reason.as_deref(), Some("DeployStarted"));
    assert_eq!(events[0].series.as_ref().map(|s| s.count), Some(2));
}
