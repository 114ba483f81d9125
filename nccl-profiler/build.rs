//! NCCL dlcloses a profiler plugin when its last communicator is destroyed, while the
//! plugin's sender thread may still be running code from it: `-z nodelete` keeps the library
//! mapped for the life of the process (dlclose becomes a no-op).
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
}
