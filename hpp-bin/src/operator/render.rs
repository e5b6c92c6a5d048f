//! `hpp-operator render -f CR.yaml`: the operator's desired objects for a CR, offline.

use std::path::PathBuf;

use anyhow::Context as _;
use hpp_api::HostPathProvisioner;
use hpp_reconcile::{OperatorConfig, Pipeline};

/// Arguments of `render`.
#[derive(clap::Args, Debug, Clone)]
pub struct RenderArgs {
    /// The HostPathProvisioner YAML (`-` for stdin).
    #[arg(short = 'f', long = "filename")]
    pub file: PathBuf,
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
}

/// Reads a CR from YAML text.
pub fn parse_cr(text: &str) -> anyhow::Result<HostPathProvisioner> {
    serde_saphyr::from_str(text).context("parsing the HostPathProvisioner")
}

/// The YAML stream for `args`, with images and versions from the process environment.
pub fn render(args: &RenderArgs) -> anyhow::Result<String> {
    let text = if args.file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())?
    } else {
        std::fs::read_to_string(&args.file).with_context(|| format!("reading {}", args.file.display()))?
    };
    let hpp = parse_cr(&text)?;
    let mut cfg = OperatorConfig::from_env(std::env::vars());
    if let Some(ns) = &args.namespace {
        cfg.namespace.clone_from(ns);
    }
    let facts = hpp_reconcile::render::offline_facts(&hpp, &args.nodes, args.openshift, args.prometheus);
    Ok(hpp_reconcile::render::render_yaml(
        &Pipeline::standard(),
        &hpp,
        &cfg,
        &facts,
    )?)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use clap::Parser;

    fn count(example: &str, extra: &[&str]) -> usize {
        let file = format!("{}/../deploy/examples/{example}.yaml", env!("CARGO_MANIFEST_DIR"));
        let mut argv = vec!["hpp-operator", "render", "-f", file.as_str()];
        argv.extend_from_slice(extra);
        let args = crate::operator::Args::parse_from(argv);
        let Some(crate::operator::Command::Render(r)) = args.command else {
            panic!("render expected")
        };
        let yaml = render(&r).unwrap();
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
}
