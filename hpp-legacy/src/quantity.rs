//! Byte counts from Kubernetes quantities: the one parser in [`hpp_api::quantity`], shared with
//! the CR validation and the operator.

pub use hpp_api::quantity::parse_bytes;
