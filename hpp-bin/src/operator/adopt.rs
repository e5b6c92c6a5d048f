//! `hpp-operator adopt`: volumes of other hostPath provisioners become volumes of hpp's CSI
//! driver, in place (the library is `hpp_reconcile::adopt`). `--dry-run` lists what it would do
//! and why not; a real run asks first (or takes `--yes`), then adopts claim by claim and prints
//! each outcome and a summary line. Output is a table, or `-o json|yaml` for scripts; the exit
//! status is non-zero when a real run leaves a claim refused, waiting, stuck or failed.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use hpp_reconcile::adopt::{self, Report, RunOptions, Scope, Survey};
use kube::config::{KubeConfigOptions, Kubeconfig};

/// Arguments of `adopt`.
#[derive(clap::Args, Debug, Clone)]
pub struct AdoptArgs {
    /// List what would be adopted and why each other claim would not; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Only claims of this namespace (default: every namespace).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Only claims with these labels, a label selector as kubectl takes it (`app=db,tier!=cache`).
    #[arg(short = 'l', long)]
    pub selector: Option<String>,
    /// StorageClass of the new PVs and claims (default: the one hpp class serving the pool).
    #[arg(long)]
    pub storage_class: Option<String>,
    /// Directories renamed on the nodes since their PVs were made, FROM=TO: a PV's directory under
    /// FROM is now under TO (repeatable).
    #[arg(long, value_name = "FROM=TO", value_parser = adopt::pools::parse_moved)]
    pub moved: Vec<(String, String)>,
    /// Output format: a table, or one JSON or YAML document.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// Adopt without asking.
    #[arg(long)]
    pub yes: bool,
    /// How long to wait for an old claim to go once deleted (its pvc-protection finalizer holds
    /// it while a pod uses it), such as `90s` or `5m`.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or the pod's service account).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context (default: the current one).
    #[arg(long)]
    pub context: Option<String>,
    /// API server URL, overriding the kubeconfig's.
    #[arg(long)]
    pub master: Option<String>,
}

/// Output formats of `adopt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Columns, as kubectl prints them, and the summary line.
    Table,
    /// One JSON document: `dryRun`, `claims`, `summary`.
    Json,
    /// The same as YAML.
    Yaml,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    hpp_api::duration::parse(s).map_err(|e| e.to_string())
}

/// The client for `args`' kubeconfig, context and API server.
pub async fn client(args: &AdoptArgs) -> anyhow::Result<kube::Client> {
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..KubeConfigOptions::default()
    };
    let mut config = match (&args.kubeconfig, &args.context) {
        (Some(path), _) => {
            let kc = Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &options).await?
        }
        (None, Some(_)) => kube::Config::from_kubeconfig(&options)
            .await
            .context("reading the kubeconfig")?,
        (None, None) => kube::Config::infer()
            .await
            .context("no kubeconfig or in-cluster configuration")?,
    };
    if let Some(url) = args.master.as_deref().filter(|m| !m.is_empty()) {
        config.cluster_url = url.parse().with_context(|| format!("invalid --master URL {url:?}"))?;
    }
    Ok(kube::Client::try_from(config)?)
}

/// What the run may read from and write to the person running it.
pub struct Console<'a> {
    /// Whether stdin is a terminal (a person can answer).
    pub interactive: bool,
    /// The answer.
    pub input: &'a mut dyn BufRead,
    /// Where the question goes (stderr).
    pub prompt: &'a mut dyn Write,
}

/// Runs `adopt` against `client`; the text to print on stdout, or why it failed. A real run
/// that leaves claims needing attention prints its report and fails.
pub async fn run(args: &AdoptArgs, client: &kube::Client, console: Console<'_>) -> anyhow::Result<String> {
    let scope = Scope {
        namespace: args.namespace.clone(),
        selector: args.selector.clone(),
        storage_class: args.storage_class.clone(),
        moved: args.moved.clone(),
    };
    let survey = adopt::plan(client, &scope).await?;
    if args.dry_run {
        return render(&survey.report(), args.output);
    }
    if !survey.units.is_empty() && !args.yes {
        confirm(&survey, console)?;
    }
    let options = RunOptions {
        claim_wait: args.timeout,
        instance: std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()),
        ..RunOptions::default()
    };
    let report = adopt::adopt(client, &survey, &options).await;
    let text = render(&report, args.output)?;
    match report.has_problems() {
        false => Ok(text),
        true => Err(Unfinished {
            text,
            summary: report.summary,
        }
        .into()),
    }
}

/// A real run that left claims needing attention: its report is still printed.
#[derive(Debug, thiserror::Error)]
#[error("{summary}: fix what each claim's reason says and run the same command again")]
pub struct Unfinished {
    /// The report, as it would have been printed.
    pub text: String,
    /// The summary line.
    pub summary: String,
}

/// Shows the plan and asks; only a terminal can answer.
fn confirm(survey: &Survey, console: Console<'_>) -> anyhow::Result<()> {
    if !console.interactive {
        anyhow::bail!(
            "refusing to change the cluster without --yes: stdin is not a terminal (see the plan with --dry-run)"
        );
    }
    let adopting = survey.units.iter().filter(|u| u.actionable()).count();
    let refused = survey.units.len() - adopting;
    let events = match refused {
        0 => String::new(),
        n => format!("; {n} refused claim(s) get an AdoptionFailed Event"),
    };
    write!(
        console.prompt,
        "{}Adopt {adopting} claim(s) (their directories stay where they are{events})? [y/N] ",
        table(&survey.report())
    )?;
    console.prompt.flush()?;
    let mut answer = String::new();
    console.input.read_line(&mut answer)?;
    match answer.trim() {
        "y" | "Y" | "yes" | "YES" | "Yes" => Ok(()),
        _ => anyhow::bail!("not confirmed: nothing was changed"),
    }
}

/// `report` in `format`.
pub fn render(report: &Report, format: Output) -> anyhow::Result<String> {
    let mut out = match format {
        Output::Table => table(report),
        Output::Json => serde_json::to_string_pretty(report)?,
        Output::Yaml => serde_saphyr::to_string(report)?,
    };
    if !out.ends_with('\n') {
        out.push('\n');
    }
    Ok(out)
}

/// Columns of the table.
const HEADERS: [&str; 11] = [
    "NAMESPACE",
    "CLAIM",
    "PV",
    "SOURCE",
    "NODE",
    "DIRECTORY",
    "POOL",
    "VOLUME ID",
    "STORAGECLASS",
    "STATUS",
    "REASON",
];

/// The report as left-aligned columns three spaces apart (as kubectl prints them), `<none>`
/// for what does not apply, then the summary line.
pub fn table(report: &Report) -> String {
    let none = |v: Option<&str>| v.filter(|s| !s.is_empty()).unwrap_or("<none>").to_owned();
    let rows: Vec<Vec<String>> = report
        .claims
        .iter()
        .map(|r| {
            let f = &r.found;
            vec![
                f.namespace.clone(),
                f.claim.clone(),
                f.pv.clone(),
                none(f.source.map(|s| s.as_str())),
                none(f.node.as_deref()),
                none(f.directory.as_deref()),
                none(f.pool.as_deref()),
                none(f.volume_id.as_deref()),
                none(f.storage_class.as_deref()),
                r.status.as_str().to_owned(),
                match r.reason_text() {
                    t if t.is_empty() => "<none>".to_owned(),
                    t => t,
                },
            ]
        })
        .collect();
    let mut out = String::new();
    if !rows.is_empty() {
        out.push_str(&crate::columns::columns(&HEADERS, &rows));
        out.push('\n');
    }
    out.push_str(&report.summary);
    out.push('\n');
    out
}

/// Runs `adopt` with the process's terminal: the report on stdout, the question on stderr.
pub async fn main(args: AdoptArgs) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = client(&args).await?;
    let stdin = std::io::stdin();
    let interactive = stdin.is_terminal();
    let mut input = stdin.lock();
    let mut prompt = std::io::stderr();
    let console = Console {
        interactive,
        input: &mut input,
        prompt: &mut prompt,
    };
    match run(&args, &client, console).await {
        Ok(text) => super::print_stdout(&text),
        Err(e) => match e.downcast::<Unfinished>() {
            Ok(unfinished) => {
                super::print_stdout(&unfinished.text)?;
                Err(unfinished.into())
            }
            Err(e) => Err(e),
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use clap::Parser;
    use hpp_api::HostPathProvisioner;
    use hpp_api::constants as c;
    use hpp_reconcile::adopt::Source;
    use hpp_reconcile::testkit::FakeApiServer;
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
    use serde_json::{Value, json};

    fn args(extra: &[&str]) -> AdoptArgs {
        let mut argv = vec!["hpp-operator", "adopt"];
        argv.extend_from_slice(extra);
        match crate::operator::Args::parse_from(argv).command {
            Some(crate::operator::Command::Adopt(a)) => a,
            other => panic!("adopt expected, got {other:?}"),
        }
    }

    #[test]
    fn flags_are_kubectls() {
        let a = args(&[
            "--dry-run",
            "-n",
            "apps",
            "-l",
            "app=db",
            "--storage-class",
            "hostpath-csi",
            "-o",
            "json",
            "--moved",
            "/var/hpvolumes=/var/hpvolumes/csi",
            "--timeout",
            "2m",
            "--kubeconfig",
            "/k",
            "--context",
            "prod",
            "--master",
            "https://10.0.0.1:6443",
        ]);
        assert!(a.dry_run && !a.yes);
        assert_eq!(
            (a.namespace.as_deref(), a.selector.as_deref()),
            (Some("apps"), Some("app=db"))
        );
        assert_eq!(a.storage_class.as_deref(), Some("hostpath-csi"));
        assert_eq!(a.output, Output::Json);
        assert_eq!(
            a.moved,
            [("/var/hpvolumes".to_owned(), "/var/hpvolumes/csi".to_owned())]
        );
        assert_eq!(a.timeout, Duration::from_secs(120));
        assert_eq!(a.kubeconfig, Some(PathBuf::from("/k")));
        assert_eq!(
            (a.context.as_deref(), a.master.as_deref()),
            (Some("prod"), Some("https://10.0.0.1:6443"))
        );
        let defaults = args(&[]);
        assert_eq!(
            (defaults.output, defaults.timeout),
            (Output::Table, Duration::from_secs(60))
        );
        for bad in [&["--moved", "relative=/x"][..], &["-o", "wide"], &["--timeout", "soon"]] {
            let mut argv = vec!["hpp-operator", "adopt"];
            argv.extend_from_slice(bad);
            assert!(crate::operator::Args::try_parse_from(argv).is_err(), "{bad:?}");
        }
    }

    /// A cluster with one pool `local` on node-a and two claims: a KubeVirt-legacy PV in the
    /// pool, and a local-path PV outside any pool.
    fn cluster() -> FakeApiServer {
        let fake = FakeApiServer::new();
        fake.register::<HostPathProvisioner>(false, true);
        fake.seed::<HostPathProvisioner>(
            &serde_json::from_value(json!({
                "apiVersion": "hostpathprovisioner.kubevirt.io/v1beta1", "kind": "HostPathProvisioner",
                "metadata": {"name": "hostpath-provisioner"},
                "spec": {"imagePullPolicy": "IfNotPresent", "storagePools": [{"name": "local", "path": "/var/hpvolumes"}]},
            }))
            .unwrap(),
        );
        fake.seed::<k8s_openapi::api::core::v1::Node>(
            &serde_json::from_value(
                json!({"metadata": {"name": "node-a", "labels": {"kubernetes.io/hostname": "node-a"}}}),
            )
            .unwrap(),
        );
        fake.seed::<CSINode>(
            &serde_json::from_value(json!({"metadata": {"name": "node-a"},
                                           "spec": {"drivers": [{"name": c::DRIVER_NAME, "nodeID": "node-a"}]}}))
            .unwrap(),
        );
        fake.seed::<StorageClass>(
            &serde_json::from_value(
                json!({"metadata": {"name": "hostpath-csi"}, "provisioner": c::DRIVER_NAME,
                                           "parameters": {"storagePool": "local"}}),
            )
            .unwrap(),
        );
        for (claim, pv, path) in [
            ("vm-disk", "pvc-1", "/var/hpvolumes/csi/pvc-1"),
            ("cache", "pvc-2", "/opt/local-path-provisioner/pvc-2_apps_cache"),
        ] {
            let c = fake.seed::<PersistentVolumeClaim>(
                &serde_json::from_value(json!({
                    "metadata": {"name": claim, "namespace": "apps"},
                    "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": pv, "resources": {"requests": {"storage": "1Gi"}}},
                    "status": {"phase": "Bound"},
                }))
                .unwrap(),
            );
            fake.seed::<PersistentVolume>(
                &serde_json::from_value(json!({
                    "metadata": {"name": pv, "annotations": {"kubevirt.io/provisionOnNode": "node-a",
                                 "hostPathProvisionerIdentity": "kubevirt.io/hostpath-provisioner"}},
                    "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "persistentVolumeReclaimPolicy": "Delete",
                             "hostPath": {"path": path},
                             "claimRef": {"namespace": "apps", "name": claim, "uid": c.metadata.uid}},
                    "status": {"phase": "Bound"},
                }))
                .unwrap(),
            );
        }
        fake
    }

    fn no_terminal<'a>(input: &'a mut &'static [u8], prompt: &'a mut Vec<u8>) -> Console<'a> {
        Console {
            interactive: false,
            input,
            prompt,
        }
    }

    #[tokio::test]
    async fn a_dry_run_prints_a_table_or_a_document_and_writes_nothing() {
        let fake = cluster();
        let (mut input, mut prompt) = (&b""[..], Vec::new());
        let text = run(
            &args(&["--dry-run"]),
            &fake.client(),
            no_terminal(&mut input, &mut prompt),
        )
        .await
        .unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("NAMESPACE   CLAIM     PV      SOURCE"), "{text}");
        assert!(lines[0].ends_with("STATUS      REASON"), "{text}");
        assert!(lines[1].starts_with("apps        cache     pvc-2   kubevirt-legacy   node-a   /opt/local-path-provisioner/pvc-2_apps_cache   <none>"), "{text}");
        assert!(lines[1].contains("Refused     NoPool: no hpp pool holds"), "{text}");
        assert!(
            lines[2].contains("local    pvc-1       hostpath-csi   Adoptable   <none>"),
            "{text}"
        );
        assert_eq!(
            lines[3],
            "adopt (dry run, nothing changed): 1 Adoptable, 1 Refused (2 claims)"
        );
        for format in ["json", "yaml"] {
            let (mut input, mut prompt) = (&b""[..], Vec::new());
            let text = run(
                &args(&["--dry-run", "-o", format]),
                &fake.client(),
                no_terminal(&mut input, &mut prompt),
            )
            .await
            .unwrap();
            let doc: Value = match format {
                "json" => serde_json::from_str(&text).unwrap(),
                _ => serde_saphyr::from_str(&text).unwrap(),
            };
            assert_eq!(doc["dryRun"], true);
            assert_eq!(doc["claims"][1]["volumeId"], "pvc-1");
            assert_eq!(doc["claims"][1]["status"], "Adoptable");
            assert_eq!(doc["claims"][0]["refusals"][0]["reason"], "NoPool");
        }
        assert!(fake.write_requests().is_empty());
    }

    #[tokio::test]
    async fn a_real_run_asks_a_terminal_and_refuses_without_one() {
        let fake = cluster();
        let (mut input, mut prompt) = (&b""[..], Vec::new());
        let err = run(&args(&[]), &fake.client(), no_terminal(&mut input, &mut prompt))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("without --yes") && err.contains("not a terminal"), "{err}");
        let (mut input, mut prompt) = (&b"n\n"[..], Vec::new());
        let console = Console {
            interactive: true,
            input: &mut input,
            prompt: &mut prompt,
        };
        let err = run(&args(&[]), &fake.client(), console).await.unwrap_err().to_string();
        assert!(err.contains("not confirmed"), "{err}");
        let asked = String::from_utf8(prompt).unwrap();
        assert!(asked.contains("Adoptable") && asked.ends_with("Adopt 1 claim(s) (their directories stay where they are; 1 refused claim(s) get an AdoptionFailed Event)? [y/N] "), "{asked}");
        assert!(fake.write_requests().is_empty(), "nothing written before the answer");

        let (mut input, mut prompt) = (&b"y\n"[..], Vec::new());
        let console = Console {
            interactive: true,
            input: &mut input,
            prompt: &mut prompt,
        };
        let err = run(&args(&[]), &fake.client(), console).await.unwrap_err();
        let unfinished = err.downcast::<Unfinished>().unwrap();
        assert!(
            unfinished.text.contains("Adopted") && unfinished.text.contains("Refused"),
            "{}",
            unfinished.text
        );
        assert_eq!(unfinished.summary, "adopt: 1 Adopted, 1 Refused (2 claims)");
        let bound = fake.get::<PersistentVolumeClaim>(Some("apps"), "vm-disk").unwrap();
        assert_eq!(bound.spec.unwrap().volume_name.as_deref(), Some("pvc-1-hpp"));
    }

    #[tokio::test]
    async fn yes_adopts_without_asking_and_succeeds_when_nothing_is_left() {
        let fake = cluster();
        let (mut input, mut prompt) = (&b""[..], Vec::new());
        let text = run(
            &args(&["--yes", "-l", "app!=none", "-n", "apps", "-o", "json"]),
            &fake.client(),
            no_terminal(&mut input, &mut prompt),
        )
        .await;
        // The local-path claim is refused: the run fails, with its report.
        assert!(text.is_err());
        fake.remove::<PersistentVolumeClaim>(Some("apps"), "cache");
        let (mut input, mut prompt) = (&b""[..], Vec::new());
        let text = run(&args(&["--yes"]), &fake.client(), no_terminal(&mut input, &mut prompt))
            .await
            .unwrap();
        assert_eq!(text, "adopt: nothing to adopt (0 claims)\n");
        assert!(prompt.is_empty());
    }

    /// The volume id rules adoption applies are the driver's own.
    #[test]
    fn volume_id_rules_are_the_drivers() {
        let pool = adopt::pools::PoolInfo {
            name: "local".into(),
            base: "/p".into(),
            dir: "/p/csi".into(),
            shared: false,
            quota: hpp_api::quota::QuotaMode::None,
            snapshots: false,
            path_config: false,
        };
        let long = "x".repeat(hpp_csi::pool::validate::MAX_ID_LEN);
        let longer = format!("{long}x");
        for id in [
            "pvc-1",
            "",
            ".",
            "..",
            ".hpp-tmp",
            "a/b",
            "a\nb",
            "with space",
            "pvc-1_ns_name",
            long.as_str(),
            longer.as_str(),
        ] {
            assert_eq!(
                adopt::pools::id_problem(id, &pool).is_none(),
                hpp_csi::pool::validate::check_id("volume id", id).is_ok(),
                "{id:?}"
            );
        }
        assert_eq!(adopt::pools::MAX_ID_LEN, hpp_csi::pool::validate::MAX_ID_LEN);
        assert!(adopt::pools::id_problem("lost+found", &pool).is_some());
    }

    /// PVs hpp's own legacy provisioner makes, in each mode, are recognised as the provisioner
    /// it replaces.
    #[test]
    fn hpp_legacy_pvs_are_recognised_as_the_provisioners_they_replace() {
        use hpp_legacy::{Mode, ProvisionerConfig};
        use hpp_reconcile::adopt::source::{Volume, classify};
        let claim: PersistentVolumeClaim =
            serde_json::from_value(json!({"metadata": {"name": "c", "namespace": "ns", "uid": "u"}})).unwrap();
        for (mode, node, want) in [
            (Mode::Kubevirt, Some("node-a"), Source::KubevirtLegacy),
            (Mode::Shared, None, Source::Torchbox),
            (Mode::SingleNode, Some("node-a"), Source::Hostpath),
        ] {
            let cfg = ProvisionerConfig::new(mode, node.map(str::to_owned), Some("/var/hpvolumes/csi".into()));
            let plan = hpp_legacy::decision::ProvisionPlan {
                pv_name: "pvc-1".into(),
                base_dir: "/var/hpvolumes/csi".into(),
                rel_dir: "pvc-1".into(),
                request_bytes: 1 << 30,
                request_quantity: "1Gi".into(),
                access_modes: vec!["ReadWriteOnce".into()],
                reclaim_policy: "Delete".into(),
                storage_class: "legacy".into(),
                dir_mode: 0o770,
                uid: None,
                gid: None,
                archive_on_delete: false,
                cephfs_quota: false,
                node: node.map(str::to_owned),
                params: hpp_legacy::params::ClassParams::default(),
                ignored_mount_options: Vec::new(),
            };
            let pv = hpp_legacy::pv::build_pv(&cfg, &plan, &claim, node);
            assert_eq!(
                classify(&pv),
                Volume::Directory {
                    source: want,
                    path: "/var/hpvolumes/csi/pvc-1".into()
                },
                "{mode:?}"
            );
        }
    }
}
