fn main() {
    // Generates the C++ half of the bridge into $CARGO_TARGET_DIR/cxxbridge and compiles it
    // into the static library.
    cxx_build::bridge("src/ffi.rs")
        .std("c++17")
        .compile("mooncake_kv_events_bridge");
    println!("cargo:rerun-if-changed=src/ffi.rs");
}
