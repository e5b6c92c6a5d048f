//! Keeps docs/reference.md true to the code: its generated blocks are rebuilt from the clap
//! commands, the CRD schema, the metric registries, the alert rules and the constants, and the
//! test fails when the committed text differs. `HPP_BLESS=1` rewrites the blocks.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use prometheus_client::registry::Registry;
use serde_json::Value;

const DOC: &str = "docs/reference.md";
const BLESS_HINT: &str = "HPP_BLESS=1 cargo test -p hpp-bin --test reference_doc";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo_root().join(rel)).unwrap_or_else(|e| panic!("reading {rel}: {e}"))
}

/// Escapes a table cell: one line, no unescaped pipes.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

// ---------------------------------------------------------------------------------------------
// Flags

fn flag_table(cmd: &clap::Command) -> String {
    let mut rows = Vec::new();
    for arg in cmd.get_arguments() {
        let id = arg.get_id().as_str();
        if id == "help" || id == "version" {
            continue;
        }
        let name = if arg.is_positional() {
            let value = arg
                .get_value_names()
                .and_then(|v| v.first().map(ToString::to_string))
                .unwrap_or_else(|| id.to_uppercase());
            format!("`<{value}>`")
        } else {
            let long = arg.get_long().map(|l| format!("`--{l}`"));
            let short = arg.get_short().map(|s| format!("`-{s}`"));
            [short, long].into_iter().flatten().collect::<Vec<_>>().join(", ")
        };
        let env = arg
            .get_env()
            .map(|e| format!("`{}`", e.to_string_lossy()))
            .unwrap_or_default();
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|d| d.to_string_lossy().into_owned())
            .collect();
        let default = if defaults.is_empty() || !arg.get_action().takes_values() {
            String::new()
        } else {
            format!("`{}`", defaults.join(","))
        };
        let mut help = arg
            .get_long_help()
            .or_else(|| arg.get_help())
            .map(|h| cell(&h.to_string()))
            .unwrap_or_default();
        if !help.is_empty() && !help.ends_with(['.', ')', ']']) {
            help.push('.');
        }
        let values: Vec<String> = arg
            .get_possible_values()
            .iter()
            .filter(|v| !v.is_hide_set())
            .map(|v| format!("`{}`", v.get_name()))
            .collect();
        if arg.get_action().takes_values() && !values.is_empty() {
            let _ = write!(help, " One of: {}.", values.join(", "));
        }
        if arg.is_hide_set() {
            help.push_str(" (Hidden from `--help`.)");
        }
        if arg.is_required_set() {
            help.push_str(" Required.");
        }
        rows.push(format!("| {name} | {env} | {default} | {} |", cell(&help)));
    }
    let mut out = String::from("| flag | env | default | description |\n| --- | --- | --- | --- |\n");
    for r in rows {
        out.push_str(&r);
        out.push('\n');
    }
    out
}

fn walk_commands(cmd: &clap::Command, path: &str, out: &mut String) {
    let has_args = cmd
        .get_arguments()
        .any(|a| !matches!(a.get_id().as_str(), "help" | "version"));
    let about = cmd.get_about().map(ToString::to_string).unwrap_or_default();
    let _ = writeln!(out, "#### `{path}`\n");
    if !about.is_empty() {
        let _ = writeln!(out, "{}\n", cell(&about));
    }
    let subs: Vec<&clap::Command> = cmd.get_subcommands().filter(|s| s.get_name() != "help").collect();
    if !subs.is_empty() {
        let names: Vec<String> = subs.iter().map(|s| format!("`{}`", s.get_name())).collect();
        let _ = writeln!(out, "Subcommands: {}.\n", names.join(", "));
    }
    if has_args {
        out.push_str(&flag_table(cmd));
        out.push('\n');
    }
    for sub in subs {
        walk_commands(sub, &format!("{path} {}", sub.get_name()), out);
    }
}

fn commands() -> Vec<(&'static str, clap::Command)> {
    vec![
        ("hpp-csi-driver", hpp_bin::csi_driver::Args::command()),
        ("hpp-operator", hpp_bin::operator::Args::command()),
        ("hpp-provisioner", hpp_bin::provisioner::Args::command()),
        ("hpp-mounter", hpp_bin::operator::mounter::MounterArgs::command()),
    ]
}

fn flags_block(bin: &str) -> String {
    let (_, cmd) = commands().into_iter().find(|(b, _)| *b == bin).unwrap();
    let mut out = String::new();
    walk_commands(&cmd, bin, &mut out);
    out
}

/// Every long flag and env name of every command, for the prose checks.
fn all_flags_and_env() -> (BTreeSet<String>, BTreeSet<String>) {
    fn walk(cmd: &clap::Command, flags: &mut BTreeSet<String>, env: &mut BTreeSet<String>) {
        for a in cmd.get_arguments() {
            if let Some(l) = a.get_long() {
                flags.insert(format!("--{l}"));
            }
            if let Some(e) = a.get_env() {
                env.insert(e.to_string_lossy().into_owned());
            }
        }
        for s in cmd.get_subcommands() {
            walk(s, flags, env);
        }
    }
    let (mut flags, mut env) = (BTreeSet::new(), BTreeSet::new());
    for (_, mut cmd) in commands() {
        cmd.build();
        walk(&cmd, &mut flags, &mut env);
    }
    (flags, env)
}

// ---------------------------------------------------------------------------------------------
// CRD fields

/// Fields whose type is a Kubernetes core type: documented as one row, not descended into.
const EMBEDDED: &[(&str, &str)] = &[
    ("spec.storagePools[].pvcTemplate", "PersistentVolumeClaimSpec"),
    ("spec.workload.tolerations", "[]Toleration"),
    ("spec.workload.affinity", "Affinity"),
    (
        "status.storagePoolStatuses[].claimStatuses[].status",
        "PersistentVolumeClaimStatus",
    ),
];

fn type_of(schema: &Value) -> String {
    match schema.get("type").and_then(Value::as_str) {
        Some("array") => format!("[]{}", type_of(&schema["items"])),
        Some("object") if schema.get("additionalProperties").is_some_and(Value::is_object) => {
            format!("map[string]{}", type_of(&schema["additionalProperties"]))
        }
        Some(t) => t.to_owned(),
        None => "object".to_owned(),
    }
}

fn walk_schema(path: &str, schema: &Value, rows: &mut Vec<(String, String, String)>) {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (name, sub) in props {
        let p = if path.is_empty() {
            name.clone()
        } else {
            format!("{path}.{name}")
        };
        let desc = sub.get("description").and_then(Value::as_str).unwrap_or_default();
        if let Some((_, ty)) = EMBEDDED.iter().find(|(e, _)| *e == p) {
            rows.push((p.clone(), format!("Kubernetes `{ty}`"), desc.to_owned()));
            continue;
        }
        rows.push((p.clone(), format!("`{}`", type_of(sub)), desc.to_owned()));
        let inner = if sub.get("type").and_then(Value::as_str) == Some("array") {
            (format!("{p}[]"), &sub["items"])
        } else {
            (p, sub)
        };
        walk_schema(&inner.0, inner.1, rows);
    }
}

fn crd_rows(version: &str) -> Vec<(String, String, String)> {
    let crd = serde_json::to_value(hpp_api::crd::crd().unwrap()).unwrap();
    let v = crd["spec"]["versions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == version)
        .unwrap();
    let root = &v["schema"]["openAPIV3Schema"];
    let mut rows = Vec::new();
    for top in ["spec", "status"] {
        let sub = &root["properties"][top];
        rows.push((top.to_owned(), format!("`{}`", type_of(sub)), String::new()));
        walk_schema(top, sub, &mut rows);
    }
    rows.retain(|(p, _, _)| p != "spec" && p != "status");
    rows
}

fn crd_block(version: &str) -> String {
    let mut out = String::from("| field | type | description |\n| --- | --- | --- |\n");
    for (p, ty, desc) in crd_rows(version) {
        let _ = writeln!(out, "| `{p}` | {ty} | {} |", cell(&desc));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Metrics and alerts

/// Where each binary's metrics are registered: the source files whose `register(` calls name them,
/// and the prefix their registry adds.
const METRIC_SOURCES: &[(&str, &str, &str)] = &[
    ("hpp-csi-driver", "hpp-csi/src/metrics.rs", ""),
    ("hpp-operator", "hpp-reconcile/src/metrics.rs", ""),
    ("hpp-operator", "hpp-webhook/src/metrics.rs", ""),
    ("hpp-provisioner", "hpp-legacy/src/metrics.rs", "hpp_provisioner_"),
];

/// The registry of a binary, with one sample in every family so the encoder shows each metric
/// and its label names.
fn exercised_registry(which: &str) -> Registry {
    let mut registry = Registry::default();
    match which {
        "hpp-csi-driver" => {
            let m = hpp_csi::DriverMetrics::register(&mut registry);
            // Any code will do; the error type is how the driver names gRPC codes.
            let code = hpp_csi::Error::NotFound(String::new()).code();
            m.observe_rpc("Controller", "CreateVolume", code, 0.001);
            m.set_pool("local", &hpp_csi::pool::PoolHealth::default(), false);
            m.set_shared_with_os(false);
        }
        "hpp-operator" => {
            let m = hpp_reconcile::metrics::Metrics::register(&mut registry);
            m.observe(0.01, Some("conflict"));
            let w = hpp_webhook::metrics::Metrics::register(&mut registry);
            w.request("validate", "allowed", 0.001);
            w.handshake_failed();
        }
        "hpp-provisioner" => {
            use hpp_legacy::metrics::*;
            let m = Metrics::register(&mut registry);
            m.provisioned.get_or_create(&ModeLabels { mode: "kubevirt" }).inc();
            m.deleted.get_or_create(&DeleteLabels { action: "deleted" }).inc();
            m.refused
                .get_or_create(&ReasonLabels {
                    reason: "RequestTooLarge",
                })
                .inc();
            m.delete_refused.inc();
            m.errors
                .get_or_create(&ErrorLabels {
                    operation: "provision",
                    category: "api",
                })
                .inc();
            m.duration_seconds
                .get_or_create(&OperationLabels { operation: "provision" })
                .observe(0.1);
        }
        other => panic!("no registry for {other}"),
    }
    registry
}

fn metrics_block(which: &str) -> String {
    let registry = exercised_registry(which);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let mut order = Vec::new();
    let mut help = BTreeMap::new();
    let mut types = BTreeMap::new();
    let mut labels: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, h) = rest.split_once(' ').unwrap_or((rest, ""));
            order.push(name.to_owned());
            help.insert(name.to_owned(), h.trim_end_matches('.').to_owned());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, t) = rest.split_once(' ').unwrap();
            types.insert(name.to_owned(), t.to_owned());
        } else if !line.starts_with('#')
            && let Some((series, rest)) = line.split_once('{')
        {
            let family = order
                .iter()
                .filter(|f| series.starts_with(f.as_str()))
                .max_by_key(|f| f.len())
                .cloned()
                .unwrap_or_default();
            let set = labels.entry(family).or_default();
            for pair in rest.split_once('}').map_or("", |(l, _)| l).split(',') {
                if let Some((k, _)) = pair.split_once('=')
                    && k != "le"
                {
                    set.insert(format!("`{k}`"));
                }
            }
        }
    }
    let mut out = String::from("| metric | type | series | labels | description |\n| --- | --- | --- | --- | --- |\n");
    for name in order {
        let ty = types.get(&name).cloned().unwrap_or_default();
        let series = match ty.as_str() {
            "counter" => format!("`{name}_total`"),
            "histogram" => format!("`{name}_bucket`, `{name}_sum`, `{name}_count`"),
            _ => format!("`{name}`"),
        };
        let l = labels
            .get(&name)
            .map(|s| s.iter().cloned().collect::<Vec<_>>().join(", "))
            .unwrap_or_default();
        let _ = writeln!(out, "| `{name}` | {ty} | {series} | {l} | {} |", cell(&help[&name]));
    }
    out
}

/// Metric names registered in a source file: the first string literal after each `register(`.
fn registered_names(rel: &str) -> Vec<String> {
    let src = read(rel);
    let code = src.split("#[cfg(test)]").next().unwrap();
    code.split("register(")
        .skip(1)
        .filter_map(|after| {
            let open = after.find('"')?;
            // Only a literal that starts the argument list (ignores `register(&mut registry)`).
            if after[..open].trim().is_empty() {
                let rest = &after[open + 1..];
                rest.find('"').map(|close| rest[..close].to_owned())
            } else {
                None
            }
        })
        .collect()
}

fn alerts_block() -> String {
    let cfg = hpp_reconcile::OperatorConfig::default();
    let groups = hpp_reconcile::reconcilers::prometheus::rule_groups(&cfg);
    let mut out = String::from(
        "| rule | kind | expression | for | severity | health impact | summary |\n| --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for group in groups.as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
            let (name, kind) = match rule.get("alert") {
                Some(a) => (s(a), "alert"),
                None => (s(&rule["record"]), "recording rule"),
            };
            let _ = writeln!(
                out,
                "| `{name}` | {kind} | `{}` | {} | {} | {} | {} |",
                cell(&s(&rule["expr"])),
                s(&rule["for"]),
                s(&rule["labels"]["severity"]),
                s(&rule["labels"]["operator_health_impact"]),
                cell(&s(&rule["annotations"]["summary"])),
            );
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Constants read from the source, with their doc comments

/// `(NAME, value, doc)` of every `pub const NAME: &str = "value";` in a source file.
fn string_consts(rel: &str) -> Vec<(String, String, String)> {
    let src = read(rel);
    let mut out = Vec::new();
    let mut doc = Vec::new();
    for line in src.lines() {
        let t = line.trim();
        if let Some(d) = t.strip_prefix("///") {
            doc.push(d.trim().to_owned());
            continue;
        }
        if let Some(rest) = t.strip_prefix("pub const ")
            && let Some((name, rhs)) = rest.split_once(": &str = \"")
            && let Some(value) = rhs.strip_suffix("\";")
        {
            out.push((name.to_owned(), value.to_owned(), doc.join(" ")));
        }
        doc.clear();
    }
    out
}

fn const_block(sources: &[(&str, &str)], heading: &str) -> String {
    let mut out = format!("| {heading} | constant | meaning |\n| --- | --- | --- |\n");
    for (rel, prefix) in sources {
        let short = rel
            .rsplit('/')
            .take(3)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("/");
        for (name, value, doc) in string_consts(rel) {
            if name.starts_with(prefix) {
                let _ = writeln!(out, "| `{value}` | `{name}` ({short}) | {} |", cell(&doc));
            }
        }
    }
    out
}

const API_CONSTANTS: &str = "hpp-api/src/constants.rs";
const LEGACY_PARAMS: &str = "hpp-legacy/src/params.rs";
const LEGACY_CONFIG: &str = "hpp-legacy/src/config.rs";
const CONDITIONS: &str = "hpp-api/src/condition.rs";
const OPERATOR_CONFIG: &str = "hpp-reconcile/src/config.rs";
const OPERATOR_NAMES: &str = "hpp-reconcile/src/names.rs";

fn block(key: &str) -> Option<String> {
    Some(match key {
        "flags:hpp-csi-driver" => flags_block("hpp-csi-driver"),
        "flags:hpp-operator" => flags_block("hpp-operator"),
        "flags:hpp-provisioner" => flags_block("hpp-provisioner"),
        "flags:hpp-mounter" => flags_block("hpp-mounter"),
        "crd:v1beta1" => crd_block("v1beta1"),
        "crd:v1alpha1" => crd_block("v1alpha1"),
        "metrics:hpp-csi-driver" => metrics_block("hpp-csi-driver"),
        "metrics:hpp-operator" => metrics_block("hpp-operator"),
        "metrics:hpp-provisioner" => metrics_block("hpp-provisioner"),
        "alerts" => alerts_block(),
        "params:csi" => const_block(&[(API_CONSTANTS, "PARAM_")], "parameter"),
        "params:legacy" => const_block(&[(LEGACY_PARAMS, "PARAM_")], "parameter"),
        "conditions:types" => const_block(
            &[
                (CONDITIONS, "AVAILABLE"),
                (CONDITIONS, "PROGRESSING"),
                (CONDITIONS, "DEGRADED"),
            ],
            "type",
        ),
        "conditions:reasons" => const_block(&[(CONDITIONS, "REASON_")], "reason"),
        "annotations" => const_block(
            &[
                (API_CONSTANTS, "ANNOTATION_"),
                (LEGACY_CONFIG, "ANNOTATION_"),
                (OPERATOR_NAMES, "ANNOTATION_"),
            ],
            "annotation",
        ),
        "labels" => const_block(&[(API_CONSTANTS, "LABEL_")], "label"),
        _ => return None,
    })
}

const KEYS: &[&str] = &[
    "flags:hpp-csi-driver",
    "flags:hpp-operator",
    "flags:hpp-provisioner",
    "flags:hpp-mounter",
    "crd:v1beta1",
    "crd:v1alpha1",
    "metrics:hpp-csi-driver",
    "metrics:hpp-operator",
    "metrics:hpp-provisioner",
    "alerts",
    "params:csi",
    "params:legacy",
    "conditions:types",
    "conditions:reasons",
    "annotations",
    "labels",
];

const BEGIN: &str = "<!-- generated: ";
const END: &str = "<!-- end generated -->";

/// Rebuilds every generated block; returns the new text and the keys whose content changed.
fn regenerate(doc: &str) -> (String, Vec<String>, BTreeSet<String>) {
    let mut out = String::new();
    let mut stale = Vec::new();
    let mut seen = BTreeSet::new();
    let mut rest = doc;
    // A marker counts only at the start of a line, so prose may mention the syntax.
    let find_marker = |text: &str| {
        text.match_indices(BEGIN)
            .map(|(i, _)| i)
            .find(|&i| i == 0 || text.as_bytes()[i - 1] == b'\n')
    };
    while let Some(start) = find_marker(rest) {
        let after_marker = &rest[start..];
        let line_end = after_marker.find('\n').map_or(after_marker.len(), |i| i + 1);
        let marker = &after_marker[..line_end];
        let key = marker
            .trim()
            .strip_prefix(BEGIN)
            .and_then(|k| k.strip_suffix("-->"))
            .map(str::trim)
            .unwrap_or_else(|| panic!("malformed marker {marker:?} in {DOC}"));
        let body_start = start + line_end;
        let end = rest[body_start..]
            .find(END)
            .unwrap_or_else(|| panic!("{DOC}: block {key:?} has no {END:?}"))
            + body_start;
        let expected = block(key).unwrap_or_else(|| panic!("{DOC}: unknown generated block {key:?}"));
        let expected = format!("\n{expected}\n");
        if rest[body_start..end] != expected {
            stale.push(key.to_owned());
        }
        seen.insert(key.to_owned());
        out.push_str(&rest[..body_start]);
        out.push_str(&expected);
        rest = &rest[end..];
    }
    out.push_str(rest);
    (out, stale, seen)
}

#[test]
fn generated_blocks_match_the_code() {
    let path = repo_root().join(DOC);
    let doc = std::fs::read_to_string(&path).unwrap();
    let (fresh, stale, seen) = regenerate(&doc);
    let missing: Vec<&&str> = KEYS.iter().filter(|k| !seen.contains(**k)).collect();
    assert!(
        missing.is_empty(),
        "{DOC} lacks the generated blocks {missing:?}; add a line `{BEGIN}<key> -->` followed by `{END}` where each belongs, then run `{BLESS_HINT}`"
    );
    if stale.is_empty() {
        return;
    }
    if std::env::var_os("HPP_BLESS").is_some() {
        std::fs::write(&path, fresh).unwrap();
        return;
    }
    panic!(
        "{DOC} is stale: the generated blocks {stale:?} no longer match the code (flags, CRD schema, metrics, alerts or constants changed).\nRegenerate them with `{BLESS_HINT}` and review the diff."
    );
}

/// Sanity checks on the generators themselves, so an empty table cannot pass for a correct one.
#[test]
fn generators_see_what_the_code_defines() {
    let csi = flags_block("hpp-csi-driver");
    for f in [
        "`--datadir-root`",
        "`--endpoint`",
        "`--datadir`",
        "`CSI_ENDPOINT`",
        "#### `hpp-csi-driver call create-volume`",
    ] {
        assert!(csi.contains(f), "{f} missing from\n{csi}");
    }
    let op = flags_block("hpp-operator");
    for f in [
        "#### `hpp-operator render`",
        "`--filename`",
        "`--webhook-listen`",
        "`HPP_ADMIN_ADDR`",
    ] {
        assert!(op.contains(f), "{f} missing from\n{op}");
    }
    let rows = crd_rows("v1beta1");
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
    for (bin, rel, prefix) in METRIC_SOURCES {
        let names = registered_names(rel);
        assert!(!names.is_empty(), "no register(\"…\") calls found in {rel}");
        let table = metrics_block(bin);
        for n in names {
            assert!(
                table.contains(&format!("| `{prefix}{n}` |")),
                "{rel} registers {n}, but the {bin} metrics table does not show it: exercise it in exercised_registry()"
            );
        }
    }
    let m = metrics_block("hpp-csi-driver");
    assert!(m.contains("`kubevirt_hpp_pool_path_shared_with_os`"), "{m}");
    assert!(m.contains("`hpp_csi_rpc_requests_total`"), "{m}");
    assert!(metrics_block("hpp-operator").contains("`kubevirt_hpp_cr_ready`"));
    assert!(metrics_block("hpp-provisioner").contains("`hpp_provisioner_volumes_provisioned_total`"));
    let a = alerts_block();
    for alert in ["HPPOperatorDown", "HPPNotReady", "HPPSharingPoolPathWithOS"] {
        assert!(a.contains(alert), "{a}");
    }
    assert!(block("params:csi").unwrap().contains("`storagePool`"));
    assert!(block("params:legacy").unwrap().contains("`pathTemplate`"));
    assert!(block("conditions:reasons").unwrap().contains("`StoragePoolNotReady`"));
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
        "--default-fstype",
        "--leader-election",
        "--for",
        "--field-selector",
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
