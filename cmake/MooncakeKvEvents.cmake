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
#   ON             libmooncake_kv_events.so.0 (SONAME; the file carries the crate's version):
#                  the Rust crate, built by cargo as a static archive (--release --locked,
#                  into KV_EVENTS_CARGO_TARGET_DIR, under the build tree unless set), wrapped
#                  by cpp/kv_events.cc. It links the system libzmq (Debian: libzmq3-dev, found
#                  with pkg-config) and exports the public API only: hidden visibility, and
#                  --exclude-libs,ALL for the archive. Needs cargo.
#
# Configuring and building never write into this directory: cargo's target directory is in
# the build tree, and Cargo.lock is only read (--locked).
#
# Installing (KV_EVENTS_INSTALL, ON by default): `cmake --install` puts the header under
# include/ and, in the ON build, the library and its SONAME link under CMAKE_INSTALL_LIBDIR.
# An installed master finds the library through its RUNPATH: one more line,
#
#   kv_events_install_rpath(master)
#
# gives it $ORIGIN/../<libdir> and $ORIGIN (a master in bin/, or beside the library).

include_guard(GLOBAL)

option(ENABLE_KV_EVENTS
       "Publish KV events (Rust publisher on ZeroMQ); OFF builds a stub whose calls do nothing"
       OFF)
option(KV_EVENTS_INSTALL "Install the KV event publisher's header and library" ON)
set(KV_EVENTS_CARGO_TARGET_DIR "${CMAKE_BINARY_DIR}/mooncake-kv-events/cargo" CACHE PATH
    "cargo's target directory for the ON build; give the crate's target/ to share it with cargo test")

include(GNUInstallDirs)

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
  set(target_dir "${KV_EVENTS_CARGO_TARGET_DIR}")
  set(archive "${target_dir}/release/libmooncake_kv_events.a")
  set(include_dir "${target_dir}/cxxbridge")
  file(MAKE_DIRECTORY "${include_dir}")

  # Every input of the library build; a new module of the crate must be added here.
  set(modules
    src/lib.rs src/bench.rs src/config.rs src/encode.rs src/event.rs src/ffi.rs src/keys.rs
    src/log.rs src/media.rs src/pool.rs src/publisher.rs src/queue.rs src/scan.rs src/security.rs
    src/stats.rs src/watch.rs src/worker.rs)
  _kv_events_check_modules(${modules})
  set(inputs Cargo.toml Cargo.lock build.rs .cargo/config.toml cpp/log_sink.h ${modules})
  list(TRANSFORM inputs PREPEND "${root}/")

  # CC, CXX and CFLAGS are left as they are: cc-rs reruns build scripts when they change, so
  # a target directory shared with a plain `cargo test` must see the same environment.
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
  # The ABI's major version is the SONAME's: 0 until the header's API is declared stable.
  _kv_events_crate_version(version)
  set_target_properties(${target} PROPERTIES VERSION "${version}" SOVERSION 0)
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

# _kv_events_crate_version(<var>)
# Sets <var> to the version in Cargo.toml: one number for the crate and the library file.
function(_kv_events_crate_version var)
  set(manifest "${_KV_EVENTS_ROOT}/Cargo.toml")
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${manifest}")
  file(STRINGS "${manifest}" line REGEX "^version = \"[0-9.]+\"$" LIMIT_COUNT 1)
  if(NOT line MATCHES "\"([0-9.]+)\"")
    message(FATAL_ERROR "${manifest} has no line `version = \"X.Y.Z\"`")
  endif()
  set(${var} "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()

# _kv_events_install(<target>)
# The header in both variants; the shared library (and its SONAME link) in the ON build. The
# OFF stub is linked into the master itself, so nothing of it is needed at run time.
function(_kv_events_install target)
  install(FILES "${_KV_EVENTS_ROOT}/include/mooncake/kv_events.h"
          DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/mooncake")
  if(ENABLE_KV_EVENTS)
    install(TARGETS ${target} LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}")
  endif()
endfunction()

# kv_events_install_rpath(<target>...)
# Makes each installed <target> find libmooncake_kv_events.so.0 without LD_LIBRARY_PATH: its
# INSTALL_RPATH gains $ORIGIN/../<libdir> (a master installed in bin/) and $ORIGIN (a master
# shipped beside the library, as in a Python wheel). Nothing to do in the OFF build.
function(kv_events_install_rpath)
  if(NOT ENABLE_KV_EVENTS)
    return()
  endif()
  foreach(target IN LISTS ARGN)
    set_property(TARGET ${target} APPEND PROPERTY INSTALL_RPATH
                 "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}" "$ORIGIN")
  endforeach()
endfunction()

if(ENABLE_KV_EVENTS)
  _kv_events_add_shared(mooncake_kv_events)
else()
  _kv_events_add_stub(mooncake_kv_events)
endif()
if(KV_EVENTS_INSTALL)
  _kv_events_install(mooncake_kv_events)
endif()
