//! The CRD committed in `deploy/` is the one the types generate.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::path::PathBuf;

use hpp_api::crd::{CRD_FILE, crd, crd_yaml};

const BLESS: &str = "HPP_BLESS=1 cargo test -p xtask --test deploy_crd";

#[test]
fn deploy_crd_is_up_to_date() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(CRD_FILE);
    let generated = crd_yaml().unwrap();
    if std::env::var_os("HPP_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{} cannot be read ({e}); regenerate it with: {BLESS}", path.display()));
    let committed: serde_json::Value = serde_saphyr::from_str(&committed).unwrap();
    let generated: serde_json::Value = serde_saphyr::from_str(&generated).unwrap();
    assert!(
        committed == generated,
        "{CRD_FILE} is out of date; regenerate it with: {BLESS}"
    );
}

#[test]
fn crd_shape() {
    let crd = serde_json::to_value(crd().unwrap()).unwrap();
    let spec = &crd["spec"];
    assert_eq!(
        crd["metadata"]["name"],
        "hostpathprovisioners.hostpathprovisioner.kubevirt.io"
    );
    assert_eq!(spec["scope"], "Cluster");
    assert_eq!(spec["names"]["shortNames"][0], "hpp");
    let versions = spec["versions"].as_array().unwrap();
    let by_name = |n: &str| versions.iter().find(|v| v["name"] == n).unwrap().clone();
    let (alpha, beta) = (by_name("v1alpha1"), by_name("v1beta1"));
    // Not served without the conversion webhook: relabelling alone would lose pools and gates.
    assert_eq!(
        (alpha["served"].clone(), alpha["storage"].clone()),
        (false.into(), false.into())
    );
    assert_eq!(
        (beta["served"].clone(), beta["storage"].clone()),
        (true.into(), true.into())
    );
    assert!(beta["subresources"]["status"].is_object());
    let columns: Vec<_> = beta["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].clone())
        .collect();
    assert_eq!(columns, ["Available", "Progressing", "Degraded", "Age"]);
    // garde bounds land in the schema.
    let pool = &beta["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["storagePools"]["items"];
    assert_eq!(pool["properties"]["name"]["maxLength"], 50);
    assert_eq!(pool["properties"]["path"]["maxLength"], 255);
    // v1alpha1 requires pathConfig.
    let alpha_spec = &alpha["schema"]["openAPIV3Schema"]["properties"]["spec"];
    assert!(
        alpha_spec["required"]
            .as_array()
            .unwrap()
            .contains(&"pathConfig".into())
    );
}

/// Paths of every string, array and map under `schema` that has no upper bound.
fn unbounded(schema: &serde_json::Value, path: &str, out: &mut Vec<String>) {
    let ty = schema["type"].as_str().unwrap_or_default();
    let missing = match ty {
        "string" => schema.get("enum").is_none() && schema.get("maxLength").is_none(),
        "array" => schema.get("maxItems").is_none(),
        "object" => schema["additionalProperties"].is_object() && schema.get("maxProperties").is_none(),
        _ => false,
    };
    if missing {
        out.push(path.to_owned());
    }
    if let Some(props) = schema["properties"].as_object() {
        for (k, v) in props {
            unbounded(v, &format!("{path}.{k}"), out);
        }
    }
    for key in ["items", "additionalProperties"] {
        if schema[key].is_object() {
            unbounded(&schema[key], &format!("{path}[{key}]"), out);
        }
    }
}

#[test]
fn every_spec_string_list_and_map_is_bounded() {
    let crd = serde_json::to_value(crd().unwrap()).unwrap();
    for version in crd["spec"]["versions"].as_array().unwrap() {
        let spec = &version["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let mut out = Vec::new();
        unbounded(spec, "spec", &mut out);
        assert!(out.is_empty(), "{}: unbounded {out:?}", version["name"]);
    }
    let beta = crd["spec"]["versions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "v1beta1")
        .unwrap();
    let spec = &beta["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    assert_eq!(spec["storagePools"]["maxItems"], hpp_api::constants::MAX_STORAGE_POOLS);
    assert_eq!(spec["featureGates"]["maxItems"], hpp_api::constants::MAX_FEATURE_GATES);
}
