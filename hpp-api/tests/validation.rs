//! Each validation rule, accepted and rejected, with the exact JSON field path.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use hpp_api::v1beta1::{HostPathProvisionerSpec, PathConfig, StoragePool};
use hpp_api::validation::{ValidateCreate, ValidateUpdate, ValidationErrors};

fn pool(name: &str, path: &str) -> StoragePool {
    StoragePool {
        name: name.into(),
        path: path.into(),
        ..Default::default()
    }
}

fn pools(list: &[(&str, &str)]) -> HostPathProvisionerSpec {
    HostPathProvisionerSpec {
        storage_pools: Some(list.iter().map(|(n, p)| pool(n, p)).collect()),
        ..Default::default()
    }
}

fn legacy(path: &str) -> HostPathProvisionerSpec {
    HostPathProvisionerSpec {
        path_config: Some(PathConfig {
            path: path.into(),
            use_naming_prefix: None,
        }),
        ..Default::default()
    }
}

/// Asserts that validation fails with exactly one error, at `path`, whose message contains `needle`.
fn rejected(result: Result<(), ValidationErrors>, path: &str, needle: &str) {
    let errors = result.expect_err("expected a validation error");
    assert_eq!(errors.errors().len(), 1, "expected one error, got: {errors}");
    let e = &errors.errors()[0];
    assert_eq!(e.path, path, "wrong path in: {errors}");
    assert!(e.message.contains(needle), "message {:?} lacks {needle:?}", e.message);
}

#[test]
fn valid_pools_and_legacy_are_accepted() {
    pools(&[("local", "/var/hpvolumes"), ("fast", "/mnt/fast")])
        .validate_create()
        .unwrap();
    legacy("/var/hpvolumes").validate_create().unwrap();
}

#[test]
fn exactly_one_of_path_config_and_storage_pools() {
    let mut both = pools(&[("local", "/var/hpvolumes")]);
    both.path_config = Some(PathConfig {
        path: "/var/other".into(),
        use_naming_prefix: None,
    });
    rejected(both.validate_create(), "spec.storagePools", "pathConfig");
    rejected(
        HostPathProvisionerSpec::default().validate_create(),
        "spec",
        "must be set",
    );
    // An empty pool list counts as unset, as in KubeVirt.
    rejected(pools(&[]).validate_create(), "spec", "must be set");
}

#[test]
fn path_config_path_must_be_set_and_absolute() {
    rejected(legacy("").validate_create(), "spec.pathConfig.path", "must be set");
    rejected(
        legacy("var/hpvolumes").validate_create(),
        "spec.pathConfig.path",
        "absolute",
    );
}

#[test]
fn pool_name_length_and_shape() {
    rejected(
        pools(&[("", "/a")]).validate_create(),
        "spec.storagePools[0].name",
        "length",
    );
    let long = "a".repeat(51);
    rejected(
        pools(&[(&long, "/a")]).validate_create(),
        "spec.storagePools[0].name",
        "length",
    );
    pools(&[(&"a".repeat(50), "/a")]).validate_create().unwrap();
    rejected(
        pools(&[("ok", "/a"), ("Bad_Name", "/b")]).validate_create(),
        "spec.storagePools[1].name",
        "lower case",
    );
}

#[test]
fn pool_path_length_and_shape() {
    rejected(
        pools(&[("a", "")]).validate_create(),
        "spec.storagePools[0].path",
        "length",
    );
    let long = format!("/{}", "p".repeat(255));
    rejected(
        pools(&[("a", &long)]).validate_create(),
        "spec.storagePools[0].path",
        "length",
    );
    pools(&[("a", &format!("/{}", "p".repeat(254)))])
        .validate_create()
        .unwrap();
    for (bad, needle) in [
        ("relative/path", "absolute"),
        ("/", "root"),
        ("/var/hpvolumes/", "end with"),
        ("/var//hpvolumes", "duplicate"),
        ("/var/../etc", "'..'"),
        ("/var/./hp", "'.'"),
    ] {
        rejected(
            pools(&[("ok", "/ok"), ("a", bad)]).validate_create(),
            "spec.storagePools[1].path",
            needle,
        );
    }
}

#[test]
fn pool_names_and_paths_are_unique() {
    rejected(
        pools(&[("a", "/x"), ("b", "/y"), ("a", "/z")]).validate_create(),
        "spec.storagePools[2].name",
        "spec.storagePools[0].name",
    );
    rejected(
        pools(&[("a", "/x"), ("b", "/x")]).validate_create(),
        "spec.storagePools[1].path",
        "spec.storagePools[0].path",
    );
}

#[test]
fn pool_paths_do_not_nest() {
    rejected(
        pools(&[("outer", "/data"), ("inner", "/data/fast")]).validate_create(),
        "spec.storagePools[1].path",
        "nested",
    );
    // Order does not matter, and a shared prefix that is not a directory boundary is fine.
    rejected(
        pools(&[("inner", "/data/fast"), ("outer", "/data")]).validate_create(),
        "spec.storagePools[0].path",
        "nested",
    );
    pools(&[("a", "/data"), ("b", "/data2")]).validate_create().unwrap();
}

#[test]
fn snapshot_provider_must_be_known() {
    let mut spec = pools(&[("a", "/x")]);
    spec.storage_pools.as_mut().unwrap()[0].snapshot_provider = Some("reflink".into());
    spec.validate_create().unwrap();
    spec.storage_pools.as_mut().unwrap()[0].snapshot_provider = Some("btrfs".into());
    spec.validate_create().unwrap();
    spec.storage_pools.as_mut().unwrap()[0].snapshot_provider = Some("zfs".into());
    rejected(
        spec.validate_create(),
        "spec.storagePools[0].snapshotProvider",
        "reflink",
    );
}

#[test]
fn feature_gates_must_be_known() {
    let mut spec = pools(&[("a", "/x")]);
    spec.feature_gates = Some(vec!["Snapshotting".into()]);
    spec.validate_create().unwrap();
    spec.feature_gates = Some(vec!["Snapshotting".into(), "Teleport".into()]);
    rejected(spec.validate_create(), "spec.featureGates[1]", "Snapshotting");
}

/// The gate without a pool that takes snapshots is accepted (as KubeVirt does) with a warning.
#[test]
fn snapshotting_without_a_snapshot_provider_is_accepted_with_a_warning() {
    use hpp_api::validation::{WARNING_SNAPSHOTS_OFF, warnings};
    let mut spec = pools(&[("a", "/x")]);
    assert!(warnings(&spec).is_empty());
    spec.feature_gates = Some(vec!["Snapshotting".into()]);
    spec.validate_create().unwrap();
    assert_eq!(warnings(&spec), [WARNING_SNAPSHOTS_OFF]);
    spec.storage_pools.as_mut().unwrap()[0].snapshot_provider = Some("reflink".into());
    assert!(warnings(&spec).is_empty());
    let legacy = HostPathProvisionerSpec {
        path_config: Some(PathConfig {
            path: "/var/hpvolumes".into(),
            ..Default::default()
        }),
        feature_gates: Some(vec!["Snapshotting".into()]),
        ..Default::default()
    };
    legacy.validate_create().unwrap();
    assert_eq!(warnings(&legacy), [WARNING_SNAPSHOTS_OFF]);
}

#[test]
fn image_pull_policy_and_overlay_class_name() {
    let mut spec = pools(&[("a", "/x")]);
    spec.image_pull_policy = Some("Sometimes".into());
    rejected(spec.validate_create(), "spec.imagePullPolicy", "IfNotPresent");
    spec.image_pull_policy = Some("Always".into());
    spec.storage_pools.as_mut().unwrap()[0].overlay_class_name = Some("Not_A_Name".into());
    rejected(
        spec.validate_create(),
        "spec.storagePools[0].overlayClassName",
        "StorageClass",
    );
}

#[test]
fn every_error_is_reported_at_once() {
    let spec = pools(&[("Bad", "rel"), ("ok", "/x"), ("ok", "/x")]);
    let errors = spec.validate_create().unwrap_err();
    for path in [
        "spec.storagePools[0].name",
        "spec.storagePools[0].path",
        "spec.storagePools[2].name",
        "spec.storagePools[2].path",
    ] {
        assert!(errors.has_path(path), "{path} missing from {errors}");
    }
}

#[test]
fn pool_path_cannot_change_while_pool_exists() {
    let old = pools(&[("a", "/x"), ("b", "/y")]);
    rejected(
        pools(&[("a", "/x"), ("b", "/z")]).validate_update(&old),
        "spec.storagePools[1].path",
        "cannot change",
    );
    // Adding, removing and reordering pools is fine; so is reusing a removed pool's path.
    pools(&[("b", "/y"), ("c", "/x")]).validate_update(&old).unwrap();
    pools(&[("b", "/y"), ("a", "/x"), ("d", "/w")])
        .validate_update(&old)
        .unwrap();
}

#[test]
fn path_config_path_cannot_change() {
    rejected(
        legacy("/b").validate_update(&legacy("/a")),
        "spec.pathConfig.path",
        "cannot change",
    );
    // Moving from pathConfig to storage pools is allowed.
    pools(&[("a", "/b")]).validate_update(&legacy("/a")).unwrap();
}

#[test]
fn update_tolerates_problems_the_old_object_already_had() {
    // A CR an older release accepted (relative path) can still be edited, e.g. to add a gate.
    let old = legacy("relative");
    let mut new = legacy("relative");
    new.feature_gates = Some(vec!["Snapshotting".into()]);
    new.validate_update(&old).unwrap();
    // New problems are still caught.
    new.feature_gates = Some(vec!["Bogus".into()]);
    rejected(new.validate_update(&old), "spec.featureGates[0]", "unknown");
}

fn identical(n: usize) -> HostPathProvisionerSpec {
    let p: Vec<(&str, &str)> = (0..n).map(|_| ("local", "/var/hpvolumes")).collect();
    pools(&p)
}

#[test]
fn three_thousand_identical_pools_fail_fast_with_one_bounded_error() {
    // Before: 9 million errors and gigabytes of message for this 75 KB body.
    let errors = identical(3000).validate_create().unwrap_err();
    assert_eq!(errors.errors().len(), 1, "{errors}");
    assert!(errors.has_path("spec.storagePools"));
    assert!(errors.to_string().contains("at most 64"), "{errors}");
    assert!(errors.to_string().len() < 200);
    // UPDATE of the same object: the count error is tolerated (ratcheting) and nothing is walked.
    let spec = identical(3000);
    let update = spec.validate_update(&spec);
    assert!(update.is_ok(), "{update:?}");
}

#[test]
fn duplicates_are_reported_once_per_pool_and_capped() {
    let max = hpp_api::constants::MAX_STORAGE_POOLS;
    let errors = identical(max).validate_create().unwrap_err();
    // One name and one path error per repeated pool (2 * 63), not one per pair (2 * 2016).
    assert_eq!(errors.errors().len() + errors.omitted(), 2 * (max - 1), "{errors}");
    assert_eq!(errors.errors().len(), hpp_api::constants::MAX_REPORTED_ERRORS);
    assert!(
        errors
            .to_string()
            .ends_with(&format!("; and {} more", 2 * (max - 1) - 20)),
        "{errors}"
    );
    assert!(errors.to_string().contains("already used by spec.storagePools[0].name"));
}

#[test]
fn update_of_a_spec_with_many_duplicates_compares_error_sets() {
    // Before: quadratic `contains` over quadratic error lists (25 s of CPU for 300 pools).
    let max = hpp_api::constants::MAX_STORAGE_POOLS;
    let old = identical(max);
    assert!(old.validate_update(&old).is_ok());
    let mut new = old.clone();
    new.storage_pools.as_mut().unwrap()[3].path = "relative".into();
    let errors = new.validate_update(&old).unwrap_err();
    assert!(errors.has_path("spec.storagePools[3].path"), "{errors}");
}

#[test]
fn nested_pools_report_one_error_per_inner_pool() {
    let paths: Vec<String> = (1..=10).map(|d| "/a".repeat(d)).collect();
    let p: Vec<(String, &str)> = paths
        .iter()
        .enumerate()
        .map(|(i, p)| (format!("p{i}"), p.as_str()))
        .collect();
    let p: Vec<(&str, &str)> = p.iter().map(|(n, path)| (n.as_str(), *path)).collect();
    let errors = pools(&p).validate_create().unwrap_err();
    assert_eq!(errors.errors().len() + errors.omitted(), 9, "{errors}");
}

#[test]
fn the_largest_admitted_spec_is_valid_and_at_the_limits() {
    use hpp_api::validation::worst_case;
    let spec = worst_case::largest_admitted();
    let pools = spec.storage_pools.as_ref().unwrap();
    assert_eq!(pools.len(), hpp_api::constants::MAX_STORAGE_POOLS);
    assert!(pools.iter().all(|p| p.name.len() == 50 && p.path.len() >= 250));
    spec.validate_create().unwrap();
    spec.validate_update(&spec).unwrap();
    // One more pool is refused with a single error.
    let mut over = spec.clone();
    over.storage_pools.as_mut().unwrap().push(pool("extra", "/extra"));
    let errors = over.validate_create().unwrap_err();
    assert_eq!(errors.errors().len(), 1, "{errors}");
}

#[test]
fn ephemeral_quota_and_overcommit_settings_are_validated_with_their_paths() {
    use hpp_api::quota::QuotaMode;
    use hpp_api::v1beta1::EphemeralVolumes;
    let with = |f: &dyn Fn(&mut StoragePool)| {
        let mut spec = pools(&[("local", "/var/hpvolumes")]);
        f(&mut spec.storage_pools.as_mut().unwrap()[0]);
        spec
    };
    with(&|p| {
        p.ephemeral = Some(EphemeralVolumes {
            allowed: Some(false),
            max_size: Some("10Gi".into()),
        });
        p.quota = Some(QuotaMode::Btrfs);
        p.overcommit_percent = Some(150);
    })
    .validate_create()
    .unwrap();
    for bad in ["ten gigs", "0", "-1Gi", ""] {
        rejected(
            with(&|p| {
                p.ephemeral = Some(EphemeralVolumes {
                    allowed: None,
                    max_size: Some(bad.into()),
                })
            })
            .validate_create(),
            "spec.storagePools[0].ephemeral.maxSize",
            "quantity",
        );
    }
    for bad in [0, 1001] {
        rejected(
            with(&|p| p.overcommit_percent = Some(bad)).validate_create(),
            "spec.storagePools[0].overcommitPercent",
            "from 1 to 1000",
        );
    }
    with(&|p| p.overcommit_percent = Some(1000)).validate_create().unwrap();
    // The wire spelling of every quota mode is what the driver's --datadir reads.
    let spec: HostPathProvisionerSpec = serde_json::from_value(serde_json::json!({
        "storagePools": [{"name": "local", "path": "/var/hpvolumes", "quota": "xfs-project",
                          "overcommitPercent": 200, "ephemeral": {"allowed": true, "maxSize": "1Gi"}}]
    }))
    .unwrap();
    let p = &spec.storage_pools.as_ref().unwrap()[0];
    assert_eq!(p.quota, Some(QuotaMode::XfsProject));
    assert_eq!(p.ephemeral.as_ref().unwrap().max_bytes(), Some(1 << 30));
    assert!(
        serde_json::from_value::<HostPathProvisionerSpec>(serde_json::json!({
            "storagePools": [{"name": "local", "path": "/p", "quota": "zfs"}]
        }))
        .is_err()
    );
}

/// Issue 28: `trash.retention` is a duration (the parser says why one is not) and
/// `trash.minFreePercent` is 0 to 99, each reported at its own path; a percentage without a
/// retention is accepted with a warning.
#[test]
fn trash_settings_are_validated_with_their_paths() {
    use hpp_api::v1beta1::PoolTrash;
    let with = |retention: Option<&str>, min_free_percent: Option<u32>| {
        let mut spec = pools(&[("local", "/var/hpvolumes")]);
        spec.storage_pools.as_mut().unwrap()[0].trash = Some(PoolTrash {
            retention: retention.map(Into::into),
            min_free_percent,
        });
        spec
    };
    for ok in ["72h", "1h30m", "7d", "0", " 10s "] {
        with(Some(ok), None).validate_create().unwrap();
    }
    with(Some("72h"), Some(0)).validate_create().unwrap();
    with(Some("72h"), Some(99)).validate_create().unwrap();
    rejected(
        with(Some("three days"), None).validate_create(),
        "spec.storagePools[0].trash.retention",
        "is not a duration",
    );
    rejected(
        with(Some(""), None).validate_create(),
        "spec.storagePools[0].trash.retention",
        "e.g. 30s",
    );
    rejected(
        with(Some("100000h"), None).validate_create(),
        "spec.storagePools[0].trash.retention",
        "maximum of 10 years",
    );
    rejected(
        with(Some("72h"), Some(100)).validate_create(),
        "spec.storagePools[0].trash.minFreePercent",
        "from 0 to 99",
    );
    // The wire spelling, and the warning for a percentage that does nothing.
    let spec: HostPathProvisionerSpec = serde_json::from_value(serde_json::json!({
        "storagePools": [{"name": "local", "path": "/p", "trash": {"retention": "72h", "minFreePercent": 5}},
                         {"name": "other", "path": "/q", "trash": {"minFreePercent": 5}}]
    }))
    .unwrap();
    spec.validate_create().unwrap();
    let pools = spec.storage_pools.as_ref().unwrap();
    assert!(pools[0].trash.as_ref().unwrap().is_on());
    assert!(!pools[1].trash.as_ref().unwrap().is_on());
    let warnings = hpp_api::validation::warnings(&spec);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].starts_with("spec.storagePools[1].trash.minFreePercent: has no effect"),
        "{warnings:?}"
    );
}

/// Issue 28, part 3: `volumeAudit.interval` is a duration of at least a minute (default 10m),
/// reported at its own path.
#[test]
fn volume_audit_interval_is_a_duration_of_at_least_a_minute() {
    use hpp_api::v1beta1::VolumeAudit;
    use std::time::Duration;
    let with = |interval: Option<&str>| {
        let mut spec = pools(&[("local", "/var/hpvolumes")]);
        spec.volume_audit = Some(VolumeAudit {
            interval: interval.map(Into::into),
        });
        spec
    };
    for ok in [None, Some("1m"), Some("10m"), Some("1h30m"), Some("7d")] {
        with(ok).validate_create().unwrap();
    }
    assert_eq!(VolumeAudit::default().interval(), Ok(Duration::from_secs(600)));
    assert_eq!(
        VolumeAudit {
            interval: Some("1h".into())
        }
        .interval(),
        Ok(Duration::from_secs(3600))
    );
    rejected(
        with(Some("30s")).validate_create(),
        "spec.volumeAudit.interval",
        "shorter than the minimum of 1m",
    );
    rejected(
        with(Some("often")).validate_create(),
        "spec.volumeAudit.interval",
        "is not a duration",
    );
    rejected(
        with(Some("0")).validate_create(),
        "spec.volumeAudit.interval",
        "minimum of 1m",
    );
    // The wire spelling.
    let spec: HostPathProvisionerSpec = serde_json::from_value(serde_json::json!({
        "storagePools": [{"name": "local", "path": "/p"}], "volumeAudit": {}
    }))
    .unwrap();
    assert_eq!(spec.volume_audit, Some(VolumeAudit::default()));
}
