//! API types for hpp: the `HostPathProvisioner` custom resource in its two versions, its
//! validation rules, lossless conversion between the versions, the generated CRD, and the names
//! every hpp component shares (driver name, topology key, StorageClass parameters, labels).
//!
//! ```
//! use hpp_api::v1beta1::{HostPathProvisioner, HostPathProvisionerSpec, StoragePool};
//! use hpp_api::validation::ValidateCreate;
//!
//! let hpp = HostPathProvisioner::new("hostpath-provisioner", HostPathProvisionerSpec {
//!     storage_pools: Some(vec![StoragePool {
//!         name: "local".into(),
//!         path: "/var/hpvolumes".into(),
//!         ..Default::default()
//!     }]),
//!     ..Default::default()
//! });
//! assert!(hpp.validate_create().is_ok());
//! ```

pub mod condition;
pub mod constants;
pub mod conversion;
pub mod crd;
pub mod duration;
pub mod inventory;
pub mod names;
pub mod quantity;
pub mod quota;
pub mod v1alpha1;
pub mod v1beta1;
pub mod validation;

pub use v1beta1::{HostPathProvisioner, HostPathProvisionerSpec, HostPathProvisionerStatus, StoragePool};
