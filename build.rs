fn main() {
    // Generates the C++ half of the bridge into $CARGO_TARGET_DIR/cxxbridge and compiles it
    // into the static library. The bridge includes cpp/log_sink.h relative to the crate root.
    cxx_build::bridge("src/ffi.rs")
        .include(env!("CARGO_MANIFEST_DIR"))
        .std("c++17")
        .compile("mooncake_kv_events_bridge");
    println!("cargo:rerun-if-changed=src/ffi.rs");
    println!("cargo:rerun-if-changed=cpp/log_sink.h");
}
