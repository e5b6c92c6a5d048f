//! Where a process's memory goes, from `/proc/PID/status`: resident set, its anonymous (heap,
//! stacks) and file-backed (the mapped binary and libraries) parts, and the thread count (each
//! idle tokio blocking thread holds a stack until its 10 s keep-alive ends).

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
        })
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

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
                threads: 4
            }
        );
        let err = ProcStatus::parse("VmRSS:\t1 kB\n").unwrap_err();
        assert!(err.to_string().contains("RssAnon"), "{err}");
    }

    #[test]
    fn this_process_has_a_status() {
        let me = ProcStatus::of(std::process::id()).unwrap();
        assert!(me.rss_kib > 0 && me.threads >= 1);
    }
}
