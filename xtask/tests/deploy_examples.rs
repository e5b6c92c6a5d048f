//! The example CRs shipped in `deploy/examples/` (the KubeVirt samples) deserialize and validate.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::path::PathBuf;

use hpp_api::v1beta1::HostPathProvisioner;
use hpp_api::validation::ValidateCreate;

fn load(name: &str) -> HostPathProvisioner {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/examples")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn local_pool() {
    let hpp = load("hostpathprovisioner_cr.yaml");
    hpp.validate_create().unwrap();
    let pools = hpp.spec.storage_pools.as_ref().unwrap();
    assert_eq!(
        (pools[0].name.as_str(), pools[0].path.as_str()),
        ("local", "/var/hpvolumes")
    );
    let placement = hpp.spec.workload.as_ref().unwrap();
    assert_eq!(placement.node_selector.as_ref().unwrap()["kubernetes.io/os"], "linux");
}

#[test]
fn legacy_path_config() {
    let hpp = load("hostpathprovisioner_legacy_cr.yaml");
    hpp.validate_create().unwrap();
    let pc = hpp.spec.path_config.as_ref().unwrap();
    assert_eq!(pc.path, "/var/hpvolumes");
    assert_eq!(pc.use_naming_prefix, Some(false));
}

#[test]
fn pvc_template_pool() {
    let hpp = load("hostpathprovisioner_pvctemplate_cr.yaml");
    hpp.validate_create().unwrap();
    let pool = &hpp.spec.storage_pools.as_ref().unwrap()[0];
    let template = pool.pvc_template.as_ref().unwrap();
    assert_eq!(template.volume_mode.as_deref(), Some("Block"));
    assert!(!pool.is_shared());
}

#[test]
fn rwx_overlay_pool_with_snapshots() {
    let hpp = load("hostpathprovisioner_overlay_csi_cr.yaml");
    hpp.validate_create().unwrap();
    let pool = &hpp.spec.storage_pools.as_ref().unwrap()[0];
    assert!(pool.is_shared());
    assert_eq!(pool.snapshot_provider.as_deref(), Some("reflink"));
    assert!(hpp_api::validation::snapshotting_enabled(&hpp.spec));
}
