//! The non-CSI hostPath provisioner.
//!
//! Watches PersistentVolumeClaims for its provisioner name and answers them with hostPath
//! PersistentVolumes: node-local (KubeVirt legacy, single-node DIY) or on a shared filesystem
//! mounted at the same path on every node. Decisions are pure functions ([`decision`],
//! [`template`], [`pv`], [`mount_guard`]); I/O lives in [`fsops`] and [`provisioner`].

pub mod config;
pub mod controller;
pub mod decision;
mod error;
pub mod fsops;
pub mod metrics;
pub mod mount_guard;
pub mod params;
pub mod provisioner;
pub mod pv;
pub mod quantity;
pub mod selinux;
pub mod template;

pub use config::{Mode, ProvisionerConfig, ReclaimOverride};
pub use error::{Error, Result};
