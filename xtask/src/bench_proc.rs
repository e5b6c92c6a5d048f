//! Where a process's memory goes, from `/proc/PID/status`: resident set, its anonymous (heap,
//! stacks) and file-backed (the mapped binary and libraries) parts, and the thread count (each
//! idle tokio blocking thread holds a stack until its 10 s keep-alive ends).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;

/// The memory and thread figures of one `/proc/PID/status` read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcStatus {
    /// `VmRSS`, KiB.
    pub rss_kib: u64,
    /// `RssAnon`, KiB.
    pub anon_kib: u64,
    /// `RssFile`, KiB.
    pub file_kib: u64,
    /// `Threads`.
    pub threads: u64,
    /// `VmHWM`, KiB: the most it was resident so far.
    pub hwm_kib: u64,
}

impl ProcStatus {
    /// Reads the status of process `pid`.
    pub fn of(pid: u32) -> anyhow::Result<ProcStatus> {
        let path = format!("/proc/{pid}/status");
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        ProcStatus::parse(&text).with_context(|| format!("parsing {path}"))
    }

    /// Parses the text of a `/proc/PID/status` file.
    pub fn parse(text: &str) -> anyhow::Result<ProcStatus> {
        let field = |name: &str| -> anyhow::Result<u64> {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(|v| v.trim().trim_end_matches("kB").trim())
                .with_context(|| format!("no {name} line"))?
                .parse()
                .with_context(|| format!("{name} is not a number"))
        };
        Ok(ProcStatus {
            rss_kib: field("VmRSS")?,
            anon_kib: field("RssAnon")?,
            file_kib: field("RssFile")?,
            threads: field("Threads")?,
            hwm_kib: field("VmHWM")?,
        })
    }
}

/// CPU time (user + system) process `pid` has used so far, its exited threads included.
pub fn cpu_time(pid: u32) -> anyhow::Result<Duration> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let ticks = cpu_ticks(&text).with_context(|| format!("parsing {path}"))?;
    let per_second = rustix::param::clock_ticks_per_second().max(1);
    Ok(Duration::from_secs_f64(ticks as f64 / per_second as f64))
}

/// CPU time `pid` has run so far, all its threads (`/proc/<pid>/task/*/schedstat`, in
/// nanoseconds: finer than the 10 ms ticks of `stat`); zero when it cannot be read.
pub fn threads_cpu_time(pid: u32) -> Duration {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Duration::ZERO;
    };
    let ns: u64 = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Duration::from_nanos(ns)
}

/// `utime + stime` (fields 14 and 15, in clock ticks) of a `/proc/PID/stat` line. The command
/// name in field 2 may hold spaces and parentheses, so fields are counted after its last `)`.
fn cpu_ticks(stat: &str) -> anyhow::Result<u64> {
    let (_, rest) = stat.rsplit_once(')').context("no command name")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> anyhow::Result<u64> {
        // `rest` starts at field 3 (the state).
        let text = fields.get(n - 3).with_context(|| format!("no field {n}"))?;
        text.parse().with_context(|| format!("field {n} is not a number"))
    };
    Ok(field(14)? + field(15)?)
}

/// The machine's CPU time by kind, from the `cpu` line of `/proc/stat` (clock ticks).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MachineCpu {
    /// `user + nice`.
    pub user: u64,
    /// `system + irq + softirq`: kernel work, a loop device's flushes included.
    pub system: u64,
    /// `idle + iowait`: no runnable thread.
    pub idle: u64,
}

impl MachineCpu {
    /// Reads `/proc/stat` now.
    pub fn now() -> anyhow::Result<MachineCpu> {
        let text = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
        MachineCpu::parse(&text).context("parsing /proc/stat")
    }

    /// Parses the aggregate `cpu ` line of a `/proc/stat` text.
    pub fn parse(text: &str) -> anyhow::Result<MachineCpu> {
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("cpu "))
            .context("no cpu line")?;
        let values: Vec<u64> = line
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .context("a cpu field is not a number")?;
        let at = |i: usize| values.get(i).copied().unwrap_or(0);
        Ok(MachineCpu {
            user: at(0) + at(1),
            system: at(2) + at(5) + at(6),
            idle: at(3) + at(4),
        })
    }

    /// The time spent between `earlier` and `self`, by kind.
    pub fn since(self, earlier: MachineCpu) -> MachineCpu {
        MachineCpu {
            user: self.user.saturating_sub(earlier.user),
            system: self.system.saturating_sub(earlier.system),
            idle: self.idle.saturating_sub(earlier.idle),
        }
    }

    /// `user / system / idle` as percentages of the total.
    pub fn shares(self) -> String {
        let total = (self.user + self.system + self.idle).max(1) as f64;
        let pct = |v: u64| 100.0 * v as f64 / total;
        format!(
            "user {:.0}% / system {:.0}% / idle {:.0}%",
            pct(self.user),
            pct(self.system),
            pct(self.idle)
        )
    }
}

/// Peak resident memory of this process (`VmHWM`) in KiB, 0 when unreadable.
pub fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Resident pages of one kind of mapping, in KiB.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Resident KiB.
    pub rss: u64,
    /// Private dirty KiB (what the process itself wrote).
    pub private_dirty: u64,
    /// Number of mappings.
    pub mappings: usize,
}

/// One mapping of `/proc/PID/smaps`.
#[derive(Debug)]
struct Mapping {
    start: u64,
    end: u64,
    perms: String,
    path: String,
    rss: u64,
    private_dirty: u64,
}

fn parse_smaps(text: &str) -> Vec<Mapping> {
    let mut out: Vec<Mapping> = Vec::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let Some(first) = words.next() else { continue };
        if let Some((start, end)) = first.split_once('-')
            && let (Ok(start), Ok(end)) = (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16))
        {
            let perms = words.next().unwrap_or_default().to_owned();
            let path = words.nth(3).unwrap_or_default().to_owned();
            out.push(Mapping {
                start,
                end,
                perms,
                path,
                rss: 0,
                private_dirty: 0,
            });
            continue;
        }
        let value = || words.clone().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        if let Some(m) = out.last_mut() {
            match first {
                "Rss:" => m.rss = value(),
                "Private_Dirty:" => m.private_dirty = value(),
                _ => {}
            }
        }
    }
    out
}

/// glibc places each non-main malloc arena in a heap aligned to its maximum size (64 MiB).
const ARENA_ALIGN: u64 = 64 << 20;

/// Sorts each mapping into a bucket: the executable, shared libraries, `[heap]` (the main
/// malloc arena), other malloc arenas (anonymous, 64 MiB-aligned), thread stacks (anonymous,
/// right after a no-access guard page), `[stack]`, and other anonymous memory (large
/// allocations malloc serves with mmap, the runtime's own).
fn classify(maps: &[Mapping], exe: &Path) -> BTreeMap<&'static str, Usage> {
    let exe = exe.canonicalize().unwrap_or_else(|_| exe.to_path_buf());
    let exe = exe.to_string_lossy();
    let mut buckets: BTreeMap<&'static str, Usage> = BTreeMap::new();
    for (i, m) in maps.iter().enumerate() {
        let after_guard = i
            .checked_sub(1)
            .and_then(|p| maps.get(p))
            .is_some_and(|g| g.end == m.start && g.perms.starts_with("---") && g.path.is_empty());
        let bucket = if m.path == exe.as_ref() {
            "executable (text, data)"
        } else if m.path == "[heap]" {
            "[heap] (main arena)"
        } else if m.path == "[stack]" {
            "[stack] (main thread)"
        } else if m.path.starts_with('[') {
            "kernel ([vdso], [vvar], ...)"
        } else if !m.path.is_empty() {
            "shared libraries, files"
        } else if m.start % ARENA_ALIGN == 0 && m.perms.starts_with("rw") {
            "malloc arenas"
        } else if after_guard && m.perms.starts_with("rw") {
            "thread stacks"
        } else {
            "other anonymous"
        };
        let usage = buckets.entry(bucket).or_default();
        usage.rss += m.rss;
        usage.private_dirty += m.private_dirty;
        usage.mappings += 1;
    }
    buckets
}

/// Resident pages of process `pid` by kind of mapping (`exe`: its executable).
pub fn smaps_breakdown(pid: u32, exe: &Path) -> anyhow::Result<BTreeMap<&'static str, Usage>> {
    let text =
        std::fs::read_to_string(format!("/proc/{pid}/smaps")).with_context(|| format!("reading /proc/{pid}/smaps"))?;
    Ok(classify(&parse_smaps(&text), exe))
}

/// Prints where the resident pages of process `pid` (running executable `exe`) are.
pub fn print_smaps(pid: u32, exe: &Path) -> anyhow::Result<()> {
    println!("where the resident pages are (/proc/{pid}/smaps):");
    print_breakdown(&smaps_breakdown(pid, exe)?);
    Ok(())
}

/// Prints a [`smaps_breakdown`], one kind of mapping per line.
pub fn print_breakdown(breakdown: &BTreeMap<&'static str, Usage>) {
    for (bucket, usage) in breakdown {
        println!(
            "  {bucket:<28} Rss {:>10}  Private_Dirty {:>10}  ({} mappings)",
            mib(usage.rss),
            mib(usage.private_dirty),
            usage.mappings
        );
    }
}

/// KiB as MiB with two decimals.
pub fn mib(kib: u64) -> String {
    format!("{:.2} MiB", kib as f64 / 1024.0)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn cpu_ticks_add_user_and_system_time_past_a_command_name_with_spaces_and_parentheses() {
        let stat = "4242 (tokio (rt) x) S 1 4242 4242 0 -1 4194560 1207 0 0 0 250 37 0 0 20 0 3 0 9 1 2";
        assert_eq!(cpu_ticks(stat).unwrap(), 287);
        assert!(cpu_ticks("4242 (short) S 1 2").is_err());
        assert!(cpu_ticks("no name here").is_err());
        assert!(cpu_time(std::process::id()).is_ok());
    }

    #[test]
    fn status_gives_rss_its_anonymous_and_file_parts_and_threads() {
        let text = "Name:\txtask\nVmHWM:\t   20000 kB\nVmRSS:\t   12000 kB\nRssAnon:\t    5000 kB\n\
                    RssFile:\t    6900 kB\nRssShmem:\t     100 kB\nThreads:\t4\n";
        assert_eq!(
            ProcStatus::parse(text).unwrap(),
            ProcStatus {
                rss_kib: 12000,
                anon_kib: 5000,
                file_kib: 6900,
                threads: 4,
                hwm_kib: 20000,
            }
        );
        let err = ProcStatus::parse("VmRSS:\t1 kB\n").unwrap_err();
        assert!(err.to_string().contains("RssAnon"), "{err}");
    }

    #[test]
    fn machine_cpu_groups_the_stat_line_into_user_system_and_idle() {
        let text = "cpu  100 5 40 800 20 3 2 0 0 0\ncpu0 50 2 20 400 10 1 1 0 0 0\nintr 1\n";
        let earlier = MachineCpu::parse(text).unwrap();
        assert_eq!(
            earlier,
            MachineCpu {
                user: 105,
                system: 45,
                idle: 820
            }
        );
        let later = MachineCpu {
            user: 205,
            system: 95,
            idle: 870,
        };
        assert_eq!(later.since(earlier).shares(), "user 50% / system 25% / idle 25%");
        assert!(MachineCpu::parse("intr 1\n").is_err());
    }

    #[test]
    fn this_process_has_a_status() {
        let me = ProcStatus::of(std::process::id()).unwrap();
        assert!(me.rss_kib > 0 && me.threads >= 1);
    }

    #[test]
    fn smaps_sorts_heap_arenas_stacks_and_the_executable() {
        let smaps = "\
55d000000000-55d000100000 r-xp 00000000 08:01 42 /usr/bin/hpp-operator
Rss:                 800 kB
Private_Dirty:         0 kB
55d000200000-55d000300000 rw-p 00000000 00:00 0 [heap]
Rss:                 300 kB
Private_Dirty:       300 kB
7f0004000000-7f0004100000 rw-p 00000000 00:00 0
Rss:                 200 kB
Private_Dirty:       200 kB
7f0004100000-7f0008000000 ---p 00000000 00:00 0
Rss:                   0 kB
Private_Dirty:         0 kB
7f1000000000-7f1000001000 ---p 00000000 00:00 0
Rss:                   0 kB
Private_Dirty:         0 kB
7f1000001000-7f1000201000 rw-p 00000000 00:00 0
Rss:                  16 kB
Private_Dirty:        16 kB
7f2000000000-7f2000010000 r--p 00000000 08:01 7 /usr/lib/libc.so.6
Rss:                  64 kB
Private_Dirty:         0 kB
";
        let b = classify(&parse_smaps(smaps), Path::new("/usr/bin/hpp-operator"));
        assert_eq!(b["executable (text, data)"].rss, 800);
        assert_eq!(b["[heap] (main arena)"].private_dirty, 300);
        assert_eq!(b["malloc arenas"].rss, 200);
        assert_eq!(b["thread stacks"].rss, 16);
        assert_eq!(b["shared libraries, files"].rss, 64);
        assert_eq!(b["other anonymous"].mappings, 2, "the two guard regions");
    }
}
