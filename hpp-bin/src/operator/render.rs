//! `hpp-operator render -f CR.yaml`: the operator's desired objects for a CR, offline, in the
//! order the operator applies them; one YAML (or JSON) document per object.
//!
//! The CR is checked with the admission webhook's rules first, so a CR the cluster would reject
//! does not render. What the output leaves out (per-node objects of pvcTemplate pools without
//! `--node`) and placeholder images (unset `*_IMAGE` variables) are reported as notes on stderr.

use std::path::PathBuf;

use anyhow::Context as _;
use hpp_api::HostPathProvisioner;
use hpp_api::validation::ValidateCreate;
use hpp_reconcile::{OperatorConfig, Pipeline};
use serde_json::Value;

/// Arguments of `render`.
#[derive(clap::Args, Debug, Clone)]
pub struct RenderArgs {
    /// The HostPathProvisioner YAML (`-` for stdin); required unless `--rbac`.
    #[arg(short = 'f', long = "filename", required_unless_present = "rbac")]
    pub file: Option<PathBuf>,
    /// Print the operator's own RBAC instead (its ServiceAccount, ClusterRole, Role and
    /// bindings, as `deploy/operator/rbac.yaml` ships them), derived from what it runs.
    #[arg(long, conflicts_with_all = ["file", "nodes", "openshift", "prometheus"])]
    pub rbac: bool,
    /// Node names to render per-node pool objects for (repeat or comma-separate).
    #[arg(long = "node", value_delimiter = ',')]
    pub nodes: Vec<String>,
    /// Render the OpenShift SecurityContextConstraints too.
    #[arg(long)]
    pub openshift: bool,
    /// Render the prometheus-operator objects too.
    #[arg(long)]
    pub prometheus: bool,
    /// Operator namespace (otherwise POD_NAMESPACE or hostpath-provisioner).
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// Output format: a YAML stream or a stream of JSON documents, one per object.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = RenderFormat::Yaml)]
    pub output: RenderFormat,
}

/// Output formats of `render`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RenderFormat {
    /// `---`-separated YAML documents.
    Yaml,
    /// Pretty-printed JSON documents, one after the other (`jq` reads them as a stream).
    Json,
}

/// The images the operator takes from its environment and uses for its own pods; unset, the
/// objects name placeholders no registry serves.
const HPP_IMAGE_VARS: [&str; 3] = ["OPERATOR_IMAGE", "CSI_PROVISIONER_IMAGE", "PROVISIONER_IMAGE"];

/// What `render` produces: the objects in apply order, and notes on what they leave out.
#[derive(Debug, Clone)]
pub struct Rendered {
    /// The objects, in the order the operator applies them.
    pub objects: Vec<Value>,
    /// What a reader must know about the output (left-out objects, placeholder images).
    pub notes: Vec<String>,
}

impl Rendered {
    /// The objects as one document each, in `format`.
    pub fn to_text(&self, format: RenderFormat) -> anyhow::Result<String> {
        let mut out = String::new();
        for obj in &self.objects {
            let doc = match format {
                RenderFormat::Yaml => format!("---\n{}", serde_saphyr::to_string(obj)?),
                RenderFormat::Json => serde_json::to_string_pretty(obj)?,
            };
            out.push_str(&doc);
            if !doc.ends_with('\n') {
                out.push('\n');
            }
        }
        Ok(out)
    }
}

/// Reads a CR from YAML text.
pub fn parse_cr(text: &str) -> anyhow::Result<HostPathProvisioner> {
    serde_saphyr::from_str(text).context("parsing the HostPathProvisioner")
}

/// The objects for `args`, with images and versions from `env` (the process environment in
/// `main`). Fails, naming every bad field, on a CR the admission webhook would reject.
pub fn render_with_env(args: &RenderArgs, env: impl IntoIterator<Item = (String, String)>) -> anyhow::Result<Rendered> {
    let Some(file) = &args.file else {
        anyhow::bail!("render needs a HostPathProvisioner: -f FILE (or --rbac for the operator's RBAC)");
    };
    let text = if file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())?
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?
    };
    let hpp = parse_cr(&text)?;
    hpp.validate_create()
        .map_err(|e| anyhow::anyhow!("the admission webhook would reject this HostPathProvisioner: {e}"))?;
    let env: Vec<(String, String)> = env.into_iter().collect();
    let mut cfg = OperatorConfig::from_env(env.iter().cloned());
    if let Some(ns) = &args.namespace {
        cfg.namespace.clone_from(ns);
    }
    let facts = hpp_reconcile::render::offline_facts(&hpp, &args.nodes, args.openshift, args.prometheus);
    let objects = hpp_reconcile::render::render_objects(&Pipeline::standard(), &hpp, &cfg, &facts)?
        .iter()
        .map(|o| o.to_value())
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Rendered {
        objects,
        notes: notes(&hpp, args, &env),
    })
}

/// The objects for `args`, with images and versions from the process environment.
pub fn render(args: &RenderArgs) -> anyhow::Result<Rendered> {
    render_with_env(args, std::env::vars())
}

/// What the output leaves out or fills in with placeholders.
fn notes(hpp: &HostPathProvisioner, args: &RenderArgs, env: &[(String, String)]) -> Vec<String> {
    let mut notes = Vec::new();
    if args.nodes.is_empty() {
        let pools: Vec<&str> = hpp
            .spec
            .storage_pools
            .iter()
            .flatten()
            .filter(|p| p.pvc_template.is_some())
            .map(|p| p.name.as_str())
            .collect();
        if !pools.is_empty() {
            notes.push(format!(
                "pvcTemplate pool(s) {} get a claim and a mounter Deployment per node; they are left out: pass --node NAME (repeatable) to render them",
                pools.join(", ")
            ));
        }
    }
    let unset: Vec<&str> = HPP_IMAGE_VARS
        .into_iter()
        .filter(|var| !env.iter().any(|(k, v)| k == var && !v.is_empty()))
        .collect();
    if !unset.is_empty() {
        notes.push(format!(
            "{} not set: the objects name placeholder images; set them as deploy/operator/deployment.yaml does",
            unset.join(", ")
        ));
    }
    notes
}

/// The operator's RBAC for `render --rbac`, in its namespace (`--namespace`, else
/// POD_NAMESPACE, else hostpath-provisioner): commented YAML, or JSON documents.
pub fn rbac_with_env(args: &RenderArgs, env: impl IntoIterator<Item = (String, String)>) -> anyhow::Result<String> {
    let cfg = OperatorConfig::from_env(env);
    let namespace = args.namespace.as_deref().unwrap_or(&cfg.namespace);
    let yaml = super::rbac::yaml(namespace);
    Ok(match args.output {
        RenderFormat::Yaml => yaml,
        RenderFormat::Json => Rendered {
            objects: serde_saphyr::from_str_multiple(&yaml)?,
            notes: Vec::new(),
        }
        .to_text(RenderFormat::Json)?,
    })
}

/// Runs `render`: the documents on stdout, the notes on stderr.
pub fn main(args: &RenderArgs) -> anyhow::Result<()> {
    if args.rbac {
        return super::print_stdout(&rbac_with_env(args, std::env::vars())?);
    }
    let rendered = render(args)?;
    for note in &rendered.notes {
        eprintln!("note: {note}");
    }
    super::print_stdout(&rendered.to_text(args.output)?)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use clap::Parser;

    fn count(example: &str, extra: &[&str]) -> usize {
        let file = self::example(example);
        let mut argv = vec!["hpp-operator", "render", "-f", file.to_str().unwrap()];
        argv.extend_from_slice(extra);
        let args = crate::operator::Args::parse_from(argv);
        let Some(crate::operator::Command::Render(r)) = args.command else {
            panic!("render expected")
        };
        let yaml = render(&r).unwrap().to_text(RenderFormat::Yaml).unwrap();
        let docs: Vec<serde_json::Value> = serde_saphyr::from_str_multiple(&yaml).unwrap();
        assert!(
            docs.iter()
                .all(|d| d["metadata"]["name"].is_string() && d["kind"].is_string())
        );
        docs.len()
    }

    #[test]
    fn renders_every_example_offline() {
        assert_eq!(count("hostpathprovisioner_cr", &[]), 7);
        assert_eq!(count("hostpathprovisioner_legacy_cr", &[]), 11);
        assert_eq!(count("hostpathprovisioner_pvctemplate_cr", &[]), 7);
        assert_eq!(count("hostpathprovisioner_overlay_csi_cr", &[]), 8);
        // Per-node pool objects: a claim and a mounter per node, or one shared claim.
        assert_eq!(count("hostpathprovisioner_pvctemplate_cr", &["--node", "n1,n2"]), 11);
        assert_eq!(
            count("hostpathprovisioner_overlay_csi_cr", &["--node", "n1", "--node", "n2"]),
            11
        );
        assert_eq!(
            count("hostpathprovisioner_legacy_cr", &["--openshift", "--prometheus"]),
            18
        );
    }

    fn render_args(file: &std::path::Path, extra: &[&str]) -> RenderArgs {
        let mut argv = vec!["hpp-operator", "render", "-f", file.to_str().unwrap()];
        argv.extend_from_slice(extra);
        let Some(crate::operator::Command::Render(r)) = crate::operator::Args::parse_from(argv).command else {
            panic!("render expected")
        };
        r
    }

    /// An example CR of `deploy/examples/`, from the crate's copy (xtask's
    /// `deploy_example_copies` test keeps the copies identical to deploy/).
    fn example(name: &str) -> std::path::PathBuf {
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/examples/{name}.yaml"))
    }

    fn all_images() -> Vec<(String, String)> {
        HPP_IMAGE_VARS
            .iter()
            .map(|v| (v.to_string(), format!("registry/{v}:1")))
            .collect()
    }

    #[test]
    fn refuses_a_cr_the_webhook_rejects_naming_every_field() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("bad.yaml");
        std::fs::write(
            &file,
            "apiVersion: hostpathprovisioner.kubevirt.io/v1beta1\nkind: HostPathProvisioner\n\
             metadata: {name: hostpath-provisioner}\n\
             spec: {imagePullPolicy: IfNotPresent, storagePools: [{name: Bad_Name, path: var/x/}]}\n",
        )
        .unwrap();
        let err = render_with_env(&render_args(&file, &[]), all_images())
            .unwrap_err()
            .to_string();
        assert!(err.contains("admission webhook would reject"), "{err}");
        assert!(err.contains("spec.storagePools[0].name"), "{err}");
        assert!(err.contains("spec.storagePools[0].path"), "{err}");
    }

    #[test]
    fn says_what_it_leaves_out_and_which_images_are_placeholders() {
        let pvc = example("hostpathprovisioner_pvctemplate_cr");
        let without_nodes = render_with_env(&render_args(&pvc, &[]), all_images()).unwrap();
        assert_eq!(without_nodes.notes.len(), 1, "{:?}", without_nodes.notes);
        assert!(without_nodes.notes[0].contains("local") && without_nodes.notes[0].contains("--node"));
        let with_nodes = render_with_env(&render_args(&pvc, &["--node", "n1"]), all_images()).unwrap();
        assert!(with_nodes.notes.is_empty(), "{:?}", with_nodes.notes);
        let plain = example("hostpathprovisioner_cr");
        let placeholders = render_with_env(&render_args(&plain, &[]), Vec::new()).unwrap();
        assert_eq!(placeholders.notes.len(), 1, "{:?}", placeholders.notes);
        for var in HPP_IMAGE_VARS {
            assert!(placeholders.notes[0].contains(var), "{:?}", placeholders.notes);
        }
    }

    #[test]
    fn rbac_is_the_operators_roles_in_its_namespace_without_a_cr() {
        let args = render_args_from(&["--rbac", "-n", "storage"]);
        let yaml = rbac_with_env(&args, Vec::new()).unwrap();
        assert_eq!(yaml, super::super::rbac::yaml("storage"));
        let docs: Vec<serde_json::Value> = serde_saphyr::from_str_multiple(&yaml).unwrap();
        assert_eq!(docs.len(), 5);
        assert!(
            docs.iter()
                .filter(|d| d["metadata"]["namespace"].is_string())
                .all(|d| d["metadata"]["namespace"] == "storage")
        );
        let env = vec![("POD_NAMESPACE".to_owned(), "from-env".to_owned())];
        let json = rbac_with_env(&render_args_from(&["--rbac", "-o", "json"]), env).unwrap();
        assert!(json.contains("\"namespace\": \"from-env\""), "{json}");
        // A CR is required without --rbac, and refused with it.
        assert!(crate::operator::Args::try_parse_from(["hpp-operator", "render"]).is_err());
        assert!(crate::operator::Args::try_parse_from(["hpp-operator", "render", "--rbac", "-f", "x.yaml"]).is_err());
    }

    fn render_args_from(extra: &[&str]) -> RenderArgs {
        let mut argv = vec!["hpp-operator", "render"];
        argv.extend_from_slice(extra);
        let Some(crate::operator::Command::Render(r)) = crate::operator::Args::parse_from(argv).command else {
            panic!("render expected")
        };
        r
    }

    #[test]
    fn json_and_yaml_are_one_document_per_object_in_apply_order() {
        let args = render_args(&example("hostpathprovisioner_legacy_cr"), &["-o", "json"]);
        assert_eq!(args.output, RenderFormat::Json);
        let rendered = render_with_env(&args, all_images()).unwrap();
        let json: Vec<serde_json::Value> =
            serde_json::Deserializer::from_str(&rendered.to_text(RenderFormat::Json).unwrap())
                .into_iter()
                .collect::<Result<_, _>>()
                .unwrap();
        assert_eq!(json, rendered.objects);
        let yaml: Vec<serde_json::Value> =
            serde_saphyr::from_str_multiple(&rendered.to_text(RenderFormat::Yaml).unwrap()).unwrap();
        assert_eq!(yaml, rendered.objects);
        // Apply order: the namespace-scoped accounts before the workloads that use them.
        let position = |kind: &str| rendered.objects.iter().position(|o| o["kind"] == kind).unwrap();
        assert!(position("ServiceAccount") < position("DaemonSet"));
    }
}
