//! Generates the CSI v1 types and tonic services from `proto/csi.proto`, and hpp's own admin
//! service from `proto/hpp/admin/v1/trash.proto`, with protox, so building needs no system
//! `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/csi.proto");
    println!("cargo:rerun-if-changed=proto/hpp/admin/v1/trash.proto");
    let fds = protox::compile(["proto/csi.proto", "proto/hpp/admin/v1/trash.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .generate_default_stubs(true)
        .compile_fds(fds)?;
    Ok(())
}
