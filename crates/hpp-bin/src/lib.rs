//! Shared start-up code for the hpp executables (`hpp-operator`, `hpp-csi-driver`,
//! `hpp-provisioner`): logging, telemetry and signal handling.
