//! Developer tasks of the hpp workspace, run as `cargo xtask <task>` (an alias in
//! `.cargo/config.toml`). Not shipped: nothing here is part of the product's crates.
//!
//! - `cargo xtask bench`: the CSI driver's per-call overhead and durability cost against the
//!   bare system calls and a bare tonic server, on fresh loop-mounted filesystems
//!   ([`mod@bench`]); with `--quota-backends`, each quota backend against plain directories
//!   ([`mod@bench_quota`]); with `--validation`, the webhook's CR validation
//!   ([`mod@bench_validation`]); with `--go-driver-bin`, side by side with KubeVirt's Go driver
//!   ([`mod@bench_go`]); with `--operator`, the operator's steady resident memory
//!   ([`mod@bench_operator`]);
//! - `cargo xtask docs [--check]`: the generated blocks of docs/reference.md ([`mod@docs`]);
//! - `cargo xtask link-order`: the functions the shipped executables run, which images/build.sh
//!   has the linker put first ([`mod@link_order`]).

pub mod bench;
pub mod bench_floors;
pub mod bench_go;
pub mod bench_layer;
pub mod bench_legacy;
pub mod bench_operator;
pub mod bench_proc;
pub mod bench_quota;
pub mod bench_scale;
pub mod bench_serve;
pub mod bench_stats;
pub mod bench_validation;
pub mod docs;
pub mod link_order;
pub mod loopfs;
