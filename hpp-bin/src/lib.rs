//! Shared start-up code for the hpp executables (`hpp-operator`, `hpp-csi-driver`,
//! `hpp-provisioner`): logging, telemetry, the metrics/health server and signal handling.

pub mod admin;
pub mod csi_driver;
pub mod metrics_tls;
pub mod operator;
pub mod provisioner;
pub mod telemetry;
pub mod webhook_cmd;
