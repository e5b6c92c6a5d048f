//! What the operator needs to know about the pool pods it wrote (node, mount path, mount or
//! unmount) is recorded in annotations and read back from there, never parsed out of pod specs;
//! objects an older operator wrote without them are re-rendered when still wanted.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

mod support;

use hpp_reconcile::names;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use serde_json::json;
use support::{Env, NS};

fn mounter(name: &str, pool: &str, annotations: serde_json::Value) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {
                "hpp-pool": format!("{pool}-hpp"),
                "kubevirt.io.hostpath-provisioner/storagePool": format!("{pool}-hpp"),
                "app.kubernetes.io/managed-by": "hostpath-provisioner-operator",
            },
            "annotations": annotations,
        },
        // A pod spec that says nothing about the node or the mount path.
        "spec": {
            "selector": { "matchLabels": { "hpp-pool": format!("{pool}-hpp") } },
            "template": { "spec": { "containers": [{ "name": "mounter", "image": "custom" }] } },
        },
    }))
    .unwrap()
}

#[tokio::test]
async fn a_removed_pools_mounter_is_unmounted_where_its_annotations_say() {
    let env = Env::new("hostpathprovisioner_pvctemplate_cr", &["node01"]);
    env.fake.seed(&mounter(
        "hpp-pool-gone-node01",
        "gone",
        json!({
            names::ANNOTATION_POOL_ACTION: names::POOL_ACTION_MOUNT,
            names::ANNOTATION_POOL_NODE: "node01",
            names::ANNOTATION_POOL_MOUNT_PATH: "/var/gone/csi",
        }),
    ));
    env.converge().await;
    let job = env
        .fake
        .get::<Job>(Some(NS), "cleanup-pool-gone-node01")
        .expect("an unmount Job from the recorded node and path");
    let annotations = job.metadata.annotations.clone().unwrap();
    assert_eq!(annotations[names::ANNOTATION_POOL_ACTION], names::POOL_ACTION_UNMOUNT);
    assert_eq!(annotations[names::ANNOTATION_POOL_NODE], "node01");
    let args = job.spec.unwrap().template.spec.unwrap().containers[0]
        .args
        .clone()
        .unwrap();
    assert_eq!(args[..3], ["--unmount", "--mountPath", "/var/gone/csi"]);
    // The Job is recognised as the pool's cleanup Job on the next pass (from its annotations):
    // it is kept, not swept, until it succeeds.
    env.pass().await.unwrap();
    assert!(env.fake.get::<Job>(Some(NS), "cleanup-pool-gone-node01").is_some());
}

#[tokio::test]
async fn a_mounter_written_without_annotations_is_re_rendered_with_them() {
    let env = Env::new("hostpathprovisioner_pvctemplate_cr", &["node01"]);
    // An older operator's mounter of a pool that is still wanted.
    env.fake.seed(&mounter("hpp-pool-local-node01", "local", json!({})));
    env.converge().await;
    let d = env.fake.get::<Deployment>(Some(NS), "hpp-pool-local-node01").unwrap();
    let annotations = d.metadata.annotations.unwrap();
    assert_eq!(annotations[names::ANNOTATION_POOL_ACTION], names::POOL_ACTION_MOUNT);
    assert_eq!(annotations[names::ANNOTATION_POOL_NODE], "node01");
    assert_eq!(annotations[names::ANNOTATION_POOL_MOUNT_PATH], "/var/hpvolumes/csi");
    // An older operator's mounter of a pool that is gone: unknown node, so no unmount Job is
    // guessed; the sweep removes it.
    env.fake.seed(&mounter("hpp-pool-old-node01", "old", json!({})));
    env.converge().await;
    assert!(env.fake.get::<Deployment>(Some(NS), "hpp-pool-old-node01").is_none());
    assert!(env.names::<Job>().is_empty(), "{:?}", env.names::<Job>());
}
