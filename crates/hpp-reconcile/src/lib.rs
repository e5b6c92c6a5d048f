//! The hpp operator as a library.
//!
//! One sub-reconciler per owned object kind builds its desired objects with a pure function,
//! applies them with server-side apply and reports readiness; a pipeline runs an ordered list of
//! them inside the `finalizer.delete.hostpath-provisioner` finalizer, sweeps labelled leftovers and
//! derives the `HostPathProvisioner` status conditions. Embedders add, remove or replace
//! sub-reconcilers to build their own distribution.
