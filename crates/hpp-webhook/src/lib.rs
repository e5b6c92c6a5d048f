//! The validating and conversion admission webhook for `HostPathProvisioner`, served over rustls.
