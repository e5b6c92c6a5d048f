//! The `hpp-csi-driver` executable.

fn main() {
    println!("hpp-csi-driver: not built yet");
}
