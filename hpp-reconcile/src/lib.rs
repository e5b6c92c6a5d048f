//! A controller-runtime-style framework for operators built from pluggable sub-reconcilers,
//! and the hpp operator (the KubeVirt-compatible HPP distribution) built with it.
//!
//! # The framework
//!
//! - [`SubReconciler`]: one step of an operator. It names the [`Kind`]s it owns, may
//!   [`gather`](SubReconciler::gather) facts of its own into [`ClusterFacts::extensions`]
//!   ([`FactMap`]), builds its [`DesiredObject`]s with a pure function (typed k8s-openapi
//!   structs via [`DesiredObject::typed`], JSON only for kinds without types), and reports
//!   [`Readiness`], including [`StepCondition`]s that land in the CR's status.
//! - [`Decorate`] ([`Pipeline::decorate`], [`SubReconcilerExt::decorate`]): wrap a step to edit
//!   what it builds, keeping everything else it does.
//! - [`SubReconciler::act`]: a step's changes to objects it does not own (decided purely, then
//!   done), and [`WatchIndex`] ([`SubReconciler::indexes`]): an index a step keeps over watched
//!   objects, fed per watch event, so a pass stays O(changes) on large clusters.
//! - [`SubReconciler::parts`] and [`SubReconciler::readiness_of_parts`]: a step whose objects
//!   grow with the cluster (one set per node) renders in parts, and a change to one part's
//!   objects costs a pass over that part (the controller records what its watches saw change).
//! - [`Pipeline`]: the ordered steps of a distribution; applies them, sweeps labelled leftovers,
//!   cleans up in reverse order on deletion. Its edits name steps by the [`names`] `STEP_*`
//!   constants and fail with a [`PipelineError`] on a missing step or a second step of a name.
//! - [`DesiredObject::edit`]: change a desired object as its k8s-openapi type.
//! - [`permissions`]: the RBAC an operator needs, derived from its pipeline
//!   ([`SubReconciler::permissions`] declares a step's own) and rendered by [`OperatorRules`].
//! - [`Error::other`]: an embedder's own failure, reported on the CR and retried like any other.
//! - [`Applier`]: the only writer (server-side apply per step field manager, skipped when the
//!   live object already matches); reads go through the controller's watch [`Cache`].
//! - [`controller`]: watches every kind [`Pipeline::kinds`] returns, so a plugged-in step's
//!   objects get drift repair exactly like the built-in ones; [`operator`] runs one reconcile
//!   (finalizer, pass, status, Events) and decides retries from error variants.
//! - Feature `testkit`: an in-process fake API server behind a real `kube::Client`.
//!
//! A new step is a type implementing [`SubReconciler`] (`name`, `kinds`, `desired`; the rest
//! has defaults) added with [`Pipeline::with`]; see `examples/custom_sub_reconciler.rs`.
//!
//! # The HPP distribution
//!
//! [`Pipeline::standard`] lists the HPP steps in [`reconcilers`] (ServiceAccounts, RBAC,
//! CSIDriver, SCC, CSI DaemonSet, legacy DaemonSet, storage pools, Prometheus, the report-only
//! checks, node loss) with the names in
//! [`names`], configured by [`OperatorConfig`]; [`status`] derives KubeVirt's conditions and
//! [`render`] prints every object offline. [`adopt`] (`hpp-operator adopt`) turns volumes of
//! other hostPath provisioners into volumes of hpp's CSI driver in place.

pub mod adopt;
pub mod apply;
pub mod controller;
pub mod events;
pub mod leader;
pub mod operator;

mod cache;
mod changes;
mod compact_store;
mod echo;
mod error;
mod gather;
pub mod index;
mod pipeline;
mod subreconciler;

pub mod config;
pub mod facts;
pub mod metrics;
pub mod names;
pub mod object;
pub mod permissions;
pub mod reconcilers;
pub mod render;
pub mod status;
pub mod status_write;

pub use apply::Applier;
pub use cache::{Cache, Changes, CompactStore, DISCOVERY_REFRESH, Fold, OptionalApis, Unparsed};
pub use config::OperatorConfig;
pub use error::{BoxError, Error, Result};
pub use facts::{ClusterFacts, FactList, FactMap};
pub use gather::fact_sources;
pub use index::WatchIndex;
pub use object::{ApplyStrategy, DesiredObject, Kind, StaticScope};
pub use permissions::{OperatorRules, Permission};
pub use pipeline::{PassReport, Pipeline, PipelineError};
pub use subreconciler::{
    Decorate, Edit, ObjectEvent, ObjectWarning, Readiness, StepCondition, SubReconciler, SubReconcilerExt,
    VolumeAuditReport,
};

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
