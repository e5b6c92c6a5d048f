//! Renders the custom distribution offline and checks its images, namespace and replaced step.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

#[path = "../custom_distribution.rs"]
mod example;

#[test]
fn the_distribution_replaces_one_step_in_place_and_uses_its_images() {
    let names = example::pipeline().unwrap().names().join(",");
    assert_eq!(
        names,
        hpp_reconcile::Pipeline::standard().names().join(","),
        "replace keeps the position and the name"
    );

    let objects = example::render(&example::example_cr()).unwrap();
    let ds = objects
        .iter()
        .find(|o| o.kind.kind == "DaemonSet")
        .expect("a CSI DaemonSet");
    assert_eq!(ds.object.metadata.namespace.as_deref(), Some("acme-storage"));
    assert_eq!(
        ds.object.metadata.labels.as_ref().unwrap()[example::TEAM_LABEL],
        "storage"
    );
    let value = ds.to_value().unwrap();
    let images: Vec<&str> = value["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["image"].as_str())
        .collect();
    assert!(
        images.contains(&"registry.example.com/acme/hpp-csi-driver:1.0"),
        "{images:?}"
    );
    // The typed edit: the toleration and the sidecar, after everything the step builds.
    let pod = &value["spec"]["template"]["spec"];
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.last().unwrap()["name"], example::LOG_SHIPPER);
    assert!(containers.len() > 1, "the step's own containers are kept");
    assert_eq!(containers[0]["name"], "hostpath-provisioner");
    let tolerations = pod["tolerations"].as_array().unwrap();
    assert_eq!(tolerations.last().unwrap()["key"], example::STORAGE_NODE_TAINT);
    // Other steps are untouched: the CSIDriver does not get the label.
    let driver = objects.iter().find(|o| o.kind.kind == "CSIDriver").unwrap();
    assert!(
        driver
            .object
            .metadata
            .labels
            .as_ref()
            .is_none_or(|l| !l.contains_key(example::TEAM_LABEL))
    );
}
