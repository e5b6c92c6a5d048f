//! `cargo xtask bench` (formerly the `hpp-bench` binary of hpp-bin): measures the CSI driver over its unix socket next to the bare system calls it
//! wraps, in the same run and on the same filesystem:
//!
//! | RPC | baseline |
//! |---|---|
//! | CreateVolume | mkdir |
//! | ControllerExpandVolume (row `ExpandVolume`) | fsetxattr + fsync (the size record) |
//! | DeleteVolume | rmdir |
//! | NodePublishVolume | bind mount |
//! | NodeUnpublishVolume | umount + rmdir |
//! | GetCapacity | statvfs |
//!
//! p50/p99 latency and throughput at concurrency 1 and 16, then the driver's resident memory
//! after 10,000 volumes. The driver runs in a child process (this binary with
//! `bench --serve-driver`) so its RSS is its own. It uses only hpp-csi's public API (the
//! builder, the generated CSI clients, `client::connect`, `mountinfo`).
//! `cargo run --release -p xtask -- bench --dir /var/tmp/hpp-bench` for release numbers.
//!
//! `--validation` instead measures the webhook's CR validation: the largest spec the schema
//! admits and floods of identical pools (`hpp_api::validation::worst_case`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use hpp_csi::csi::{self, controller_client::ControllerClient, node_client::NodeClient};
use hpp_csi::{Driver, Endpoint, PoolConfig};
use tokio::signal::unix::{SignalKind, signal};

/// Options of `cargo xtask bench`.
#[derive(Debug, Parser)]
#[command(name = "hpp-bench", about = "Benchmark the hpp CSI driver against bare syscalls")]
pub struct Args {
    /// Parent of the scratch directory (a `run-<pid>` subdirectory is created and removed).
    /// Use a disk-backed filesystem, not tmpfs, for disk numbers.
    #[arg(long, default_value = "/var/tmp/hpp-bench")]
    dir: PathBuf,
    /// Operations per measurement for CreateVolume, DeleteVolume and GetCapacity.
    #[arg(long, default_value_t = 2000)]
    ops: usize,
    /// Operations per measurement for publish/unpublish (each is a real mount).
    #[arg(long, default_value_t = 500)]
    mount_ops: usize,
    /// Volumes to hold before reading the driver's resident memory.
    #[arg(long, default_value_t = 10_000)]
    rss_volumes: usize,
    /// Only measure CR validation (the webhook's cost): the largest spec the schema admits and
    /// floods of identical pools, then exit. Needs no root and no driver.
    #[arg(long)]
    validation: bool,
    /// Only measure the quota backends (Create/Delete/Publish per backend, each on a fresh
    /// loop-mounted filesystem, against plain directories), then exit. Needs root.
    #[arg(long)]
    quota_backends: bool,
    /// `--operator`: the operator's steady resident memory (see `bench_operator`).
    #[command(flatten)]
    operator: crate::bench_operator::OperatorArgs,
    /// Internal: serve a driver on DIR (used for the child process).
    #[arg(long, hide = true, value_name = "DIR")]
    serve_driver: Option<PathBuf>,
}

#[derive(Debug, Clone)]
struct Stats {
    p50: Duration,
    p99: Duration,
    ops_per_sec: f64,
}

fn stats(mut lat: Vec<Duration>, wall: Duration) -> Stats {
    lat.sort();
    let pick = |q: f64| {
        let idx = ((lat.len() as f64 - 1.0) * q).round() as usize;
        lat.get(idx).copied().unwrap_or_default()
    };
    Stats {
        p50: pick(0.50),
        p99: pick(0.99),
        ops_per_sec: lat.len() as f64 / wall.as_secs_f64().max(1e-9),
    }
}

fn fmt_d(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us >= 1000.0 {
        format!("{:.2}ms", us / 1000.0)
    } else {
        format!("{us:.1}µs")
    }
}

/// Runs `op(i)` for i in 0..n on `conc` OS threads; returns per-op latencies and wall time.
fn run_threads(
    n: usize,
    conc: usize,
    op: impl Fn(usize) -> anyhow::Result<()> + Send + Sync + 'static,
) -> anyhow::Result<Stats> {
    let op = Arc::new(op);
    let start = Instant::now();
    let handles: Vec<_> = (0..conc)
        .map(|w| {
            let op = op.clone();
            std::thread::spawn(move || -> anyhow::Result<Vec<Duration>> {
                let mut lat = Vec::new();
                let mut i = w;
                while i < n {
                    let t = Instant::now();
                    op(i)?;
                    lat.push(t.elapsed());
                    i += conc;
                }
                Ok(lat)
            })
        })
        .collect();
    let mut all = Vec::with_capacity(n);
    for h in handles {
        all.extend(h.join().map_err(|_| anyhow::anyhow!("worker panicked"))??);
    }
    Ok(stats(all, start.elapsed()))
}

/// Runs the async `op(i)` for i in 0..n on `conc` tasks.
async fn run_tasks<F, Fut>(n: usize, conc: usize, op: F) -> anyhow::Result<Stats>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let op = Arc::new(op);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..conc {
        let op = op.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = w;
            while i < n {
                let t = Instant::now();
                op(i).await?;
                lat.push(t.elapsed());
                i += conc;
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    let mut all = Vec::with_capacity(n);
    for t in tasks {
        all.extend(t.await??);
    }
    Ok(stats(all, start.elapsed()))
}

fn mount_cap() -> csi::VolumeCapability {
    use csi::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
    csi::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

struct Row {
    rpc: &'static str,
    baseline: &'static str,
    conc: usize,
    rpc_stats: Stats,
    base_stats: Stats,
}

fn print_rows(rows: &[Row]) {
    println!(
        "{:<20} {:>4} | {:>9} {:>9} {:>9} | {:<14} {:>9} {:>9} {:>9} | {:>8} {:>8}",
        "RPC", "conc", "p50", "p99", "ops/s", "baseline", "p50", "p99", "ops/s", "p50 x", "ops/s x"
    );
    for r in rows {
        println!(
            "{:<20} {:>4} | {:>9} {:>9} {:>9.0} | {:<14} {:>9} {:>9} {:>9.0} | {:>8.1} {:>8.2}",
            r.rpc,
            r.conc,
            fmt_d(r.rpc_stats.p50),
            fmt_d(r.rpc_stats.p99),
            r.rpc_stats.ops_per_sec,
            r.baseline,
            fmt_d(r.base_stats.p50),
            fmt_d(r.base_stats.p99),
            r.base_stats.ops_per_sec,
            r.rpc_stats.p50.as_secs_f64() / r.base_stats.p50.as_secs_f64().max(1e-9),
            r.base_stats.ops_per_sec / r.rpc_stats.ops_per_sec.max(1e-9),
        );
    }
}

fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS")
}

struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn serve_driver(dir: &Path) -> anyhow::Result<()> {
    let driver = Driver::builder()
        .node_id("bench")
        .pool(PoolConfig::new("legacy", dir.join("pool")))
        .endpoint(Endpoint::Unix(dir.join("csi.sock")))
        .build()?;
    let mut term = signal(SignalKind::terminate())?;
    driver
        .serve(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        })
        .await?;
    Ok(())
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Peak resident memory of this process (VmHWM) in KiB.
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Median time of `runs` calls of `f` (at least one), and what the last call returned.
fn median_of<T>(runs: usize, mut f: impl FnMut() -> T) -> (Duration, T) {
    let start = Instant::now();
    let mut last = f();
    let mut times = vec![start.elapsed()];
    for _ in 1..runs {
        let start = Instant::now();
        last = f();
        times.push(start.elapsed());
    }
    times.sort();
    (times[times.len() / 2], last)
}

/// `--validation`: validation time of the largest admitted CR and of adversarial floods.
fn bench_validation() {
    use hpp_api::validation::{ValidateCreate, ValidateUpdate, worst_case};
    let errors = |r: Result<(), hpp_api::validation::ValidationErrors>| {
        r.err()
            .map_or((0, 0), |e| (e.errors().len() + e.omitted(), e.to_string().len()))
    };
    println!("| case | median | errors found | message bytes |");
    println!("|---|---|---|---|");
    let largest = worst_case::largest_admitted();
    let flood = worst_case::identical_pools(3000);
    let max_dupes = worst_case::identical_pools(hpp_api::constants::MAX_STORAGE_POOLS);
    type Check<'a> = Box<dyn Fn() -> Result<(), hpp_api::validation::ValidationErrors> + 'a>;
    let cases: Vec<(&str, Check<'_>)> = vec![
        (
            "CREATE, largest admitted (64 pools)",
            Box::new(|| largest.validate_create()),
        ),
        (
            "UPDATE, largest admitted (64 pools)",
            Box::new(|| largest.validate_update(&largest)),
        ),
        ("CREATE, 64 identical pools", Box::new(|| max_dupes.validate_create())),
        (
            "UPDATE, 64 identical pools",
            Box::new(|| max_dupes.validate_update(&max_dupes)),
        ),
        ("CREATE, 3000 identical pools", Box::new(|| flood.validate_create())),
        (
            "UPDATE, 3000 identical pools",
            Box::new(|| flood.validate_update(&flood)),
        ),
    ];
    for (name, case) in cases {
        let (median, result) = median_of(21, case);
        let (found, bytes) = errors(result);
        println!("| {name} | {} | {found} | {bytes} |", fmt_d(median));
    }
    println!("peak RSS of the whole run: {} KiB", peak_rss_kib());
}

/// Runs the benchmark (or, with `--serve-driver`, the driver it measures) and prints the tables.
pub async fn run(args: Args) -> anyhow::Result<()> {
    if args.validation {
        bench_validation();
        return Ok(());
    }
    if args.operator.operator {
        return crate::bench_operator::run(&args.operator).await;
    }
    if let Some(dir) = &args.serve_driver {
        return serve_driver(dir).await;
    }
    if args.quota_backends {
        let dir = args.dir.join(format!("quota-{}", std::process::id()));
        let result = crate::bench_quota::run(&dir, args.mount_ops);
        let _ = std::fs::remove_dir_all(&dir);
        return result;
    }
    // A fresh run directory of our own: nothing the user already had is ever deleted.
    let dir = args.dir.join(format!("run-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("base")).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::create_dir_all(dir.join("targets"))?;
    let fs = Command::new("stat").args(["-f", "-c", "%T"]).arg(&dir).output().ok();
    println!(
        "hpp-bench: dir {} ({}), {} cores",
        dir.display(),
        fs.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    );

    let child = Command::new(std::env::current_exe()?)
        .arg("bench")
        .arg("--serve-driver")
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let child = ChildGuard(child);
    let sock = dir.join("csi.sock");
    let endpoint = Endpoint::Unix(sock.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    let channel = loop {
        if sock.exists()
            && let Ok(ch) = hpp_csi::client::connect(&endpoint).await
        {
            break ch;
        }
        anyhow::ensure!(Instant::now() < deadline, "driver did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let pid = child.0.id();
    let rss_start = rss_kib(pid)?;
    let controller_channel = channel.clone();
    let controller = ControllerClient::new(channel.clone());
    let node = NodeClient::new(channel);
    let mut rows = Vec::new();
    let n = args.ops;

    for conc in [1usize, 16] {
        // mkdir / rmdir baseline.
        let base = dir.join("base");
        let b = base.clone();
        let mkdir = run_threads(n, conc, move |i| {
            Ok(std::fs::create_dir(b.join(format!("d{conc}-{i}")))?)
        })?;
        let b = base.clone();
        let record = run_threads(n, conc, move |i| {
            let dir = rustix::fs::open(
                b.join(format!("d{conc}-{i}")),
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )?;
            rustix::fs::fsetxattr(
                &dir,
                "trusted.hpp.bench",
                b"2147483648",
                rustix::fs::XattrFlags::empty(),
            )?;
            rustix::fs::fsync(&dir)?;
            Ok(())
        })?;
        let b = base.clone();
        let rmdir = run_threads(n, conc, move |i| {
            Ok(std::fs::remove_dir(b.join(format!("d{conc}-{i}")))?)
        })?;
        // CreateVolume / DeleteVolume.
        let c = controller.clone();
        let create = run_tasks(n, conc, move |i| {
            let mut c = c.clone();
            async move {
                c.create_volume(csi::CreateVolumeRequest {
                    name: format!("pvc-c{conc}-{i}"),
                    volume_capabilities: vec![mount_cap()],
                    ..Default::default()
                })
                .await?;
                Ok(())
            }
        })
        .await?;
        let c = controller.clone();
        let expand = run_tasks(n, conc, move |i| {
            let mut c = c.clone();
            async move {
                c.controller_expand_volume(csi::ControllerExpandVolumeRequest {
                    volume_id: format!("pvc-c{conc}-{i}"),
                    capacity_range: Some(csi::CapacityRange {
                        required_bytes: 2 << 30,
                        limit_bytes: 0,
                    }),
                    ..Default::default()
                })
                .await?;
                Ok(())
            }
        })
        .await?;
        let c = controller.clone();
        let delete = run_tasks(n, conc, move |i| {
            let mut c = c.clone();
            async move {
                c.delete_volume(csi::DeleteVolumeRequest {
                    volume_id: format!("pvc-c{conc}-{i}"),
                    ..Default::default()
                })
                .await?;
                Ok(())
            }
        })
        .await?;
        rows.push(Row {
            rpc: "CreateVolume",
            baseline: "mkdir",
            conc,
            rpc_stats: create,
            base_stats: mkdir,
        });
        rows.push(Row {
            rpc: "ExpandVolume",
            baseline: "fsetxattr+fsync",
            conc,
            rpc_stats: expand,
            base_stats: record,
        });
        rows.push(Row {
            rpc: "DeleteVolume",
            baseline: "rmdir",
            conc,
            rpc_stats: delete,
            base_stats: rmdir,
        });

        // GetCapacity / statvfs.
        let p = dir.join("pool");
        let statvfs = run_threads(n, conc, move |_| Ok(rustix::fs::statvfs(&p).map(|_| ())?))?;
        let c = controller.clone();
        let cap = run_tasks(n, conc, move |_| {
            let mut c = c.clone();
            async move {
                c.get_capacity(csi::GetCapacityRequest::default()).await?;
                Ok(())
            }
        })
        .await?;
        rows.push(Row {
            rpc: "GetCapacity",
            baseline: "statvfs",
            conc,
            rpc_stats: cap,
            base_stats: statvfs,
        });

        // Publish / unpublish vs bind mount / umount+rmdir.
        if is_root() {
            let m = args.mount_ops;
            for w in 0..conc {
                let mut c = controller.clone();
                c.create_volume(csi::CreateVolumeRequest {
                    name: format!("pvc-pub{conc}-{w}"),
                    volume_capabilities: vec![mount_cap()],
                    ..Default::default()
                })
                .await?;
            }
            let (src, tgt) = (dir.join("pool"), dir.join("targets"));
            let bind = run_threads(m, conc, move |i| {
                let t = tgt.join(format!("b{conc}-{i}"));
                std::fs::create_dir(&t)?;
                rustix::mount::mount_bind(src.join(format!("pvc-pub{conc}-{}", i % conc)), &t)?;
                Ok(())
            })?;
            let tgt = dir.join("targets");
            let umount = run_threads(m, conc, move |i| {
                let t = tgt.join(format!("b{conc}-{i}"));
                rustix::mount::unmount(&t, rustix::mount::UnmountFlags::NOFOLLOW)?;
                std::fs::remove_dir(&t)?;
                Ok(())
            })?;
            let (nd, tgt) = (node.clone(), dir.join("targets"));
            let publish = run_tasks(m, conc, move |i| {
                let mut nd = nd.clone();
                let target = tgt.join(format!("p{conc}-{i}")).to_string_lossy().into_owned();
                async move {
                    nd.node_publish_volume(csi::NodePublishVolumeRequest {
                        volume_id: format!("pvc-pub{conc}-{}", i % conc),
                        target_path: target,
                        volume_capability: Some(mount_cap()),
                        ..Default::default()
                    })
                    .await?;
                    Ok(())
                }
            })
            .await?;
            let (nd, tgt) = (node.clone(), dir.join("targets"));
            let unpublish = run_tasks(m, conc, move |i| {
                let mut nd = nd.clone();
                let target = tgt.join(format!("p{conc}-{i}")).to_string_lossy().into_owned();
                async move {
                    nd.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                        volume_id: format!("pvc-pub{conc}-{}", i % conc),
                        target_path: target,
                    })
                    .await?;
                    Ok(())
                }
            })
            .await?;
            rows.push(Row {
                rpc: "NodePublishVolume",
                baseline: "mkdir+bind",
                conc,
                rpc_stats: publish,
                base_stats: bind,
            });
            rows.push(Row {
                rpc: "NodeUnpublishVolume",
                baseline: "umount+rmdir",
                conc,
                rpc_stats: unpublish,
                base_stats: umount,
            });
        } else {
            println!("(not root: publish/unpublish and mount baselines skipped)");
        }
    }
    println!();
    print_rows(&rows);

    // The transport floor: an RPC that does no I/O at all.
    let mut floor = Vec::new();
    for conc in [1usize, 16] {
        let id = hpp_csi::csi::identity_client::IdentityClient::new(controller_channel.clone());
        let st = run_tasks(n, conc, move |_| {
            let mut id = id.clone();
            async move {
                id.get_plugin_info(csi::GetPluginInfoRequest {}).await?;
                Ok(())
            }
        })
        .await?;
        floor.push(format!(
            "conc {conc}: p50 {} p99 {} {:.0} ops/s",
            fmt_d(st.p50),
            fmt_d(st.p99),
            st.ops_per_sec
        ));
    }
    println!(
        "gRPC-over-unix-socket floor (GetPluginInfo, no I/O): {}",
        floor.join("; ")
    );

    // Resident memory after many volumes.
    let c = controller.clone();
    let total = args.rss_volumes;
    let fill = run_tasks(total, 16, move |i| {
        let mut c = c.clone();
        async move {
            c.create_volume(csi::CreateVolumeRequest {
                name: format!("pvc-rss-{i:05}"),
                volume_capabilities: vec![mount_cap()],
                ..Default::default()
            })
            .await?;
            Ok(())
        }
    })
    .await?;
    let rss_after_create = rss_kib(pid)?;
    let mut c = controller.clone();
    let mut token = String::new();
    let mut listed = 0;
    let list_start = Instant::now();
    loop {
        let r = c
            .list_volumes(csi::ListVolumesRequest {
                max_entries: 500,
                starting_token: token,
            })
            .await?
            .into_inner();
        listed += r.entries.len();
        if r.next_token.is_empty() {
            break;
        }
        token = r.next_token;
    }
    let list_time = list_start.elapsed();
    let rss_after_list = rss_kib(pid)?;
    println!();
    println!("created {total} volumes at {:.0} ops/s (conc 16)", fill.ops_per_sec);
    println!(
        "ListVolumes over {listed} volumes in pages of 500: {}",
        fmt_d(list_time)
    );
    println!(
        "driver RSS: {} KiB at start, {} KiB after {total} volumes, {} KiB after listing them all",
        rss_start, rss_after_create, rss_after_list
    );
    drop(child);
    unmount_leftovers(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Detaches any mount left under the run directory before deleting it.
fn unmount_leftovers(dir: &Path) {
    if let Ok(table) = hpp_csi::mountinfo::MountTable::read() {
        let canon = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        for m in table
            .mounts()
            .iter()
            .rev()
            .filter(|m| m.mount_point.starts_with(&canon))
        {
            let _ = rustix::mount::unmount(&m.mount_point, rustix::mount::UnmountFlags::DETACH);
        }
    }
}
