//! Developer tasks of the hpp workspace, run as `cargo xtask <task>` (an alias in
//! `.cargo/config.toml`). Not shipped: nothing here is part of the product's crates.
//!
//! - `cargo xtask bench`: the CSI driver against the bare system calls it wraps ([`mod@bench`]);
//!   with `--quota-backends`, each quota backend against plain directories ([`mod@bench_quota`]);
//!   with `--operator`, the operator's steady resident memory ([`mod@bench_operator`]);
//! - `cargo xtask docs [--check]`: the generated blocks of docs/reference.md ([`mod@docs`]).

pub mod bench;
pub mod bench_operator;
pub mod bench_quota;
pub mod docs;
