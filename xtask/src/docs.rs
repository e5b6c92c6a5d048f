//! `cargo xtask docs`: rebuilds the generated blocks of docs/reference.md from the clap
//! commands, the CRD schema, the metric registries, the alert rules and the constants.
//! `xtask/tests/reference_doc.rs` fails when the committed text differs from what this builds.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, anyhow, bail};
use clap::CommandFactory;
use prometheus_client::registry::Registry;
use serde_json::Value;

/// The generated document, relative to the repository root.
pub const DOC: &str = "docs/reference.md";
/// The command that rewrites the generated blocks.
pub const REGENERATE_HINT: &str = "cargo xtask docs";

/// The workspace root (the parent of this crate).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A file of the repository as text.
pub fn read(rel: &str) -> anyhow::Result<String> {
    std::fs::read_to_string(repo_root().join(rel)).with_context(|| format!("reading {rel}"))
}

/// Escapes a table cell: one line, no unescaped pipes.
pub fn cell(text: &str) -> String {
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

/// The clap command of every documented executable, by name.
pub fn commands() -> Vec<(&'static str, clap::Command)> {
    vec![
        ("hpp-csi-driver", hpp_bin::csi_driver::Args::command()),
        ("hpp-operator", hpp_bin::operator::Args::command()),
        ("hpp-provisioner", hpp_bin::provisioner::Args::command()),
        ("hpp-mounter", hpp_bin::operator::mounter::MounterArgs::command()),
    ]
}

/// The flag tables of `bin` and its subcommands.
pub fn flags_block(bin: &str) -> anyhow::Result<String> {
    let (_, cmd) = commands()
        .into_iter()
        .find(|(b, _)| *b == bin)
        .ok_or_else(|| anyhow!("no executable named {bin}"))?;
    let mut out = String::new();
    walk_commands(&cmd, bin, &mut out);
    Ok(out)
}

/// Every long flag and env name of every command, for the prose checks.
pub fn all_flags_and_env() -> (BTreeSet<String>, BTreeSet<String>) {
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
pub const EMBEDDED: &[(&str, &str)] = &[
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

/// `(path, type, description)` of every field of the CRD's `version`.
pub fn crd_rows(version: &str) -> anyhow::Result<Vec<(String, String, String)>> {
    let crd = serde_json::to_value(hpp_api::crd::crd()?)?;
    let v = crd["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == version)
        .ok_or_else(|| anyhow!("the CRD has no version {version}"))?;
    let root = &v["schema"]["openAPIV3Schema"];
    let mut rows = Vec::new();
    for top in ["spec", "status"] {
        let sub = &root["properties"][top];
        rows.push((top.to_owned(), format!("`{}`", type_of(sub)), String::new()));
        walk_schema(top, sub, &mut rows);
    }
    rows.retain(|(p, _, _)| p != "spec" && p != "status");
    Ok(rows)
}

fn crd_block(version: &str) -> anyhow::Result<String> {
    let mut out = String::from("| field | type | description |\n| --- | --- | --- |\n");
    for (p, ty, desc) in crd_rows(version)? {
        let _ = writeln!(out, "| `{p}` | {ty} | {} |", cell(&desc));
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Metrics and alerts

/// Where each binary's metrics are registered: the source files whose `register(` calls name
/// them (relative to the crate's sub-registry prefix, see [`exported_as`]).
pub const METRIC_SOURCES: &[(&str, &str)] = &[
    ("hpp-csi-driver", "hpp-csi/src/metrics.rs"),
    ("hpp-operator", "hpp-reconcile/src/metrics.rs"),
    ("hpp-operator", "hpp-webhook/src/metrics.rs"),
    ("hpp-provisioner", "hpp-legacy/src/metrics.rs"),
];

/// Whether the metrics `table` has a row for `name` as registered in a sub-registry: the
/// exported name is `name` behind whatever prefix the sub-registry adds.
pub fn exported_as(table: &str, name: &str) -> bool {
    table.lines().any(|line| {
        line.strip_prefix("| `")
            .and_then(|rest| rest.split('`').next())
            .is_some_and(|exported| exported == name || exported.ends_with(&format!("_{name}")))
    })
}

/// The registry of a binary, with one sample in every family so the encoder shows each metric
/// and its label names.
fn exercised_registry(which: &str) -> anyhow::Result<Registry> {
    let mut registry = Registry::default();
    match which {
        "hpp-csi-driver" => {
            let m = hpp_csi::DriverMetrics::register(&mut registry);
            // Any code will do; the error type is how the driver names gRPC codes.
            let code = hpp_csi::Error::NotFound(String::new()).code();
            m.observe_rpc("Controller", "CreateVolume", code, 0.001);
            m.set_pool(
                "local",
                &hpp_csi::PoolHealth::default(),
                false,
                Some(hpp_csi::metrics::PoolPromises::default()),
            );
            m.set_quota_backend("local", "none");
            m.set_journal("local", true);
            m.set_journal_counts("local", 1, 1);
            m.set_trash("local", hpp_csi::TrashTotals { entries: 1, bytes: 1 });
            m.trash_purged("local", hpp_csi::PurgeReason::Age);
            m.set_shared_with_os(false);
        }
        "hpp-operator" => {
            let m = hpp_reconcile::metrics::Metrics::register(&mut registry);
            hpp_bin::operator::allocator::register(&mut registry);
            m.observe(0.01, Some("conflict"));
            m.observe_scope(hpp_reconcile::metrics::SCOPE_FULL);
            m.set_unknown_pool_classes(&["hostpath-csi".to_owned()]);
            m.node_loss_claim_released("hostpath-csi");
            let node = hpp_reconcile::Kind::of::<k8s_openapi::api::core::v1::Node>();
            m.set_cache_sizes(&[(node, String::new(), 1, 1)]);
            m.set_volume_audit(Some(&hpp_reconcile::VolumeAuditReport {
                status: hpp_api::v1beta1::VolumeAuditStatus {
                    last_audit_time: Some("2025-01-01T00:00:00Z".into()),
                    ..Default::default()
                },
                pools: [("local".to_owned(), Default::default())].into(),
            }));
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
            m.trash_purged.get_or_create(&ReasonLabels { reason: "age" }).inc();
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
        other => bail!("no registry for {other}"),
    }
    Ok(registry)
}

/// The metrics table of executable `which`.
pub fn metrics_block(which: &str) -> anyhow::Result<String> {
    let registry = exercised_registry(which)?;
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
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
            let (name, t) = rest.split_once(' ').unwrap_or((rest, ""));
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
        let _ = writeln!(
            out,
            "| `{name}` | {ty} | {series} | {l} | {} |",
            cell(help.get(&name).map_or("", String::as_str))
        );
    }
    Ok(out)
}

/// Metric names registered in a source file: the first string literal after each `register(`.
pub fn registered_names(rel: &str) -> anyhow::Result<Vec<String>> {
    let src = read(rel)?;
    let code = src.split("#[cfg(test)]").next().unwrap_or_default();
    Ok(code
        .split("register(")
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
        .collect())
}

/// The table of alerts and recording rules the operator installs.
pub fn alerts_block() -> String {
    let cfg = hpp_reconcile::OperatorConfig::default();
    let groups = hpp_reconcile::reconcilers::prometheus::rule_groups(&cfg);
    let mut out = String::from(
        "| rule | kind | expression | for | severity | health impact | summary |\n| --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for group in groups.as_array().into_iter().flatten() {
        for rule in group["rules"].as_array().into_iter().flatten() {
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
fn string_consts(rel: &str) -> anyhow::Result<Vec<(String, String, String)>> {
    let src = read(rel)?;
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
    Ok(out)
}

fn const_block(sources: &[(&str, &str)], heading: &str) -> anyhow::Result<String> {
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
        for (name, value, doc) in string_consts(rel)? {
            if name.starts_with(prefix) {
                let _ = writeln!(out, "| `{value}` | `{name}` ({short}) | {} |", cell(&doc));
            }
        }
    }
    Ok(out)
}

const API_CONSTANTS: &str = "hpp-api/src/constants.rs";
const LEGACY_PARAMS: &str = "hpp-legacy/src/params.rs";
const LEGACY_CONFIG: &str = "hpp-legacy/src/config.rs";
const CONDITIONS: &str = "hpp-api/src/condition.rs";
/// Where the operator reads its environment.
pub const OPERATOR_CONFIG: &str = "hpp-reconcile/src/config.rs";
const OPERATOR_NAMES: &str = "hpp-reconcile/src/names.rs";

/// The content of the generated block `key`, or `None` for an unknown key.
pub fn block(key: &str) -> anyhow::Result<Option<String>> {
    Ok(Some(match key {
        "flags:hpp-csi-driver" => flags_block("hpp-csi-driver")?,
        "flags:hpp-operator" => flags_block("hpp-operator")?,
        "flags:hpp-provisioner" => flags_block("hpp-provisioner")?,
        "flags:hpp-mounter" => flags_block("hpp-mounter")?,
        "crd:v1beta1" => crd_block("v1beta1")?,
        "crd:v1alpha1" => crd_block("v1alpha1")?,
        "metrics:hpp-csi-driver" => metrics_block("hpp-csi-driver")?,
        "metrics:hpp-operator" => metrics_block("hpp-operator")?,
        "metrics:hpp-provisioner" => metrics_block("hpp-provisioner")?,
        "alerts" => alerts_block(),
        "params:csi" => const_block(&[(API_CONSTANTS, "PARAM_")], "parameter")?,
        "params:legacy" => const_block(&[(LEGACY_PARAMS, "PARAM_")], "parameter")?,
        "conditions:types" => const_block(
            &[
                (CONDITIONS, "AVAILABLE"),
                (CONDITIONS, "PROGRESSING"),
                (CONDITIONS, "DEGRADED"),
            ],
            "type",
        )?,
        "conditions:reasons" => const_block(&[(CONDITIONS, "REASON_")], "reason")?,
        "labels" => const_block(&[(API_CONSTANTS, "LABEL_")], "label")?,
        "annotations" => const_block(
            &[
                (API_CONSTANTS, "ANNOTATION_"),
                (LEGACY_CONFIG, "ANNOTATION_"),
                (OPERATOR_NAMES, "ANNOTATION_"),
            ],
            "annotation",
        )?,
        _ => return Ok(None),
    }))
}

/// Every block docs/reference.md must contain.
pub const KEYS: &[&str] = &[
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

/// Opens a generated block: `<!-- generated: KEY -->` on a line of its own.
pub const BEGIN: &str = "<!-- generated: ";
/// Closes a generated block.
pub const END: &str = "<!-- end generated -->";

/// What [`regenerate`] found.
#[derive(Debug)]
pub struct Regenerated {
    /// The document with every generated block rebuilt.
    pub text: String,
    /// Keys whose committed content differs from the code.
    pub stale: Vec<String>,
    /// Keys the document contains.
    pub seen: BTreeSet<String>,
}

/// Rebuilds every generated block of `doc`.
pub fn regenerate(doc: &str) -> anyhow::Result<Regenerated> {
    let mut out = String::new();
    let mut stale = Vec::new();
    let mut seen = BTreeSet::new();
    let mut rest = doc;
    // A marker counts only at the start of a line, so prose may mention the syntax.
    let find_marker = |text: &str| {
        text.match_indices(BEGIN)
            .map(|(i, _)| i)
            .find(|&i| i == 0 || text.as_bytes().get(i - 1) == Some(&b'\n'))
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
            .ok_or_else(|| anyhow!("malformed marker {marker:?} in {DOC}"))?;
        let body_start = start + line_end;
        let end = rest[body_start..]
            .find(END)
            .ok_or_else(|| anyhow!("{DOC}: block {key:?} has no {END:?}"))?
            + body_start;
        let expected = block(key)?.ok_or_else(|| anyhow!("{DOC}: unknown generated block {key:?}"))?;
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
    Ok(Regenerated { text: out, stale, seen })
}

/// Keys of [`KEYS`] that `fresh` did not find in the document.
pub fn missing_keys(fresh: &Regenerated) -> Vec<&'static str> {
    KEYS.iter().copied().filter(|k| !fresh.seen.contains(*k)).collect()
}

/// `cargo xtask docs`: rewrites the stale blocks of docs/reference.md (with `check`, only
/// reports them and fails).
pub fn run(check: bool) -> anyhow::Result<()> {
    let path = repo_root().join(DOC);
    let doc = read(DOC)?;
    let fresh = regenerate(&doc)?;
    let missing = missing_keys(&fresh);
    if !missing.is_empty() {
        bail!(
            "{DOC} lacks the generated blocks {missing:?}; add a line `{BEGIN}<key> -->` followed by `{END}` where each belongs"
        );
    }
    if fresh.stale.is_empty() {
        println!("{DOC} is up to date");
        return Ok(());
    }
    if check {
        bail!("{DOC} is stale: {:?}; run `{REGENERATE_HINT}`", fresh.stale);
    }
    std::fs::write(&path, fresh.text).with_context(|| format!("writing {}", path.display()))?;
    println!("{DOC}: regenerated {:?}", fresh.stale);
    Ok(())
}
