//! The `hpp-provisioner` executable.

fn main() {
    println!("hpp-provisioner: not built yet");
}
