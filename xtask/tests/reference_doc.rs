//! Keeps docs/reference.md true to the code: the generated blocks (built by `cargo xtask docs`,
//! see `xtask::docs`) must match the committed text, and the prose may only name flags,
//! environment variables, alerts and objects that exist.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

use xtask::docs::{
    DOC, EMBEDDED, METRIC_SOURCES, OPERATOR_CONFIG, REGENERATE_HINT, alerts_block, all_flags_and_env, block, crd_rows,
    exported_as, flags_block, metrics_block, missing_keys, regenerate, registered_names, repo_root,
};

fn read(rel: &str) -> String {
    xtask::docs::read(rel).unwrap()
}

#[test]
fn generated_blocks_match_the_code() {
    let fresh = regenerate(&read(DOC)).unwrap();
    let missing = missing_keys(&fresh);
    assert!(
        missing.is_empty(),
        "{DOC} lacks the generated blocks {missing:?}; add a line `<!-- generated: <key> -->` followed by `<!-- end generated -->` where each belongs, then run `{REGENERATE_HINT}`"
    );
    assert!(
        fresh.stale.is_empty(),
        "{DOC} is stale: the generated blocks {:?} no longer match the code (flags, CRD schema, metrics, alerts or constants changed).\nRegenerate them with `{REGENERATE_HINT}` and review the diff.",
        fresh.stale
    );
}

/// Sanity checks on the generators themselves, so an empty table cannot pass for a correct one.
#[test]
fn generators_see_what_the_code_defines() {
    let csi = flags_block("hpp-csi-driver").unwrap();
    for f in [
        "`--datadir-root`",
        "`--endpoint`",
        "`--datadir`",
        "`CSI_ENDPOINT`",
        "#### `hpp-csi-driver call create-volume`",
    ] {
        assert!(csi.contains(f), "{f} missing from\n{csi}");
    }
    let op = flags_block("hpp-operator").unwrap();
    for f in [
        "#### `hpp-operator render`",
        "`--filename`",
        "`--webhook-listen`",
        "`HPP_ADMIN_ADDR`",
    ] {
        assert!(op.contains(f), "{f} missing from\n{op}");
    }
    let rows = crd_rows("v1beta1").unwrap();
    let paths: BTreeSet<&str> = rows.iter().map(|(p, _, _)| p.as_str()).collect();
    for (embedded, _) in EMBEDDED {
        assert!(
            paths.contains(embedded),
            "embedded path {embedded} is not in the schema"
        );
    }
    for p in [
        "spec.storagePools[].name",
        "spec.storagePools[].snapshotProvider",
        "spec.pathConfig.useNamingPrefix",
        "spec.featureGates",
        "status.conditions[].type",
        "status.storagePoolStatuses[].phase",
    ] {
        assert!(paths.contains(p), "{p} not found in {paths:?}");
    }
    assert!(!paths.iter().any(|p| p.starts_with("spec.storagePools[].pvcTemplate.")));
    for (bin, rel) in METRIC_SOURCES {
        let names = registered_names(rel).unwrap();
        assert!(!names.is_empty(), "no register(\"…\") calls found in {rel}");
        let table = metrics_block(bin).unwrap();
        for n in names {
            assert!(
                exported_as(&table, &n),
                "{rel} registers {n}, but the {bin} metrics table does not show it: exercise it in exercised_registry()"
            );
        }
    }
    let m = metrics_block("hpp-csi-driver").unwrap();
    assert!(m.contains("`kubevirt_hpp_pool_path_shared_with_os`"), "{m}");
    assert!(m.contains("`hpp_csi_rpc_requests_total`"), "{m}");
    assert!(
        metrics_block("hpp-operator")
            .unwrap()
            .contains("`kubevirt_hpp_cr_ready`")
    );
    assert!(
        metrics_block("hpp-provisioner")
            .unwrap()
            .contains("`hpp_provisioner_volumes_provisioned_total`")
    );
    let a = alerts_block();
    for alert in ["HPPOperatorDown", "HPPNotReady", "HPPSharingPoolPathWithOS"] {
        assert!(a.contains(alert), "{a}");
    }
    assert!(block("params:csi").unwrap().unwrap().contains("`storagePool`"));
    assert!(block("params:legacy").unwrap().unwrap().contains("`pathTemplate`"));
    assert!(
        block("conditions:reasons")
            .unwrap()
            .unwrap()
            .contains("`StoragePoolNotReady`")
    );
}

/// Env names the operator reads in `OperatorConfig::from_env` (string literals in config.rs).
fn operator_env_names() -> BTreeSet<String> {
    let src = read(OPERATOR_CONFIG);
    let code = src.split("#[cfg(test)]").next().unwrap();
    let mut names = BTreeSet::new();
    // `get("NAME", default)` and `env.get("NAME")` are the only ways config.rs reads a variable.
    for after in code.split("get(\"").skip(1) {
        if let Some((name, _)) = after.split_once('"')
            && name.chars().all(|c| c.is_ascii_uppercase() || c == '_')
        {
            names.insert(name.to_owned());
        }
    }
    names
}

fn section<'a>(doc: &'a str, heading: &str) -> &'a str {
    let start = doc
        .find(heading)
        .unwrap_or_else(|| panic!("{DOC} has no heading {heading:?}"));
    let body = &doc[start + heading.len()..];
    let end = body.find("\n## ").map_or(body.len(), |i| i);
    &body[..end]
}

/// First-column backticked names of the tables in `text`.
fn first_column(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`').map(|(n, _)| n.to_owned()))
        .collect()
}

#[test]
fn operator_environment_table_lists_exactly_what_the_operator_reads() {
    let doc = read(DOC);
    let table = first_column(section(&doc, "## Operator environment"));
    let read_by_code = operator_env_names();
    assert!(read_by_code.contains("CSI_PROVISIONER_IMAGE"), "{read_by_code:?}");
    let undocumented: Vec<_> = read_by_code.difference(&table).collect();
    let unknown: Vec<_> = table.difference(&read_by_code).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "{DOC} `## Operator environment` is out of date: read by {OPERATOR_CONFIG} but not documented: {undocumented:?}; documented but not read: {unknown:?}"
    );
}

/// Every `--flag` and upper-case env name written in backticks anywhere in the docs of our
/// binaries must exist, so prose cannot keep a renamed flag alive.
#[test]
fn flags_and_env_names_in_prose_exist() {
    let (flags, env) = all_flags_and_env();
    let operator_env = operator_env_names();
    // Flags of the Kubernetes sidecars and kubectl, which the docs also quote.
    let foreign_flags: BTreeSet<&str> = [
        // images/build.sh and images/test.sh.
        "--base",
        "--registry",
        "--tag",
        "--push",
        "--skip-cargo",
        "--csi-address",
        "--kubelet-registration-path",
        "--health-port",
        "--feature-gates",
        "--enable-capacity",
        "--capacity-for-immediate-binding",
        "--extra-create-metadata",
        "--immediate-topology",
        "--strict-topology",
        "--node-deployment",
        // The snapshot controller, named where snapshots of node-local pools are explained.
        "--enable-distributed-snapshotting",
        "--default-fstype",
        "--leader-election",
        "--for",
        "--field-selector",
        // mount(8), quoted in the shared-mount troubleshooting row.
        "--make-rshared",
        // btrfs(8): simple quotas, quoted where a pool's btrfs quota mode is chosen.
        "--simple",
        "--ignore-not-found",
        "--type",
        "--show-labels",
        "--locked",
        "--workspace",
        "--all-targets",
        "--bin",
        "--example",
        "--test",
        "--release",
        "--reflink",
        "--dry-run",
        "--server-side",
        "--bind",
        "--find",
        "--show",
        "--overwrite",
        "--timeout",
        "--ignore-not-found",
        "--platform",
        // kubectl get --watch, where the user guide finds a watched object that keeps changing.
        "--watch",
    ]
    .into_iter()
    .collect();
    let mut problems = Vec::new();
    for rel in [
        "docs/reference.md",
        "docs/user-guide.md",
        "docs/migration.md",
        "docs/embedding.md",
    ] {
        let Ok(text) = std::fs::read_to_string(repo_root().join(rel)) else {
            problems.push(format!("{rel} is missing"));
            continue;
        };
        // Fenced blocks: only command lines that run an hpp binary are checked.
        let mut prose = String::new();
        let mut fenced = Vec::new();
        let mut in_fence = false;
        for line in text.lines() {
            if line.trim_start().starts_with("```") {
                in_fence = !in_fence;
                continue;
            }
            if in_fence {
                fenced.push(line);
            } else {
                prose.push_str(line);
                prose.push('\n');
            }
        }
        let check_words = |context: &str, words: &str| {
            let mut found = Vec::new();
            for word in words.split_whitespace() {
                let word = word.split('=').next().unwrap_or(word);
                if let Some(flag) = word.strip_prefix("--").map(|f| format!("--{f}"))
                    && flag.len() > 3
                    && flag[2..].chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                    && !flags.contains(&flag)
                    && !foreign_flags.contains(flag.as_str())
                {
                    found.push(format!(
                        "{rel}: `{context}` names the flag {flag}, which no hpp binary has"
                    ));
                }
            }
            found
        };
        for line in fenced {
            let runs_hpp = line
                .split_whitespace()
                .any(|w| ["hpp-csi-driver", "hpp-operator", "hpp-provisioner", "hpp-mounter"].contains(&w));
            if runs_hpp {
                problems.extend(check_words(line.trim(), line));
            }
        }
        for (i, quoted) in prose.split('`').enumerate() {
            if i % 2 == 0 {
                continue;
            }
            problems.extend(check_words(quoted, quoted));
            let w = quoted.trim();
            let looks_like_hpp_env = w.len() > 3
                && w.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                && (w.starts_with("HPP_") || w.ends_with("_IMAGE"));
            if looks_like_hpp_env && !env.contains(w) && !operator_env.contains(w) {
                problems.push(format!(
                    "{rel}: `{w}` looks like an hpp environment variable, but no binary reads it"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "stale names in the docs:\n{}", problems.join("\n"));
}

/// The user guide has a runbook for every alert the operator ships.
#[test]
fn every_alert_has_a_runbook_in_the_user_guide() {
    let guide = read("docs/user-guide.md");
    let groups = hpp_reconcile::reconcilers::prometheus::rule_groups(&hpp_reconcile::OperatorConfig::default());
    let alerts: Vec<String> = groups
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().iter())
        .filter_map(|r| r.get("alert").and_then(Value::as_str).map(str::to_owned))
        .collect();
    assert!(alerts.len() >= 3, "{alerts:?}");
    let missing: Vec<&String> = alerts
        .iter()
        .filter(|a| !guide.contains(&format!("\n#### {a}\n")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/user-guide.md has no runbook (a `#### <alert>` heading under Runbooks) for {missing:?}"
    );
}

/// Variables the code reads with `std::env::var("…")`, outside tests.
fn process_env_names() -> BTreeSet<String> {
    fn walk(dir: &Path, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                let code = text.split("#[cfg(test)]").next().unwrap_or_default();
                for after in code.split("env::var(\"").skip(1) {
                    if let Some((name, _)) = after.split_once('"') {
                        out.insert(name.to_owned());
                    }
                }
            }
        }
    }
    let mut names = BTreeSet::new();
    for krate in std::fs::read_dir(repo_root()).unwrap().flatten() {
        let src = krate.path().join("src");
        if !krate.file_name().to_string_lossy().starts_with("hpp-") {
            continue;
        }
        if src.is_dir() {
            walk(&src, &mut names);
        }
    }
    names
}

#[test]
fn every_variable_the_code_reads_is_documented() {
    let doc = read(DOC);
    let names = process_env_names();
    assert!(names.contains("OTEL_EXPORTER_OTLP_ENDPOINT"), "{names:?}");
    let missing: Vec<&String> = names.iter().filter(|n| !doc.contains(&format!("`{n}`"))).collect();
    assert!(
        missing.is_empty(),
        "{DOC} does not mention the environment variables {missing:?}, which the code reads with std::env::var"
    );
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut in_fence = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
        } else if !in_fence && line.starts_with('#') {
            out.insert(slug(line.trim_start_matches('#')));
        }
    }
    out
}

/// Links between the docs (`other.md#anchor`, `#anchor`) land on a heading that exists.
#[test]
fn links_between_the_docs_resolve() {
    let docs = repo_root().join("docs");
    let mut problems = Vec::new();
    for entry in std::fs::read_dir(&docs).unwrap().flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&path).unwrap();
        for link in text
            .split("](")
            .skip(1)
            .filter_map(|l| l.split_once(')').map(|(t, _)| t))
        {
            if link.starts_with("http") {
                continue;
            }
            let (file, anchor) = link.split_once('#').unwrap_or((link, ""));
            let target = if file.is_empty() { path.clone() } else { docs.join(file) };
            let Ok(target_text) = std::fs::read_to_string(&target) else {
                problems.push(format!("docs/{name}: link to {link}: no such file"));
                continue;
            };
            if !anchor.is_empty() && !anchors(&target_text).contains(anchor) {
                problems.push(format!("docs/{name}: link to {link}: no heading with that anchor"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The object names docs/migration.md promises are unchanged are the ones the operator renders
/// for the example CRs (per-pool objects aside, which the doc writes as patterns).
#[test]
fn owned_object_names_in_the_migration_guide_are_the_rendered_ones() {
    let doc = read("docs/migration.md");
    let mut missing = BTreeSet::new();
    let mut seen = 0;
    for entry in std::fs::read_dir(repo_root().join("deploy/examples"))
        .unwrap()
        .flatten()
    {
        let text = std::fs::read_to_string(entry.path()).unwrap();
        let hpp = hpp_bin::operator::render::parse_cr(&text).unwrap();
        let facts = hpp_reconcile::render::offline_facts(&hpp, &["node-a".to_owned()], true, true);
        let objects = hpp_reconcile::render::render_objects(
            &hpp_reconcile::Pipeline::standard(),
            &hpp,
            &hpp_reconcile::OperatorConfig::default(),
            &facts,
        )
        .unwrap();
        for obj in objects {
            let name = obj.object.metadata.name.clone().unwrap_or_default();
            if name.starts_with("hpp-pool-") {
                continue;
            }
            seen += 1;
            if !doc.contains(&format!("`{name}`")) {
                missing.insert(format!("{} {name}", obj.kind.kind));
            }
        }
    }
    assert!(seen > 10, "rendered only {seen} objects");
    assert!(
        missing.is_empty(),
        "docs/migration.md (section 1, \"What does not change\") does not name these operator-owned objects: {missing:?}"
    );
}

/// Every condition and Warning Event reason the operator reports has a row in the user guide's
/// troubleshooting table, so a warning an admin sees always has a "what to do".
#[test]
fn troubleshooting_covers_every_warning_the_operator_reports() {
    use hpp_api::condition as cond;
    use hpp_reconcile::operator::{REASON_CLEANUP_PENDING, REASON_CLEANUP_SKIPPED};
    use hpp_reconcile::reconcilers::{csi_daemonset, pool_mounts, storage_class_pools};
    let guide = read("docs/user-guide.md");
    let table = section(&guide, "## Troubleshooting by symptom");
    for name in [
        cond::REASON_DEGRADED,
        cond::REASON_STORAGE_POOL_NOT_READY,
        cond::REASON_RECONCILE_FAILED,
        cond::REASON_UPGRADE_STARTED,
        cond::REASON_DEPLOY_STARTED,
        storage_class_pools::CONDITION_STORAGE_CLASSES_VALID,
        storage_class_pools::REASON_UNKNOWN_STORAGE_POOL,
        pool_mounts::CONDITION_POOL_MOUNTS_SHARED,
        pool_mounts::REASON_POOL_MOUNT_NOT_SHARED,
        csi_daemonset::REASON_SNAPSHOTS_DISABLED,
        hpp_reconcile::apply::REASON_DELETE_FORBIDDEN,
        REASON_CLEANUP_PENDING,
        REASON_CLEANUP_SKIPPED,
        "kubevirt_hpp_storageclass_unknown_pool",
        "csistoragecapacities",
        "-c csi-provisioner",
    ] {
        assert!(
            table.contains(name),
            "docs/user-guide.md troubleshooting never mentions {name}"
        );
    }
}
