//! `cargo xtask link-order`: the functions the shipped executables run, for the linker to put
//! first (`images/link-order.txt`, lld's `--symbol-ordering-file`; see images/build.sh).
//!
//! Why: the kernel maps an executable's code around every page it runs (fault-around, 64 KiB
//! windows), so the few hundred KiB of functions a driver runs, scattered over a 5 MB `.text`,
//! leave almost all of it resident. Packed at the front they leave only themselves.
//!
//! How: the driver benchmark and the operator benchmark run each executable under valgrind's
//! callgrind, which records every function that runs (not a sample: start-up code that runs once
//! counts too). The list is ordered hottest first (callgrind's self cost, in instructions), so the
//! hot paths share pages and cache lines too. A name the linker does not find is skipped, so a list
//! made from an older tree only costs memory, never correctness.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context as _;

/// Where `images/build.sh` reads the list, from the workspace root.
const LIST: &str = "images/link-order.txt";
/// Callgrind writes a profile every this many basic blocks: the benchmarks kill their children,
/// and only what ran after the last dump is lost.
const DUMP_EVERY_BB: u64 = 2_000_000;

/// Options of `cargo xtask link-order`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The `hpp-csi-driver` to profile [default: `target/<host>/image/hpp-csi-driver`, as
    /// images/build.sh builds it].
    #[arg(long, value_name = "PATH")]
    driver_bin: Option<PathBuf>,
    /// The `hpp-operator` to profile [default: next to the driver].
    #[arg(long, value_name = "PATH")]
    operator_bin: Option<PathBuf>,
    /// Where to write the list [default: images/link-order.txt in the workspace].
    #[arg(long, value_name = "PATH")]
    out: Option<PathBuf>,
    /// Passed to the driver benchmark as `--dir` (its loop images).
    #[arg(long, default_value = "/var/tmp/hpp-bench")]
    dir: PathBuf,
}

/// Profiles both executables under their benchmarks and writes the list.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let valgrind = which("valgrind").context("valgrind is needed (apt-get install valgrind)")?;
    let out = args.out.clone().unwrap_or_else(|| crate::docs::repo_root().join(LIST));
    let driver = match &args.driver_bin {
        Some(path) => path.clone(),
        None => image_dir()?.join("hpp-csi-driver"),
    };
    let operator = match &args.operator_bin {
        Some(path) => path.clone(),
        None => driver.with_file_name("hpp-operator"),
    };
    let work = tempfile::tempdir()?;
    let profiles = work.path().join("profiles");
    std::fs::create_dir(&profiles)?;
    let driver_wrapper = callgrind_wrapper(&valgrind, work.path(), "driver", &driver, &profiles)?;
    let operator_wrapper = callgrind_wrapper(&valgrind, work.path(), "operator", &operator, &profiles)?;

    let xtask = std::env::current_exe()?;
    // Few operations: callgrind runs the code about 50 times slower, and a function that runs
    // once is recorded as surely as one that runs a million times.
    run_bench(
        Command::new(&xtask)
            .arg("bench")
            .arg("--dir")
            .arg(&args.dir)
            .args([
                "--ops",
                "20",
                "--mount-ops",
                "8",
                "--rss-volumes",
                "40",
                "--idle-wait",
                "11",
            ])
            .arg("--driver-bin")
            .arg(&driver_wrapper),
    )?;
    run_bench(
        Command::new(&xtask)
            .args(["bench", "--operator", "--operator-seconds", "20", "--operator-bin"])
            .arg(&operator_wrapper),
    )?;

    let mut costs = HashMap::new();
    for entry in std::fs::read_dir(&profiles)? {
        let path = entry?.path();
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        merge(&mut costs, parse_callgrind(&text));
    }
    anyhow::ensure!(!costs.is_empty(), "callgrind recorded no functions");
    let names = hottest_first(costs);
    std::fs::write(&out, render(&names)).with_context(|| format!("writing {}", out.display()))?;
    println!("{}: {} functions", out.display(), names.len());
    Ok(())
}

/// The absolute path of `program` on `PATH`: the operator benchmark starts its child with an
/// empty environment, so the wrapper cannot look it up itself.
fn which(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|path| path.is_file())
}

/// `target/<host>/image`, where images/build.sh puts the executables.
fn image_dir() -> anyhow::Result<PathBuf> {
    let out = Command::new("rustc").arg("-vV").output().context("running rustc -vV")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let host = text
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .context("rustc -vV printed no host")?;
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| crate::docs::repo_root().join("target"), PathBuf::from);
    Ok(target.join(host).join("image"))
}

/// A script that runs `bin` under callgrind with the arguments it is given, for the
/// benchmarks' `--driver-bin` / `--operator-bin`. `--show-below-main` names the C start-up
/// functions instead of callgrind's `(below main)`.
fn callgrind_wrapper(valgrind: &Path, dir: &Path, name: &str, bin: &Path, profiles: &Path) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let bin =
        std::fs::canonicalize(bin).with_context(|| format!("{} (build it with images/build.sh)", bin.display()))?;
    let script = format!(
        "#!/bin/sh\nexec {} --tool=callgrind --demangle=no --show-below-main=yes \
         --dump-every-bb={DUMP_EVERY_BB} --callgrind-out-file={} {} \"$@\"\n",
        sh_quote(valgrind),
        sh_quote(&profiles.join(format!("{name}.%p"))),
        sh_quote(&bin)
    );
    let path = dir.join(format!("{name}.sh"));
    std::fs::write(&path, script)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    Ok(path)
}

/// `path` as one single-quoted shell word.
fn sh_quote(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', "'\\''"))
}

fn run_bench(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd.status().context("running the benchmark")?;
    anyhow::ensure!(status.success(), "{cmd:?} failed with {status}");
    Ok(())
}

/// Self cost (the first event, instructions) of every function in one callgrind profile, by its
/// symbol name. Recursion levels (`name'2`) count as the function; what is not a symbol name
/// (unnamed code `0x…`, callgrind's own `(below main)`) is left out, the linker could not place
/// it.
pub fn parse_callgrind(text: &str) -> HashMap<String, u64> {
    let mut names: HashMap<&str, &str> = HashMap::new();
    let mut costs: HashMap<String, u64> = HashMap::new();
    let mut positions = 1;
    let mut current: Option<String> = None;
    let mut skip_next_cost = false;
    for line in text.lines() {
        if let Some(spec) = line.strip_prefix("positions:") {
            positions = spec.split_whitespace().count().max(1);
        } else if let Some(spec) = line.strip_prefix("fn=") {
            let name = resolve(&mut names, spec);
            current = name.map(|n| function_name(n).to_owned());
            if let Some(name) = &current {
                costs.entry(name.clone()).or_insert(0);
            }
        } else if let Some(spec) = line.strip_prefix("cfn=") {
            // Defines the id for later `fn=(id)` lines; the call's cost is not self cost.
            resolve(&mut names, spec);
        } else if line.starts_with("calls=") {
            skip_next_cost = true;
        } else if line.starts_with(|c: char| c.is_ascii_digit() || matches!(c, '+' | '-' | '*')) {
            if std::mem::take(&mut skip_next_cost) {
                continue;
            }
            let Some(name) = &current else { continue };
            let cost = line
                .split_whitespace()
                .nth(positions)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
            *costs.entry(name.clone()).or_insert(0) += cost;
        }
    }
    costs.retain(|name, _| is_symbol(name));
    costs
}

/// Whether callgrind's `name` is a symbol the linker knows: not empty, not an address, no
/// spaces or parentheses (mangled names have neither).
fn is_symbol(name: &str) -> bool {
    !name.is_empty() && !name.starts_with("0x") && !name.contains([' ', '(', ')'])
}

/// A name spec of callgrind's compressed format: `(id) name` defines id, `(id)` refers to it,
/// `name` is plain.
fn resolve<'a>(names: &mut HashMap<&'a str, &'a str>, spec: &'a str) -> Option<&'a str> {
    let spec = spec.trim();
    let Some(rest) = spec.strip_prefix('(') else {
        return Some(spec);
    };
    let (id, name) = rest.split_once(')')?;
    let name = name.trim();
    if name.is_empty() {
        names.get(id).copied()
    } else {
        names.insert(id, name);
        Some(name)
    }
}

/// `name'2` (a recursion level) is `name`.
fn function_name(name: &str) -> &str {
    match name.rsplit_once('\'') {
        Some((base, level)) if !level.is_empty() && level.bytes().all(|b| b.is_ascii_digit()) => base,
        _ => name,
    }
}

/// Adds one profile's costs into the total.
pub fn merge(total: &mut HashMap<String, u64>, profile: HashMap<String, u64>) {
    for (name, cost) in profile {
        *total.entry(name).or_insert(0) += cost;
    }
}

/// Names by cost, highest first; ties by name, so the same profile gives the same file.
pub fn hottest_first(costs: HashMap<String, u64>) -> Vec<String> {
    let mut ranked: Vec<(String, u64)> = costs.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    ranked.into_iter().map(|(name, _)| name).collect()
}

/// The file: a comment header (lld skips `#` lines), then a name per line.
pub fn render(names: &[String]) -> String {
    let mut out = String::from(
        "# The functions hpp-csi-driver and hpp-operator run, hottest first, for lld's\n\
         # --symbol-ordering-file (images/build.sh). Made by `cargo xtask link-order` from\n\
         # callgrind profiles of `cargo xtask bench`; remake it after large changes (a name the\n\
         # linker does not find is skipped: a stale list costs resident memory, not correctness).\n",
    );
    for name in names {
        out.push_str(name);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A compressed profile as callgrind writes it with `--dump-instr=no`.
    const PROFILE: &str = "\
version: 1
creator: callgrind-3.19.0
positions: line
events: Ir
summary: 1000

ob=(1) /usr/bin/hpp-csi-driver
fl=(1) ???
fn=(1) _ZN4main17h0123456789abcdefE
0 10
cfn=(2) _ZN3lib4work17hfedcba9876543210E
calls=3 0
0 500
0 5

fn=(2)
0 300
cfn=(3) _ZN3lib4work17hfedcba9876543210E'2
calls=1 0
0 40

fn=(3)
0 40

fn=(4) 0x00000000007e1190
0 99

fn=(5) (below main)
0 7
";

    #[test]
    fn self_cost_skips_call_costs_and_folds_recursion() {
        let costs = parse_callgrind(PROFILE);
        assert_eq!(costs.get("_ZN4main17h0123456789abcdefE"), Some(&15));
        assert_eq!(costs.get("_ZN3lib4work17hfedcba9876543210E"), Some(&340));
        assert_eq!(costs.len(), 2, "unnamed code is left out: {costs:?}");
    }

    #[test]
    fn a_second_position_column_is_not_taken_for_the_cost() {
        let text = "positions: instr line\nevents: Ir\nfn=(1) f\n0x10 3 7\n+2 * 8\n";
        assert_eq!(parse_callgrind(text).get("f"), Some(&15));
    }

    #[test]
    fn profiles_merge_and_rank_hottest_first_with_ties_by_name() {
        let mut total = parse_callgrind(PROFILE);
        merge(&mut total, parse_callgrind("fn=b\n0 15\nfn=a\n0 15\n"));
        let names = hottest_first(total);
        assert_eq!(
            names,
            [
                "_ZN3lib4work17hfedcba9876543210E",
                "_ZN4main17h0123456789abcdefE",
                "a",
                "b"
            ]
        );
        let file = render(&names);
        assert!(file.lines().take_while(|l| l.starts_with('#')).count() >= 1);
        assert_eq!(file.lines().filter(|l| !l.starts_with('#')).count(), 4);
    }

    #[test]
    fn a_path_with_a_quote_stays_one_shell_word() {
        assert_eq!(sh_quote(Path::new("/tmp/it's")), r"'/tmp/it'\''s'");
    }

    #[test]
    fn a_quote_that_is_not_a_recursion_level_stays() {
        assert_eq!(function_name("f'2"), "f");
        assert_eq!(function_name("f'x"), "f'x");
        assert_eq!(function_name("f'"), "f'");
    }
}
