//! `cargo xtask bench --volume-scale 10000,100000`: the driver with a pool already holding N
//! volumes, for each N, on the same fresh filesystem: start-up until it answers Probe, the
//! first GetCapacity, ListVolumes over every page (pages of 500, as the csi-provisioner's
//! capacity code and the health monitor walk them), resident memory, and CreateVolume and
//! DeleteVolume throughput at c=16 next to the N volumes. Each figure is printed with its
//! growth from the first size to the last: what a node with ten times the volumes costs.
//! As root, the kernel's caches are dropped before the driver starts, so start-up, the first
//! GetCapacity and the first walk read the pool from the disk, as after a node's reboot.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hpp_csi::csi::{self, controller_client::ControllerClient, identity_client::IdentityClient};

use crate::bench::{Args, create_request};
use crate::bench_proc::{ProcStatus, threads_cpu_time};
use crate::bench_serve::{Kind, Server, driver_pools};
use crate::bench_stats::{Stats, Table, fmt_d, median, ratio, ratio_d};

/// Walks of every ListVolumes page at each size; the median is reported.
const LIST_WALKS: usize = 5;

/// What was measured at one size.
#[derive(Debug, Clone)]
struct AtSize {
    volumes: usize,
    ready: Duration,
    first_capacity: Duration,
    list_all: Duration,
    /// The first walk, right after start-up (from the disk when the caches were dropped).
    first_walk: Duration,
    /// The driver's own CPU over the listing (the client's decoding is in `list_all`).
    list_cpu: Duration,
    /// The median walk asking for every volume at once (`max_entries` 0, as the health
    /// monitor does), its driver CPU and how many pages the driver answered with.
    list_unbounded: Duration,
    list_unbounded_cpu: Duration,
    unbounded_pages: usize,
    listed: usize,
    rss_after_start: u64,
    rss_after_list: u64,
    /// `VmHWM` after the listing: the peak, start-up included.
    hwm_after_list: u64,
    /// Whether the kernel's caches were dropped before the driver started (root only).
    cold: bool,
    create: Stats,
    delete: Stats,
}

/// Makes `n` volume directories in the pool of the driver on `dir` (as a pool holding volumes
/// made earlier looks to a starting driver), outside the measurement. Then drops the kernel's
/// page, dentry and inode caches if it may (root), as a node's reboot leaves them; says
/// whether it did.
fn populate(dir: &Path, n: usize) -> anyhow::Result<bool> {
    let pool = &driver_pools(dir)[0].path;
    std::fs::create_dir_all(pool)?;
    for i in 0..n {
        std::fs::create_dir(pool.join(format!("pvc-scale-{i:07}")))?;
    }
    rustix::fs::sync();
    Ok(std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok())
}

/// Runs the measurement for every size in `sizes` under `dir` and prints the table.
pub async fn run(dir: &Path, sizes: &[usize], args: &Args) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for &n in sizes {
        let d = dir.join(format!("scale-{n}"));
        let cold = populate(&d, n).with_context(|| format!("making {n} volumes"))?;
        rows.push(at_size(&d, n, cold, args).await?);
        let _ = std::fs::remove_dir_all(&d);
    }
    print(&rows);
    Ok(())
}

async fn at_size(dir: &Path, n: usize, cold: bool, args: &Args) -> anyhow::Result<AtSize> {
    let started = Instant::now();
    let driver = match args.driver_bin() {
        Some(bin) => Server::spawn_driver_bin(bin, dir).await?,
        None => Server::spawn(Kind::Driver, dir).await?,
    };
    let mut identity = IdentityClient::new(driver.channel.clone());
    loop {
        let ready = identity.probe(csi::ProbeRequest {}).await?.into_inner().ready;
        if ready != Some(false) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let ready = started.elapsed();
    let rss_after_start = ProcStatus::of(driver.pid())?.rss_kib;
    let mut controller = ControllerClient::new(driver.channel.clone());
    let t = Instant::now();
    controller.get_capacity(csi::GetCapacityRequest::default()).await?;
    let first_capacity = t.elapsed();
    // The median of a few walks: one walk of 10,000 volumes takes a few ms of the driver's
    // CPU, where a scheduler hiccup moves the growth ratio by a tenth. Each walk lists the
    // pools afresh (the driver lets its view go after the last page).
    let (mut walls, mut cpus, mut listed) = (Vec::new(), Vec::new(), 0);
    for _ in 0..LIST_WALKS {
        let cpu_before = threads_cpu_time(driver.pid());
        let (n, wall) = crate::bench::list_all(&driver.channel).await?;
        cpus.push(threads_cpu_time(driver.pid()).saturating_sub(cpu_before));
        walls.push(wall);
        listed = n;
    }
    let first_walk = walls.first().copied().unwrap_or_default();
    let (list_all, list_cpu) = (median(walls), median(cpus));
    anyhow::ensure!(listed == n, "ListVolumes listed {listed} of {n} volumes");
    // The health monitor's walk: every volume at once, in as few pages as fit a gRPC client.
    let (mut walls, mut cpus, mut unbounded_pages) = (Vec::new(), Vec::new(), 0);
    for _ in 0..LIST_WALKS {
        let cpu_before = threads_cpu_time(driver.pid());
        let walk = crate::bench::list_in_pages_of(&driver.channel, 0).await?;
        cpus.push(threads_cpu_time(driver.pid()).saturating_sub(cpu_before));
        walls.push(walk.wall);
        anyhow::ensure!(walk.listed == n, "ListVolumes listed {} of {n} volumes", walk.listed);
        unbounded_pages = walk.pages;
    }
    let (list_unbounded, list_unbounded_cpu) = (median(walls), median(cpus));
    // The driver hands a walk's memory back just after its last page is sent.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after_list = ProcStatus::of(driver.pid())?;
    let ops = args.ops();
    let create = crate::bench::each("CreateVolume", ops, 16, controller.clone(), |mut c, i| async move {
        c.create_volume(create_request(format!("pvc-scale-new-{i:06}")))
            .await
            .map(drop)
    })
    .await?;
    let delete = crate::bench::each("DeleteVolume", ops, 16, controller, |mut c, i| async move {
        c.delete_volume(csi::DeleteVolumeRequest {
            volume_id: format!("pvc-scale-new-{i:06}"),
            ..Default::default()
        })
        .await
        .map(drop)
    })
    .await?;
    Ok(AtSize {
        volumes: n,
        ready,
        first_capacity,
        list_all,
        first_walk,
        list_cpu,
        list_unbounded,
        list_unbounded_cpu,
        unbounded_pages,
        listed,
        rss_after_start,
        rss_after_list: after_list.rss_kib,
        hwm_after_list: after_list.hwm_kib,
        cold,
        create,
        delete,
    })
}

/// A row of the table: its name and how it is read from one size's figures.
type Measure<T> = (&'static str, fn(&AtSize) -> T);

fn print(rows: &[AtSize]) {
    let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
        return;
    };
    println!();
    println!(
        "The driver next to N volumes in one pool; growth = the last size over the first ({} over {} volumes)",
        last.volumes, first.volumes
    );
    let mut header: Vec<String> = vec!["measure".to_owned()];
    header.extend(rows.iter().map(|r| format!("{} volumes", r.volumes)));
    header.push("growth".to_owned());
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut t = Table::new(&header);
    let durations: [Measure<Duration>; 9] = [
        ("start-up until Probe answers", |r| r.ready),
        ("first GetCapacity", |r| r.first_capacity),
        ("ListVolumes, every page of 500, first walk", |r| r.first_walk),
        ("ListVolumes, every page of 500 (median walk)", |r| r.list_all),
        ("  of which the driver's CPU", |r| r.list_cpu),
        ("ListVolumes, max_entries 0 (median walk)", |r| r.list_unbounded),
        ("  of which the driver's CPU", |r| r.list_unbounded_cpu),
        ("CreateVolume p50, c=16", |r| r.create.p50),
        ("DeleteVolume p50, c=16", |r| r.delete.p50),
    ];
    for (name, get) in durations {
        let mut row = vec![name.to_owned()];
        row.extend(rows.iter().map(|r| fmt_d(get(r))));
        row.push(ratio_d(get(last), get(first)));
        t.row(row);
    }
    let rates: [Measure<f64>; 2] = [
        ("CreateVolume ops/s, c=16", |r| r.create.ops_per_sec),
        ("DeleteVolume ops/s, c=16", |r| r.delete.ops_per_sec),
    ];
    for (name, get) in rates {
        let mut row = vec![name.to_owned()];
        row.extend(rows.iter().map(|r| format!("{:.0}", get(r))));
        row.push(ratio(get(last), get(first)));
        t.row(row);
    }
    let memory: [Measure<u64>; 3] = [
        ("VmRSS after start", |r| r.rss_after_start),
        ("VmRSS 1 s after listing all", |r| r.rss_after_list),
        ("VmHWM after listing all", |r| r.hwm_after_list),
    ];
    for (name, get) in memory {
        let mut row = vec![name.to_owned()];
        row.extend(rows.iter().map(|r| format!("{} KiB", get(r))));
        row.push(ratio(get(last) as f64, get(first) as f64));
        t.row(row);
    }
    println!("{}", t.render());
    for r in rows {
        println!(
            "  {} volumes: {} listed; max_entries 0 answered in {} page(s) under the 4 MiB gRPC limit; {}",
            r.volumes,
            r.listed,
            r.unbounded_pages,
            match r.cold {
                true => "caches dropped before start-up (start-up, first GetCapacity and first walk from the disk)",
                false => "caches warm (not root: /proc/sys/vm/drop_caches not writable)",
            }
        );
    }
}
