//! Problems outside the operator's own objects reach the admin where they look: Events on the
//! object at fault, a condition on the CR, a metric.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

mod support;

use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::storage::v1::StorageClass;
use serde_json::json;
use support::Env;

fn class(name: &str, provisioner: &str, pool: &str) -> StorageClass {
    serde_json::from_value(json!({
        "metadata": { "name": name },
        "provisioner": provisioner,
        "volumeBindingMode": "WaitForFirstConsumer",
        "parameters": { "storagePool": pool },
    }))
    .unwrap()
}

fn warnings(env: &Env, reason: &str) -> Vec<Event> {
    env.fake
        .list::<Event>()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason) && e.type_.as_deref() == Some("Warning"))
        .collect()
}

fn gauge(env: &Env, class: &str) -> Option<i64> {
    let mut registry = prometheus_client::registry::Registry::default();
    // Encode the operator's family directly: one series per flagged class.
    registry.register(
        "unknown_pool",
        "test",
        env.ctx.metrics.storageclass_unknown_pool.clone(),
    );
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
    out.lines()
        .find(|l| l.contains(&format!("storageclass=\"{class}\"")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test]
async fn a_class_naming_an_unknown_pool_is_reported_on_the_class_the_cr_and_the_metric() {
    let env = Env::new("hostpathprovisioner_cr", &["node01"]);
    env.fake
        .seed(&class("typo", "kubevirt.io.hostpath-provisioner", "nope"));
    env.fake
        .seed(&class("fine", "kubevirt.io.hostpath-provisioner", "local"));
    env.fake.seed(&class("other-driver", "example.com/other", "nope"));
    env.converge().await;

    let (status, reason, message) = env.condition("StorageClassesValid");
    assert_eq!(
        (status.as_str(), reason.as_deref()),
        ("False", Some("UnknownStoragePool"))
    );
    let message = message.unwrap();
    assert!(
        message.contains("typo") && message.contains("\"nope\"") && message.contains("configured pools: local"),
        "{message}"
    );
    let events = warnings(&env, "UnknownStoragePool");
    assert_eq!(events.len(), 1, "one Event, on the class at fault: {events:?}");
    let regarding = events[0].regarding.clone().unwrap();
    assert_eq!(
        (regarding.kind.as_deref(), regarding.name.as_deref()),
        (Some("StorageClass"), Some("typo"))
    );
    assert_eq!(gauge(&env, "typo"), Some(1));
    assert_eq!(gauge(&env, "fine"), None);
    assert_eq!(
        gauge(&env, "other-driver"),
        None,
        "other drivers' classes are not ours to judge"
    );

    // More passes do not repeat the Event.
    env.pass().await.unwrap();
    assert_eq!(warnings(&env, "UnknownStoragePool").len(), 1);

    // The admin fixes the class: condition True, series gone.
    env.fake.remove::<StorageClass>(None, "typo");
    env.fake
        .seed(&class("typo", "kubevirt.io.hostpath-provisioner", "local"));
    env.converge().await;
    let (status, reason, _) = env.condition("StorageClassesValid");
    assert_eq!((status.as_str(), reason.as_deref()), ("True", Some("AllPoolsKnown")));
    assert_eq!(gauge(&env, "typo"), None);
}

fn driver_pod(name: &str, node: &str, message: &str) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": support::NS,
                      "labels": { "k8s-app": "hostpath-provisioner" } },
        "spec": { "nodeName": node, "containers": [{ "name": "hostpath-provisioner" }] },
        "status": { "phase": "Pending", "containerStatuses": [{
            "name": "hostpath-provisioner", "ready": false, "restartCount": 0, "image": "x", "imageID": "",
            "state": { "waiting": { "reason": "CreateContainerError", "message": message } },
        }] },
    }))
    .unwrap()
}

#[tokio::test]
async fn a_pool_path_on_a_private_mount_is_named_with_its_node_and_fix() {
    let env = Env::new("hostpathprovisioner_cr", &["node01", "node02"]);
    env.converge().await;
    let (status, ..) = env.condition("PoolMountsShared");
    assert_eq!(status, "True");
    env.fake.seed(&driver_pod(
        "hostpath-provisioner-csi-abcde",
        "node02",
        "Error: failed to generate container \"c1\" spec: failed to generate spec: path \"/var/hpvolumes\" \
         is mounted on \"/\" but it is not a shared or slave mount",
    ));
    env.fake.seed(&driver_pod(
        "hostpath-provisioner-csi-fghij",
        "node01",
        "back-off pulling image",
    ));
    env.converge().await;
    let (status, reason, message) = env.condition("PoolMountsShared");
    assert_eq!(
        (status.as_str(), reason.as_deref()),
        ("False", Some("PoolMountNotShared"))
    );
    let message = message.unwrap();
    assert!(
        message.contains("node node02")
            && message.contains("/var/hpvolumes")
            && message.contains("mount --make-rshared /"),
        "{message}"
    );
    assert!(!message.contains("node01"), "{message}");
    let events = warnings(&env, "PoolMountNotShared");
    assert_eq!(events.len(), 1, "{events:?}");
    let regarding = events[0].regarding.clone().unwrap();
    assert_eq!(regarding.kind.as_deref(), Some("HostPathProvisioner"));
    assert_eq!(events[0].note.as_deref(), Some(message.as_str()));
    // The node is fixed and the pod restarted: back to True.
    env.fake
        .remove::<k8s_openapi::api::core::v1::Pod>(Some(support::NS), "hostpath-provisioner-csi-abcde");
    env.converge().await;
    assert_eq!(env.condition("PoolMountsShared").0, "True");
}
