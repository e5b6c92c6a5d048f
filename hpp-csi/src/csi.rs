//! Generated CSI v1 protobuf types, clients and server traits (package `csi.v1`).
#![allow(missing_docs, clippy::all, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

tonic::include_proto!("csi.v1");
