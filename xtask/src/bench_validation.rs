//! `cargo xtask bench --validation`: what the webhook's CR validation costs on the largest
//! spec the schema admits and on floods of identical pools (`hpp_api::validation::worst_case`).

use std::time::{Duration, Instant};

use crate::bench_proc::peak_rss_kib;
use crate::bench_stats::{fmt_d, median};

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
    (median(times), last)
}

/// `--validation`: validation time of the largest admitted CR and of adversarial floods.
pub fn run() {
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
