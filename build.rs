//! The build script: with the `publisher` feature, compiles the C++ half of the cxx bridges
//! into the static library; with the subscriber side alone, nothing.
fn main() {
    // The publisher feature (the default) compiles the cxx bridge; the subscriber side alone
    // (`default-features = false, features = ["subscriber"]`) needs no C++ compiler.
    #[cfg(feature = "publisher")]
    bridge();
}

/// Generates the C++ half of the bridges into $CARGO_TARGET_DIR/cxxbridge and compiles it into
/// the static library: ffi.rs's, and the shared structs Config and Stats it names. The bridge
/// includes cpp/log_sink.h and cpp/object_source.h relative to the crate root.
#[cfg(feature = "publisher")]
fn bridge() {
    let bridges = ["src/ffi.rs", "src/config/mod.rs", "src/stats.rs"];
    cxx_build::bridges(bridges)
        .include(env!("CARGO_MANIFEST_DIR"))
        .std("c++17")
        .compile("mooncake_kv_events_bridge");
    for bridge in bridges {
        println!("cargo:rerun-if-changed={bridge}");
    }
    println!("cargo:rerun-if-changed=cpp/log_sink.h");
    println!("cargo:rerun-if-changed=cpp/object_source.h");
}
