# MooncakeKvEvents.cmake: the KV event publisher as one CMake target.
#
# A master adds it with two lines:
#
#   include(<path to mooncake-kv-events>/cmake/MooncakeKvEvents.cmake)
#   target_link_libraries(master PRIVATE mooncake::kv_events)
#
# The target mooncake_kv_events (alias mooncake::kv_events) carries include/ (the header
# mooncake/kv_events.h) and C++17 as usage requirements. Its implementation depends on the
# option ENABLE_KV_EVENTS:
#
#   OFF (default)  a small static C++ stub, cpp/kv_events_stub.cc: every call does nothing.
#                  Needs no Rust toolchain and no ZeroMQ.
#   ON             libmooncake_kv_events.so: the Rust crate, built by cargo as a static
#                  archive (--release --locked, into the crate's own target/ directory, the
#                  one a plain `cargo test` uses), wrapped by cpp/kv_events.cc. It links the
#                  system libzmq (Debian: libzmq3-dev, found with pkg-config) and exports the
#                  public API only: hidden visibility, and --exclude-libs,ALL for the archive.
#                  Needs cargo.

include_guard(GLOBAL)

option(ENABLE_KV_EVENTS
       "Publish KV events (Rust publisher on ZeroMQ); OFF builds a stub whose calls do nothing"
       OFF)

# The crate's root, fixed when the module is included (functions see the caller's list dir).
get_filename_component(_KV_EVENTS_ROOT "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)

# _kv_events_common(<target>)
# The usage requirements and build settings both variants share.
function(_kv_events_common target)
  target_include_directories(${target} PUBLIC "${_KV_EVENTS_ROOT}/include")
  target_compile_features(${target} PUBLIC cxx_std_17)
  set_target_properties(${target} PROPERTIES
    CXX_EXTENSIONS OFF
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    POSITION_INDEPENDENT_CODE ON)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE -Wall -Wextra)
  endif()
  add_library(mooncake::kv_events ALIAS ${target})
endfunction()

# _kv_events_add_stub(<target>)
# The OFF variant: a static library of no-op calls.
function(_kv_events_add_stub target)
  add_library(${target} STATIC "${_KV_EVENTS_ROOT}/cpp/kv_events_stub.cc")
  _kv_events_common(${target})
endfunction()

# _kv_events_check_modules(<file>...)
# Stops when src/lib.rs declares a module whose file is not among <file>: the cargo build
# would not rerun when it changes. Reconfigures whenever src/lib.rs changes.
function(_kv_events_check_modules)
  set(lib_rs "${_KV_EVENTS_ROOT}/src/lib.rs")
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${lib_rs}")
  file(STRINGS "${lib_rs}" declarations REGEX "^[ ]*(pub(\\([a-z]+\\))? )?mod [a-z_0-9]+;")
  foreach(declaration IN LISTS declarations)
    string(REGEX REPLACE ".*mod ([a-z_0-9]+);.*" "src/\\1.rs" file "${declaration}")
    if(NOT file IN_LIST ARGN)
      message(FATAL_ERROR
        "src/lib.rs declares a module in ${file}, which ${CMAKE_CURRENT_FUNCTION_LIST_FILE} "
        "does not list among the inputs of the cargo build: add it to `modules` there.")
    endif()
  endforeach()
endfunction()

# _kv_events_add_cargo_build(ARCHIVE <var> INCLUDE_DIR <var>)
# Declares the cargo build of the crate's static archive. Sets <ARCHIVE> to the archive's path
# and <INCLUDE_DIR> to the directory of the cxx bridge headers (created now, so that it exists
# at configure time), and adds the custom target _kv_events_cargo that produces both.
function(_kv_events_add_cargo_build)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "ARCHIVE;INCLUDE_DIR" "")
  find_program(KV_EVENTS_CARGO cargo
    HINTS "$ENV{CARGO_HOME}/bin" "$ENV{HOME}/.cargo/bin"
    DOC "cargo, to build the Rust publisher for ENABLE_KV_EVENTS=ON")
  if(NOT KV_EVENTS_CARGO)
    message(FATAL_ERROR
      "ENABLE_KV_EVENTS=ON builds the Rust publisher and needs cargo, which was not found. "
      "Install the Rust toolchain (https://rustup.rs), set KV_EVENTS_CARGO to cargo's path, "
      "or configure with -DENABLE_KV_EVENTS=OFF for the stub.")
  endif()

  set(root "${_KV_EVENTS_ROOT}")
  # The crate's own target directory: a plain `cargo test` shares it, so nothing builds twice.
  set(target_dir "${root}/target")
  set(archive "${target_dir}/release/libmooncake_kv_events.a")
  set(include_dir "${target_dir}/cxxbridge")
  file(MAKE_DIRECTORY "${include_dir}")

  # Every input of the library build; a new module of the crate must be added here.
  set(modules
    src/lib.rs src/bench.rs src/config.rs src/encode.rs src/event.rs src/ffi.rs src/log.rs
    src/media.rs src/publisher.rs src/queue.rs src/scan.rs src/stats.rs src/watch.rs
    src/worker.rs)
  _kv_events_check_modules(${modules})
  set(inputs Cargo.toml Cargo.lock build.rs .cargo/config.toml cpp/log_sink.h ${modules})
  list(TRANSFORM inputs PREPEND "${root}/")

  # CC, CXX and CFLAGS are left as they are: cc-rs reruns build scripts when they change, so
  # cargo must see the same environment as a plain `cargo test`.
  add_custom_command(
    OUTPUT "${archive}"
    BYPRODUCTS
      "${include_dir}/rust/cxx.h"
      "${include_dir}/mooncake-kv-events/src/ffi.rs.h"
    COMMAND "${CMAKE_COMMAND}" -E env "CARGO_TARGET_DIR=${target_dir}"
            "${KV_EVENTS_CARGO}" build --release --locked --lib
            --manifest-path "${root}/Cargo.toml"
    # cargo leaves a fresh archive untouched; mark it current so the build does not rerun.
    COMMAND "${CMAKE_COMMAND}" -E touch_nocreate "${archive}"
    DEPENDS ${inputs}
    WORKING_DIRECTORY "${root}"
    COMMENT "cargo build --release: mooncake-kv-events"
    USES_TERMINAL
    VERBATIM)
  add_custom_target(_kv_events_cargo DEPENDS "${archive}")

  set(${arg_ARCHIVE} "${archive}" PARENT_SCOPE)
  set(${arg_INCLUDE_DIR} "${include_dir}" PARENT_SCOPE)
endfunction()

# _kv_events_add_shared(<target>)
# The ON variant: libmooncake_kv_events.so, the C++ layer over the Rust archive.
function(_kv_events_add_shared target)
  find_package(PkgConfig QUIET)
  if(NOT PKG_CONFIG_FOUND)
    message(FATAL_ERROR
      "ENABLE_KV_EVENTS=ON finds libzmq with pkg-config, which was not found: install "
      "pkg-config (Debian: apt-get install pkg-config libzmq3-dev), or configure with "
      "-DENABLE_KV_EVENTS=OFF.")
  endif()
  pkg_check_modules(KV_EVENTS_LIBZMQ QUIET IMPORTED_TARGET libzmq)
  if(NOT KV_EVENTS_LIBZMQ_FOUND)
    message(FATAL_ERROR
      "ENABLE_KV_EVENTS=ON needs libzmq (pkg-config module libzmq), which was not found: "
      "install the Debian package libzmq3-dev (apt-get install libzmq3-dev), or configure "
      "with -DENABLE_KV_EVENTS=OFF.")
  endif()
  find_package(Threads REQUIRED)

  _kv_events_add_cargo_build(ARCHIVE archive INCLUDE_DIR bridge_include_dir)

  add_library(${target} SHARED "${_KV_EVENTS_ROOT}/cpp/kv_events.cc")
  _kv_events_common(${target})
  add_dependencies(${target} _kv_events_cargo)
  # The generated bridge header includes cpp/log_sink.h relative to the crate root.
  target_include_directories(${target} PRIVATE "${bridge_include_dir}" "${_KV_EVENTS_ROOT}")
  # The archive's native libraries (`cargo rustc -- --print native-static-libs`): libzmq,
  # then what Rust's std needs; the C++ runtime comes with the C++ link.
  target_link_libraries(${target} PRIVATE
    "${archive}" PkgConfig::KV_EVENTS_LIBZMQ Threads::Threads ${CMAKE_DL_LIBS} m rt util)
  set(version_script "${_KV_EVENTS_ROOT}/cmake/mooncake_kv_events.map")
  target_link_options(${target} PRIVATE
    # Nothing from the archive (Rust std, cxx, the bridge) enters the dynamic symbol table.
    "LINKER:--exclude-libs,ALL"
    # Only mooncake::kv_events does, even what hidden visibility cannot hide.
    "LINKER:--version-script=${version_script}"
    "LINKER:--no-undefined"
    "LINKER:--gc-sections")
  set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS "${version_script}")
endfunction()

if(ENABLE_KV_EVENTS)
  _kv_events_add_shared(mooncake_kv_events)
else()
  _kv_events_add_stub(mooncake_kv_events)
endif()
