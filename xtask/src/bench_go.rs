//! `cargo xtask bench --go-driver-bin PATH`: hpp's CSI driver side by side with KubeVirt's Go
//! driver (`hostpath-csi-driver`, built locally; see docs/architecture.md, "hpp against the
//! KubeVirt Go driver"), the comparison issue 14 asks for.
//!
//! Both drivers run as child processes on the same freshly made filesystem, each with its own
//! pool directory and socket, and are measured by the same client code in alternating turns
//! (hpp first in even turns, Go first in odd ones), so a noisy moment on the machine slows both
//! alike: Probe, GetCapacity, CreateVolume, DeleteVolume, NodePublishVolume and
//! NodeUnpublishVolume at c=1 and c=16, then DeleteVolume again with 10,000 volumes in each pool
//! (KubeVirt's DeleteVolume lists every pool on each call), and the resident memory of both
//! processes idle and holding 10,000 volumes. What is compared is each driver as it ships:
//! hpp's CreateVolume and DeleteVolume are durable (a flush of the pool's volume journal, or
//! an fsync of the pool directory), KubeVirt's sync nothing.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Context as _;
use std::time::Duration;

use hpp_csi::csi::{
    self, controller_client::ControllerClient, identity_client::IdentityClient, node_client::NodeClient,
};
use tonic::transport::Channel;

use crate::bench::{create_request, each_sample, fill, mount_cap};
use crate::bench_proc::{self, ProcStatus};
use crate::bench_serve::{self, Server};
use crate::bench_stats::{Sample, Stats, Table, fmt_d, per_call, ratio};

/// The driver name every KubeVirt manifest gives the Go driver.
const GO_DRIVER_NAME: &str = "kubevirt.io.hostpath-provisioner";
/// The two drivers, in the order of every pair here.
const DRIVERS: [&str; 2] = ["hpp", "the Go driver"];
/// How often a failed call is tried again before the measurement fails. KubeVirt's node
/// server reads /proc/mounts through k8s.io/utils/mount, which gives up with "could not get
/// consistent content of /proc/mounts after 3 attempts" while other mounts change; kubelet
/// retries such a call, and so does the bench, counting the failures.
const RETRIES: usize = 5;
/// Turns each compared measurement is split into.
const TURNS: usize = 10;
/// The concurrencies compared.
const CONCURRENCY: [usize; 2] = [1, 16];

/// The klog verbosity KubeVirt runs its driver at: its operator passes `--v=$VERBOSITY`, which
/// defaults to 3, and its `deploy/csi` manifest passes `--v=3`. At 3 the driver logs two lines per
/// CreateVolume ("GRPC call", "Create Volume Request") and one per other call but Probe; hpp at
/// its default level (`info`) logs one line per created or deleted volume.
pub const KUBEVIRT_VERBOSITY: u32 = 3;

/// The KubeVirt Go driver to compare with: its executable and the `--v` it runs at.
#[derive(Debug, Clone)]
pub struct GoDriver {
    /// `hostpath-csi-driver`, built locally.
    pub bin: std::path::PathBuf,
    /// klog verbosity ([`KUBEVIRT_VERBOSITY`] as shipped; 0 logs nothing per call).
    pub verbosity: u32,
}

impl std::fmt::Display for GoDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} --v={}", self.bin.display(), self.verbosity)
    }
}

/// The Go driver's command line (program name first), with KubeVirt's flags: one pool `legacy`
/// at `DIR/pool` (the `--datadir` JSON array of the upstream driver), its socket `DIR/csi.sock`,
/// klog verbosity `verbosity`.
pub fn go_driver_args(dir: &Path, verbosity: u32) -> anyhow::Result<Vec<String>> {
    let pools = serde_json::to_string(&[serde_json::json!({
        "name": "legacy",
        "path": dir.join("pool"),
    })])?;
    Ok(vec![
        "hostpath-csi-driver".to_owned(),
        "--endpoint".to_owned(),
        format!("unix://{}", bench_serve::socket(dir).display()),
        "--nodeid".to_owned(),
        "bench".to_owned(),
        "--version".to_owned(),
        "bench".to_owned(),
        "--drivername".to_owned(),
        GO_DRIVER_NAME.to_owned(),
        "--datadir".to_owned(),
        pools,
        format!("--v={verbosity}"),
    ])
}

/// One compared measurement: the same RPC on both drivers.
#[derive(Debug, Clone)]
struct Row {
    rpc: &'static str,
    conc: usize,
    /// hpp, then Go.
    stats: [Stats; 2],
    /// CPU time per call of each driver process over its turns.
    cpu: [Duration; 2],
    /// Calls that failed and were tried again (their time counts in the latency).
    failed: [usize; 2],
}

/// Clients of one driver.
#[derive(Clone)]
struct Clients {
    id: IdentityClient<Channel>,
    ctl: ControllerClient<Channel>,
    node: NodeClient<Channel>,
}

impl Clients {
    fn of(server: &Server) -> Clients {
        Clients {
            id: IdentityClient::new(server.channel.clone()),
            ctl: ControllerClient::new(server.channel.clone()),
            node: NodeClient::new(server.channel.clone()),
        }
    }
}

/// The two drivers and their clients, hpp first.
struct Pair<'a> {
    servers: [&'a Server; 2],
    clients: [Clients; 2],
}

impl Pair<'_> {
    /// Runs `call(clients, which, i)` for i in 0..n on both drivers (`which` 0 = hpp, 1 = Go)
    /// in [`TURNS`] alternating turns at concurrency `conc`.
    async fn alternate<F, Fut>(&self, rpc: &'static str, n: usize, conc: usize, call: F) -> anyhow::Result<Row>
    where
        F: Fn(Clients, usize, usize) -> Fut + Clone + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<(), tonic::Status>> + Send + 'static,
    {
        let per_turn = n.div_ceil(TURNS).max(1);
        let failed = [Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0))];
        let mut samples = [Sample::default(), Sample::default()];
        let mut cpu = [Duration::ZERO; 2];
        let (mut start, mut turn) = (0, 0);
        while start < n {
            let len = per_turn.min(n - start);
            for which in turn_order(turn) {
                let pid = self.servers[which].pid();
                let call = call.clone();
                let before = bench_proc::cpu_time(pid)?;
                let failed = failed[which].clone();
                let sample = each_sample(rpc, len, conc, self.clients[which].clone(), move |c, i| {
                    let (call, failed) = (call.clone(), failed.clone());
                    async move {
                        let mut tries = 0;
                        loop {
                            match call(c.clone(), which, start + i).await {
                                Err(_) if tries < RETRIES => {
                                    tries += 1;
                                    failed.fetch_add(1, Ordering::Relaxed);
                                }
                                result => return result,
                            }
                        }
                    }
                })
                .await
                .with_context(|| format!("on {}", DRIVERS[which]))?;
                cpu[which] += bench_proc::cpu_time(pid)?.saturating_sub(before);
                samples[which].extend(sample);
            }
            start += len;
            turn += 1;
        }
        Ok(Row {
            rpc,
            conc,
            stats: samples.map(Sample::stats),
            cpu: cpu.map(|c| per_call(c, n)),
            failed: failed.map(|f| f.load(Ordering::Relaxed)),
        })
    }
}

/// Which driver goes first in `turn`: hpp in even turns, Go in odd ones.
fn turn_order(turn: usize) -> [usize; 2] {
    if turn.is_multiple_of(2) { [0, 1] } else { [1, 0] }
}

/// Starts the Go driver on `dir` with [`go_driver_args`].
pub async fn spawn_go(go: &GoDriver, dir: &Path) -> anyhow::Result<Server> {
    let mut cmd = std::process::Command::new(&go.bin);
    cmd.args(go_driver_args(dir, go.verbosity)?.iter().skip(1));
    Server::start(cmd, &go.bin.display().to_string(), dir).await
}

/// The whole comparison on the filesystem holding `dir`; `hpp` is started by the caller (the
/// same way the rest of the bench starts it), the Go driver `go_driver` here.
pub async fn compare(
    hpp: &Server,
    hpp_exe: &Path,
    go_driver: &GoDriver,
    dir: &Path,
    (n, mount_n, rss_volumes, idle_wait): (usize, usize, usize, u64),
    root: bool,
) -> anyhow::Result<()> {
    let go = &spawn_go(go_driver, &dir.join("go")).await?;
    println!();
    println!(
        "hpp vs the KubeVirt Go driver: {} (pid {}) and {go_driver} (pid {})",
        hpp_exe.display(),
        hpp.pid(),
        go.pid()
    );
    let mut memory = vec![(
        "after start".to_owned(),
        [ProcStatus::of(hpp.pid())?, ProcStatus::of(go.pid())?],
    )];
    let pair = Pair {
        servers: [hpp, go],
        clients: [Clients::of(hpp), Clients::of(go)],
    };
    let targets = dir.join("targets-vs-go");
    let mut rows = Vec::new();
    for conc in CONCURRENCY {
        rows.extend(round(&pair, &targets, conc, (n, mount_n), root).await?);
    }
    tokio::time::sleep(Duration::from_secs(idle_wait)).await;
    memory.push((
        format!("idle {idle_wait} s after the rounds"),
        [ProcStatus::of(hpp.pid())?, ProcStatus::of(go.pid())?],
    ));
    let mut fills = [Stats::default(); 2];
    for (which, server) in pair.servers.iter().enumerate() {
        fills[which] = fill(&server.channel, rss_volumes).await?;
    }
    memory.push((
        format!("after creating {rss_volumes} volumes"),
        [ProcStatus::of(hpp.pid())?, ProcStatus::of(go.pid())?],
    ));
    // DeleteVolume again with the pools full: KubeVirt's lists every pool per call.
    let deleted = n.min(rss_volumes);
    for conc in CONCURRENCY {
        let offset = if conc == 1 { 0 } else { deleted };
        let count = deleted.min(rss_volumes.saturating_sub(offset));
        let row = pair
            .alternate("DeleteVolume (full pool)", count, conc, move |mut c, _, i| async move {
                c.ctl
                    .delete_volume(csi::DeleteVolumeRequest {
                        volume_id: format!("pvc-rss-{:05}", offset + i),
                        ..Default::default()
                    })
                    .await
                    .map(drop)
            })
            .await?;
        rows.push(row);
    }
    tokio::time::sleep(Duration::from_secs(idle_wait)).await;
    memory.push((
        format!("idle {idle_wait} s after that"),
        [ProcStatus::of(hpp.pid())?, ProcStatus::of(go.pid())?],
    ));
    print_rows(&rows);
    println!(
        "filling the pools: {rss_volumes} CreateVolume at c=16, hpp {:.0} ops/s, Go {:.0} ops/s ({})",
        fills[0].ops_per_sec,
        fills[1].ops_per_sec,
        ratio(fills[0].ops_per_sec, fills[1].ops_per_sec)
    );
    print_memory(&memory);
    Ok(())
}

/// Every compared RPC at concurrency `conc`.
async fn round(
    pair: &Pair<'_>,
    targets: &Path,
    conc: usize,
    (n, mount_n): (usize, usize),
    root: bool,
) -> anyhow::Result<Vec<Row>> {
    let mut rows = vec![
        pair.alternate("Probe", n, conc, |mut c, _, _| async move {
            c.id.probe(csi::ProbeRequest {}).await.map(drop)
        })
        .await?,
        pair.alternate("GetCapacity", n, conc, |mut c, _, _| async move {
            c.ctl.get_capacity(csi::GetCapacityRequest::default()).await.map(drop)
        })
        .await?,
    ];
    let vol = move |i: usize| format!("pvc-vs-c{conc}-{i}");
    let create = move |mut c: Clients, _, i| async move { c.ctl.create_volume(create_request(vol(i))).await.map(drop) };
    rows.push(pair.alternate("CreateVolume", n, conc, create).await?);
    rows.push(
        pair.alternate("DeleteVolume", n, conc, move |mut c, _, i| async move {
            c.ctl
                .delete_volume(csi::DeleteVolumeRequest {
                    volume_id: vol(i),
                    ..Default::default()
                })
                .await
                .map(drop)
        })
        .await?,
    );
    if root && mount_n > 0 {
        // `conc` volumes per driver, published `mount_n` times onto targets of its own.
        let published = move |w: usize| format!("pvc-vs-pub{conc}-{w}");
        pair.alternate("CreateVolume", conc, conc, move |mut c, _, w| async move {
            c.ctl.create_volume(create_request(published(w))).await.map(drop)
        })
        .await?;
        let dirs = [
            targets.join(format!("hpp-c{conc}")),
            targets.join(format!("go-c{conc}")),
        ];
        for d in &dirs {
            std::fs::create_dir_all(d)?;
        }
        let target = move |which: usize, i: usize| dirs[which].join(format!("p{i}")).to_string_lossy().into_owned();
        let t = target.clone();
        rows.push(
            pair.alternate("NodePublishVolume", mount_n, conc, move |mut c, which, i| {
                let target_path = t(which, i);
                async move {
                    c.node
                        .node_publish_volume(csi::NodePublishVolumeRequest {
                            volume_id: published(i % conc),
                            target_path,
                            volume_capability: Some(mount_cap()),
                            ..Default::default()
                        })
                        .await
                        .map(drop)
                }
            })
            .await?,
        );
        rows.push(
            pair.alternate("NodeUnpublishVolume", mount_n, conc, move |mut c, which, i| {
                let target_path = target(which, i);
                async move {
                    c.node
                        .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                            volume_id: published(i % conc),
                            target_path,
                        })
                        .await
                        .map(drop)
                }
            })
            .await?,
        );
    }
    Ok(rows)
}

fn print_rows(rows: &[Row]) {
    println!();
    println!("hpp vs the KubeVirt Go driver (same client, same filesystem, {TURNS} alternating turns)");
    println!("  ratio = hpp ops/s / Go ops/s (>1: hpp faster); hpp's Create/DeleteVolume are durable, Go's are not;");
    println!("  CPU/call = the driver process's user+system time over its turns / calls;");
    println!("  failed = calls that failed and were tried again (up to {RETRIES} times; the time counts)");
    let mut t = Table::new(&[
        "RPC",
        "conc",
        "hpp p50",
        "Go p50",
        "hpp p99",
        "Go p99",
        "hpp ops/s",
        "Go ops/s",
        "ratio",
        "hpp CPU/call",
        "Go CPU/call",
        "failed hpp/Go",
    ]);
    for r in rows {
        let [h, g] = r.stats;
        t.row(vec![
            r.rpc.to_owned(),
            r.conc.to_string(),
            fmt_d(h.p50),
            fmt_d(g.p50),
            fmt_d(h.p99),
            fmt_d(g.p99),
            format!("{:.0}", h.ops_per_sec),
            format!("{:.0}", g.ops_per_sec),
            ratio(h.ops_per_sec, g.ops_per_sec),
            fmt_d(r.cpu[0]),
            fmt_d(r.cpu[1]),
            format!("{}/{}", r.failed[0], r.failed[1]),
        ]);
    }
    println!("{}", t.render());
}

fn print_memory(readings: &[(String, [ProcStatus; 2])]) {
    println!();
    println!("Memory, hpp vs the KubeVirt Go driver (/proc/PID/status)");
    let mut t = Table::new(&[
        "when",
        "hpp VmRSS KiB",
        "Go VmRSS KiB",
        "hpp RssAnon KiB",
        "Go RssAnon KiB",
        "hpp threads",
        "Go threads",
    ]);
    for (when, [h, g]) in readings {
        t.row(vec![
            when.clone(),
            h.rss_kib.to_string(),
            g.rss_kib.to_string(),
            h.anon_kib.to_string(),
            g.anon_kib.to_string(),
            h.threads.to_string(),
            g.threads.to_string(),
        ]);
    }
    println!("{}", t.render());
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn go_driver_gets_kubevirts_flags_with_its_pool_and_socket_in_its_directory() {
        let args = go_driver_args(Path::new("/run/bench/go"), KUBEVIRT_VERBOSITY).unwrap();
        assert_eq!(
            args,
            [
                "hostpath-csi-driver",
                "--endpoint",
                "unix:///run/bench/go/csi.sock",
                "--nodeid",
                "bench",
                "--version",
                "bench",
                "--drivername",
                "kubevirt.io.hostpath-provisioner",
                "--datadir",
                r#"[{"name":"legacy","path":"/run/bench/go/pool"}]"#,
                "--v=3",
            ]
        );
    }

    #[test]
    fn turns_alternate_which_driver_goes_first() {
        assert_eq!(turn_order(0), [0, 1]);
        assert_eq!(turn_order(1), [1, 0]);
        assert_eq!(turn_order(4), [0, 1]);
    }
}
