//! Latency statistics, the concurrent runners and the plain-text tables `cargo xtask bench`
//! prints: the pieces every measurement shares.

use std::sync::Arc;
use std::time::{Duration, Instant};

/// p50, p99 and throughput of one measurement.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stats {
    /// Median latency.
    pub p50: Duration,
    /// 99th percentile latency.
    pub p99: Duration,
    /// Completed operations per second of wall time (all workers together).
    pub ops_per_sec: f64,
}

/// The statistics of `lat` (one entry per operation) completed in `wall`.
pub fn stats(mut lat: Vec<Duration>, wall: Duration) -> Stats {
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

/// The middle of `values` (the upper of the two middle ones for an even count); zero for none.
pub fn median(mut values: Vec<Duration>) -> Duration {
    values.sort_unstable();
    values.get(values.len() / 2).copied().unwrap_or_default()
}

/// A duration the way the tables show it: µs below a millisecond, ms above.
pub fn fmt_d(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us >= 1000.0 {
        format!("{:.2}ms", us / 1000.0)
    } else {
        format!("{us:.1}µs")
    }
}

/// `num / den` as `1.23x`, or `-` when there is nothing to divide by.
pub fn ratio(num: f64, den: f64) -> String {
    if den > 0.0 && num.is_finite() && den.is_finite() {
        format!("{:.2}x", num / den)
    } else {
        "-".to_owned()
    }
}

/// `ratio` of two durations.
pub fn ratio_d(num: Duration, den: Duration) -> String {
    ratio(num.as_secs_f64(), den.as_secs_f64())
}

/// `total` shared out over `n` calls (at least one).
pub fn per_call(total: Duration, n: usize) -> Duration {
    total / u32::try_from(n.max(1)).unwrap_or(u32::MAX)
}

/// The difference `a - b` in µs with its sign (`+12.3µs`, `-0.4µs`).
pub fn delta_us(a: Duration, b: Duration) -> String {
    format!("{:+.1}µs", (a.as_secs_f64() - b.as_secs_f64()) * 1e6)
}

/// Runs `op(i)` for i in 0..n on `conc` OS threads; returns the statistics.
pub fn run_threads(
    n: usize,
    conc: usize,
    op: impl Fn(usize) -> anyhow::Result<()> + Send + Sync + 'static,
) -> anyhow::Result<Stats> {
    Ok(run_threads_sample(n, conc, op)?.stats())
}

/// Runs `op(i)` for i in 0..n on `conc` OS threads; returns the latencies.
pub fn run_threads_sample(
    n: usize,
    conc: usize,
    op: impl Fn(usize) -> anyhow::Result<()> + Send + Sync + 'static,
) -> anyhow::Result<Sample> {
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
    Ok(Sample {
        lat: all,
        wall: start.elapsed(),
    })
}

/// Latencies of a series of operations and the wall time they took; series taken in turns
/// (see [`Sample::extend`]) add up to one measurement.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    lat: Vec<Duration>,
    wall: Duration,
}

impl Sample {
    /// Adds another series of the same measurement.
    pub fn extend(&mut self, other: Sample) {
        self.lat.extend(other.lat);
        self.wall += other.wall;
    }

    /// The statistics of every series added.
    pub fn stats(self) -> Stats {
        stats(self.lat, self.wall)
    }
}

/// Runs the async `op(i)` for i in 0..n on `conc` tasks; returns the statistics.
pub async fn run_tasks<F, Fut>(n: usize, conc: usize, op: F) -> anyhow::Result<Stats>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    Ok(run_tasks_sample(n, conc, op).await?.stats())
}

/// Runs the async `op(i)` for i in 0..n on `conc` tasks; returns the latencies.
pub async fn run_tasks_sample<F, Fut>(n: usize, conc: usize, op: F) -> anyhow::Result<Sample>
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
    Ok(Sample {
        lat: all,
        wall: start.elapsed(),
    })
}

/// A plain-text table: the first column left-aligned, the others right-aligned, every column
/// as wide as its widest cell. A header cell of `|` makes a separator column.
#[derive(Debug, Clone, Default)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column titles.
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row; missing cells are blank, extra cells are dropped.
    pub fn row(&mut self, cells: Vec<String>) {
        let mut cells = cells;
        cells.resize(self.header.len(), String::new());
        self.rows.push(cells);
    }

    /// The table as lines of text (no trailing newline).
    pub fn render(&self) -> String {
        let width = |c: usize| {
            std::iter::once(&self.header)
                .chain(&self.rows)
                .map(|r| r[c].chars().count())
                .max()
                .unwrap_or(0)
        };
        let widths: Vec<usize> = (0..self.header.len()).map(width).collect();
        let line = |cells: &Vec<String>| {
            let parts: Vec<String> = cells
                .iter()
                .zip(&widths)
                .enumerate()
                .map(|(c, (cell, w))| {
                    if c == 0 {
                        format!("{cell:<w$}")
                    } else {
                        format!("{cell:>w$}")
                    }
                })
                .collect();
            parts.join("  ").trim_end().to_owned()
        };
        std::iter::once(&self.header)
            .chain(&self.rows)
            .map(line)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The `p50 p99 ops/s` cells of a measurement.
pub fn cells(s: &Stats) -> [String; 3] {
    [fmt_d(s.p50), fmt_d(s.p99), format!("{:.0}", s.ops_per_sec)]
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn percentiles_pick_the_nearest_rank_and_rate_counts_every_op() {
        let lat: Vec<Duration> = (1..=100).rev().map(Duration::from_micros).collect();
        let s = stats(lat, Duration::from_secs(2));
        assert_eq!(s.p50, Duration::from_micros(51));
        assert_eq!(s.p99, Duration::from_micros(99));
        assert_eq!(s.ops_per_sec, 50.0);
        assert_eq!(stats(Vec::new(), Duration::ZERO).p50, Duration::ZERO);
    }

    #[test]
    fn samples_taken_in_turns_add_up_to_one_measurement() {
        let mut all = Sample::default();
        for part in [[1u64, 2], [3, 4]] {
            all.extend(Sample {
                lat: part.iter().map(|&us| Duration::from_micros(us)).collect(),
                wall: Duration::from_secs(1),
            });
        }
        let s = all.stats();
        assert_eq!(s.ops_per_sec, 2.0);
        assert_eq!(s.p99, Duration::from_micros(4));
    }

    #[test]
    fn durations_ratios_and_deltas_print_in_the_units_of_the_note() {
        assert_eq!(fmt_d(Duration::from_nanos(12_345)), "12.3µs");
        assert_eq!(fmt_d(Duration::from_micros(1_500)), "1.50ms");
        assert_eq!(ratio_d(Duration::from_micros(30), Duration::from_micros(20)), "1.50x");
        assert_eq!(ratio_d(Duration::from_micros(30), Duration::ZERO), "-");
        assert_eq!(ratio(1.0, f64::NAN), "-");
        assert_eq!(
            delta_us(Duration::from_micros(30), Duration::from_micros(20)),
            "+10.0µs"
        );
        assert_eq!(
            delta_us(Duration::from_micros(20), Duration::from_micros(30)),
            "-10.0µs"
        );
    }

    #[test]
    fn tables_align_columns_to_their_widest_cell() {
        let mut t = Table::new(&["name", "p50"]);
        t.row(vec!["mkdir+fsync(parent)".into(), "1.0µs".into()]);
        t.row(vec!["x".into(), "12.50ms".into(), "dropped".into()]);
        t.row(vec!["short".into()]);
        assert_eq!(
            t.render(),
            "name                     p50\n\
             mkdir+fsync(parent)    1.0µs\n\
             x                    12.50ms\n\
             short"
        );
    }
}
