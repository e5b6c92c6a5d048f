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
#[cfg(feature = "crd")]
pub mod conversion;
#[cfg(feature = "crd")]
pub mod crd;
pub mod duration;
pub mod inventory;
pub mod names;
pub mod quantity;
pub mod quota;
pub mod rules;
#[cfg(feature = "crd")]
pub mod v1alpha1;
#[cfg(feature = "crd")]
pub mod v1beta1;
#[cfg(feature = "crd")]
pub mod validation;

#[cfg(feature = "crd")]
pub use v1beta1::{HostPathProvisioner, HostPathProvisionerSpec, HostPathProvisionerStatus, StoragePool};
