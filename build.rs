//! Rebuild when the embedded Python package skeleton changes: `include_dir!` reads
//! `python/package/` at compile time, and cargo does not know that on its own.

fn main() {
    println!("cargo:rerun-if-changed=python/package");
}
