//! The hpp operator as a library.
//!
//! One sub-reconciler per owned object kind builds its desired objects with a pure function,
//! applies them with server-side apply and reports readiness; a pipeline runs an ordered list of
//! them inside the `finalizer.delete.hostpath-provisioner` finalizer, sweeps labelled leftovers and
//! derives the `HostPathProvisioner` status conditions. Embedders add, remove or replace
//! sub-reconcilers to build their own distribution.

pub mod apply;
pub mod cache;
pub mod config;
pub mod controller;
pub mod error;
pub mod events;
pub mod facts;
pub mod gather;
pub mod leader;
pub mod metrics;
pub mod names;
pub mod object;
pub mod operator;
pub mod pipeline;
pub mod reconcilers;
pub mod render;
pub mod status;
pub mod subreconciler;

pub use apply::Applier;
pub use config::OperatorConfig;
pub use error::{Error, Result};
pub use facts::{ClusterFacts, FactMap};
pub use object::{ApplyStrategy, DesiredObject, Kind};
pub use pipeline::Pipeline;
pub use subreconciler::{Decorate, Readiness, StepCondition, SubReconciler, SubReconcilerExt};

/// The crates a custom sub-reconciler needs, re-exported so an embedder depends on one crate
/// and always gets the versions this library was built with.
pub mod deps {
    pub use async_trait::async_trait;
    pub use k8s_openapi;
    pub use kube;
    pub use serde_json;
}

/// The fake API server of the `hpp-testkit` crate (feature `testkit`); new code can depend on
/// `hpp-testkit` directly.
#[cfg(feature = "testkit")]
pub use hpp_testkit as testkit;
