# MooncakeKvEvents.cmake: the KV event publisher as one CMake target.
#
# A master adds it with two lines:
#
#   include(<path to mooncake-kv-events>/cmake/MooncakeKvEvents.cmake)
#   target_link_libraries(master PRIVATE mooncake::kv_events)
#
# (or add_subdirectory / FetchContent of the checkout, whose CMakeLists.txt includes this file,
# or find_package(MooncakeKvEvents CONFIG) of an installed one: the same target each way).
#
# The target mooncake_kv_events (alias mooncake::kv_events) carries include/ (the C API
# mooncake/kv_events_c.h and its inline C++ wrapper mooncake/kv_events.h) and C++17 as usage
# requirements. Its implementation depends on the option ENABLE_KV_EVENTS:
#
#   OFF (default)  a small static stub, cpp/kv_events_stub.cc: every call does nothing. Needs no
#                  Rust toolchain and no ZeroMQ, and no C++ runtime (a C program links it).
#   ON             libmooncake_kv_events.so.0 (SONAME; the file carries the crate's version):
#                  the Rust crate, built by cargo as a static archive (--release --locked,
#                  -p mooncake-kv-events --lib: the library package alone, never the
#                  workspace's kv-events command or what only it uses, such as clap;
#                  into KV_EVENTS_CARGO_TARGET_DIR, under the build tree unless set), wrapped
#                  by the C API of cpp/kv_events.cc. It links the system libzmq (Debian:
#                  libzmq3-dev, found with pkg-config) and exports the C API only (kv_events_*):
#                  hidden visibility, a version script, and --exclude-libs,ALL for the archive.
#                  Cargo's dep-info file decides when the archive is rebuilt. Needs cargo.
#
# Configuring says which variant is linked and how to switch (a STATUS line, every route).
# CMake 3.16 or later, as Mooncake: the Ninja and Makefile generators rebuild the archive from
# cargo's dep-info file (Makefiles from 3.20 on; before, cargo runs on every build and decides).
#
# Configuring and building never write into this directory: cargo's target directory is in
# the build tree, and Cargo.lock is only read (--locked).
#
# Installing: in the ON build, `cmake --install` always puts the library and its SONAME link
# under CMAKE_INSTALL_LIBDIR (the master needs it to run). With KV_EVENTS_INSTALL (ON only when
# this is the top-level project, so that a master including us does not install our headers by
# surprise) it also installs what builds against the library: both headers, the link-time
# libmooncake_kv_events.so (or the stub archive), the CMake package MooncakeKvEvents and the
# pkg-config file mooncake-kv-events.pc.
# An installed master finds the library through its RUNPATH: one more line,
#
#   kv_events_install_rpath(master)
#
# gives it $ORIGIN/../<libdir> and $ORIGIN (a master in bin/, or beside the library).

include_guard(GLOBAL)

option(ENABLE_KV_EVENTS
       "Publish KV events (Rust publisher on ZeroMQ); OFF builds a stub whose calls do nothing"
       OFF)
# Top level: the checkout configured as its own project (CMakeLists.txt), not a master's
# (<project>_IS_TOP_LEVEL is CMake 3.21's; before it, the source tree's root says the same).
if(DEFINED MooncakeKvEvents_IS_TOP_LEVEL)
  set(_kv_events_top_level ${MooncakeKvEvents_IS_TOP_LEVEL})
elseif("${CMAKE_SOURCE_DIR}/cmake" STREQUAL CMAKE_CURRENT_LIST_DIR)
  set(_kv_events_top_level ON)
else()
  set(_kv_events_top_level OFF)
endif()
option(KV_EVENTS_INSTALL
       "Install the KV event publisher's headers, CMake package and pkg-config file"
       ${_kv_events_top_level})
# Off for a system prefix (/usr), whose lib directory the loader searches anyway.
if(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  set(_kv_events_pc_rpath OFF)
else()
  set(_kv_events_pc_rpath ON)
endif()
option(KV_EVENTS_PC_RPATH
       "Put -Wl,-rpath,<libdir> in the Libs of mooncake-kv-events.pc (ON build)"
       ${_kv_events_pc_rpath})
set(KV_EVENTS_CARGO_TARGET_DIR "${CMAKE_BINARY_DIR}/mooncake-kv-events/cargo" CACHE PATH
    "cargo's target directory for the ON build; give the crate's target/ to share it with cargo test")

include(GNUInstallDirs)
include("${CMAKE_CURRENT_LIST_DIR}/MooncakeKvEventsVersion.cmake")
# The cargo build's DEPFILE names absolute paths: let CMake rewrite them as the generator wants,
# whatever policy version the including master asked for (CMake 3.20 and later; Ninja takes
# them as they are before).
if(POLICY CMP0116)
  cmake_policy(SET CMP0116 NEW)
endif()

# The crate's root, fixed when the module is included (functions see the caller's list dir).
get_filename_component(_KV_EVENTS_ROOT "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)

# _kv_events_common(<target>)
# The usage requirements and build settings both variants share.
function(_kv_events_common target)
  target_include_directories(${target} PUBLIC
    "$<BUILD_INTERFACE:${_KV_EVENTS_ROOT}/include>"
    "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>")
  target_compile_features(${target} PUBLIC cxx_std_17)
  set_target_properties(${target} PROPERTIES
    CXX_EXTENSIONS OFF
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    POSITION_INDEPENDENT_CODE ON
    EXPORT_NAME kv_events)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE -Wall -Wextra)
  endif()
  add_library(mooncake::kv_events ALIAS ${target})
endfunction()

# _kv_events_add_stub(<target>)
# The OFF variant: a static library of no-op calls, free of the C++ runtime.
function(_kv_events_add_stub target)
  add_library(${target} STATIC
    "${_KV_EVENTS_ROOT}/cpp/kv_events_stub.cc" "${_KV_EVENTS_ROOT}/cpp/kv_events_common.cc")
  _kv_events_common(${target})
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE -fno-exceptions -fno-rtti)
  endif()
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

  # What cargo reads besides the crate's sources, which its dep-info file lists.
  set(inputs Cargo.toml Cargo.lock build.rs)
  list(TRANSFORM inputs PREPEND "${root}/")
  # Cargo's dep-info file of the library: every source file and build-script input it read.
  # Ninja and Makefile generators take it as the DEPFILE; others run cargo on every build, and
  # cargo decides.
  set(depfile "${target_dir}/release/libmooncake_kv_events.d")
  if(CMAKE_GENERATOR MATCHES "Ninja"
     OR (CMAKE_GENERATOR MATCHES "Makefiles" AND NOT CMAKE_VERSION VERSION_LESS 3.20))
    set(dependencies DEPFILE "${depfile}")
  else()
    set(always_stale "${target_dir}/always-stale")
    set(dependencies DEPENDS "${always_stale}")
    add_custom_command(OUTPUT "${always_stale}" COMMAND "${CMAKE_COMMAND}" -E true)
  endif()

  # CC, CXX and CFLAGS are left as they are: cc-rs reruns build scripts when they change, so
  # a target directory shared with a plain `cargo test` must see the same environment.
  # The bridge headers are not declared as byproducts: Ninja deletes the outputs of a command
  # it interrupts, and cargo, whose build script already ran, would not write them again (the
  # next build would fail on a missing rust/cxx.h). The C++ objects' own depfiles track them.
  add_custom_command(
    OUTPUT "${archive}"
    COMMAND "${CMAKE_COMMAND}" -E env "CARGO_TARGET_DIR=${target_dir}"
            "${KV_EVENTS_CARGO}" build --release --locked -p mooncake-kv-events --lib
            --manifest-path "${root}/Cargo.toml"
    # cargo leaves a fresh archive untouched; mark it current so the build does not rerun.
    COMMAND "${CMAKE_COMMAND}" -E touch_nocreate "${archive}"
    DEPENDS ${inputs}
    ${dependencies}
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

  add_library(${target} SHARED
    "${_KV_EVENTS_ROOT}/cpp/kv_events.cc" "${_KV_EVENTS_ROOT}/cpp/kv_events_common.cc")
  _kv_events_common(${target})
  # The ABI's major version is the SONAME's: 0 until the C API is declared stable.
  set_target_properties(${target} PROPERTIES
    VERSION "${MOONCAKE_KV_EVENTS_VERSION}" SOVERSION 0)
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
    # Only the C API (kv_events_*) does, even what hidden visibility cannot hide.
    "LINKER:--version-script=${version_script}"
    "LINKER:--no-undefined"
    "LINKER:--gc-sections")
  set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS "${version_script}")
endfunction()

# _kv_events_install(<target>)
# In the ON build, the shared library and its SONAME link, which an installed master runs with.
# With KV_EVENTS_INSTALL, what builds against it as well: both headers, the link-time name (or
# the OFF build's stub archive), the CMake package and the pkg-config file.
function(_kv_events_install target)
  if(NOT KV_EVENTS_INSTALL)
    if(ENABLE_KV_EVENTS)
      install(TARGETS ${target} LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}" NAMELINK_SKIP)
    endif()
    return()
  endif()
  set(package_dir "${CMAKE_INSTALL_LIBDIR}/cmake/MooncakeKvEvents")
  install(TARGETS ${target} EXPORT MooncakeKvEventsTargets
          LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}"
          ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}")
  install(FILES "${_KV_EVENTS_ROOT}/include/mooncake/kv_events.h"
                "${_KV_EVENTS_ROOT}/include/mooncake/kv_events_c.h"
          DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/mooncake")
  install(EXPORT MooncakeKvEventsTargets NAMESPACE mooncake:: DESTINATION "${package_dir}")

  include(CMakePackageConfigHelpers)
  set(generated "${CMAKE_CURRENT_BINARY_DIR}/mooncake-kv-events")
  configure_package_config_file("${_KV_EVENTS_ROOT}/cmake/MooncakeKvEventsConfig.cmake.in"
    "${generated}/MooncakeKvEventsConfig.cmake" INSTALL_DESTINATION "${package_dir}")
  # 0.x: the SONAME's major version is the compatibility promise.
  write_basic_package_version_file("${generated}/MooncakeKvEventsConfigVersion.cmake"
    VERSION "${MOONCAKE_KV_EVENTS_VERSION}" COMPATIBILITY SameMajorVersion)
  install(FILES "${generated}/MooncakeKvEventsConfig.cmake"
                "${generated}/MooncakeKvEventsConfigVersion.cmake"
          DESTINATION "${package_dir}")

  # The .pc file finds the prefix from its own place, so that any --prefix works. The shared
  # library links libzmq (Requires.private, for static links and for pkg-config's checks); a
  # program linked with `pkg-config --libs` finds it at run time through an RUNPATH entry
  # (`rpath`, in Libs with KV_EVENTS_PC_RPATH), as the loader does not look in a prefix of
  # one's own.
  file(RELATIVE_PATH _KV_EVENTS_PC_PREFIX "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
  if(ENABLE_KV_EVENTS)
    set(_KV_EVENTS_PC_REQUIRES_PRIVATE "Requires.private: libzmq")
    set(_KV_EVENTS_PC_RPATH_FLAG "")
    if(KV_EVENTS_PC_RPATH)
      set(_KV_EVENTS_PC_RPATH_FLAG " \${rpath}")
    endif()
  else()
    # The stub archive needs nothing, and there is no shared library to find at run time.
    set(_KV_EVENTS_PC_REQUIRES_PRIVATE "")
    set(_KV_EVENTS_PC_RPATH_FLAG "")
  endif()
  configure_file("${_KV_EVENTS_ROOT}/cmake/mooncake-kv-events.pc.in"
                 "${generated}/mooncake-kv-events.pc" @ONLY)
  install(FILES "${generated}/mooncake-kv-events.pc"
          DESTINATION "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
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
  message(STATUS "mooncake-kv-events ${MOONCAKE_KV_EVENTS_VERSION}: ENABLE_KV_EVENTS=ON: "
                 "mooncake::kv_events is the Rust publisher, libmooncake_kv_events.so "
                 "(cargo ${KV_EVENTS_CARGO}, libzmq ${KV_EVENTS_LIBZMQ_VERSION}); "
                 "-DENABLE_KV_EVENTS=OFF links the stub whose calls do nothing")
else()
  _kv_events_add_stub(mooncake_kv_events)
  message(STATUS "mooncake-kv-events ${MOONCAKE_KV_EVENTS_VERSION}: ENABLE_KV_EVENTS=OFF: "
                 "mooncake::kv_events is the stub, whose calls do nothing (no events are "
                 "published); configure with -DENABLE_KV_EVENTS=ON for the Rust publisher "
                 "(needs cargo and libzmq)")
endif()
_kv_events_install(mooncake_kv_events)
