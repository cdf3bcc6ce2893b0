# Builds and runs a consumer of mooncake::kv_events by one route, as a test:
#   cmake -DROUTE=<route> -DSOURCE_DIR=<checkout> -DWORK_DIR=<dir> -DPREFIX=<installed prefix>
#         -DLIBDIR=<libdir> -DCARGO_TARGET_DIR=<dir> -DGENERATOR=<generator> -DCC=<C compiler>
#         [-DCONSUMER_CMAKE=<another cmake>] -P check_consumer.cmake
#
# find_package, add_subdirectory, fetchcontent, include: configures consumer/ (ENABLE_KV_EVENTS=ON)
#   with that route, builds its C++ and C consumers and runs each: the real library must answer.
#   add_subdirectory and fetchcontent also install the consumer's build: the library it runs
#   with is installed, our headers and package are not (we are not the top-level project).
#   Configuring must say that the Rust publisher is linked; configured again with
#   ENABLE_KV_EVENTS=OFF (the checkout's routes), that the stub is, and how to switch.
#   CONSUMER_CMAKE configures, builds and installs the consumer with that cmake instead (an
#   older one: the library supports 3.16, as Mooncake).
# pkg-config: compiles consumer/consumer.c with `pkg-config --cflags --libs mooncake-kv-events`
#   of the installed prefix alone (no rpath flag of its own), and runs it without
#   LD_LIBRARY_PATH; the .pc must require libzmq privately.

foreach(var ROUTE SOURCE_DIR WORK_DIR PREFIX LIBDIR CARGO_TARGET_DIR GENERATOR CC)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "check_consumer.cmake: ${var} is not set")
  endif()
endforeach()

# _run(<what> <command>...): runs it; stops with its output when it fails. Sets `out`.
macro(_run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "${ROUTE}: ${what} failed (${result}):\n${out}\n${err}")
  endif()
endmacro()

# _check_answers(<program>): the program, run on a fresh endpoint, reports the real library.
function(_check_answers program)
  string(RANDOM LENGTH 8 suffix)
  _run("running ${program}" "${program}" "ipc:///tmp/kvev-consumer-${suffix}.sock")
  if(NOT out MATCHES "\"built_with_kv_events\":true")
    message(FATAL_ERROR "${ROUTE}: ${program} was not answered by the real library: ${out}")
  endif()
endfunction()

set(dir "${WORK_DIR}/${ROUTE}")
file(REMOVE_RECURSE "${dir}")
file(MAKE_DIRECTORY "${dir}")

if(ROUTE STREQUAL "pkg-config")
  set(ENV{PKG_CONFIG_PATH} "${PREFIX}/${LIBDIR}/pkgconfig")
  unset(ENV{LD_LIBRARY_PATH})
  _run("pkg-config" pkg-config --print-requires-private mooncake-kv-events)
  if(NOT out MATCHES "(^|\n)libzmq")
    message(FATAL_ERROR "pkg-config: mooncake-kv-events.pc does not require libzmq: ${out}")
  endif()
  _run("pkg-config" pkg-config --cflags --libs mooncake-kv-events)
  separate_arguments(flags UNIX_COMMAND "${out}")
  _run("compiling consumer.c" "${CC}" -std=c99 -Wall -Wextra -pedantic -Werror
       "${CMAKE_CURRENT_LIST_DIR}/consumer/consumer.c" ${flags} -o "${dir}/consumer_c")
  _check_answers("${dir}/consumer_c")
  message(STATUS "pkg-config: a plain C program built and ran against ${PREFIX}")
  return()
endif()

if(NOT DEFINED CONSUMER_CMAKE OR CONSUMER_CMAKE STREQUAL "")
  set(CONSUMER_CMAKE "${CMAKE_COMMAND}")
endif()
_run("configuring" "${CONSUMER_CMAKE}" -S "${CMAKE_CURRENT_LIST_DIR}/consumer" -B "${dir}/build"
     -G "${GENERATOR}" "-DROUTE=${ROUTE}" "-DKV_EVENTS_SOURCE_DIR=${SOURCE_DIR}"
     "-DCMAKE_PREFIX_PATH=${PREFIX}" -DENABLE_KV_EVENTS=ON
     "-DKV_EVENTS_CARGO_TARGET_DIR=${CARGO_TARGET_DIR}" -DCMAKE_BUILD_TYPE=Release)
if(NOT ROUTE STREQUAL "find_package"
   AND NOT out MATCHES "ENABLE_KV_EVENTS=ON: mooncake::kv_events is the Rust publisher")
  message(FATAL_ERROR "${ROUTE}: configuring did not say the Rust publisher is linked:\n${out}")
endif()
_run("building" "${CONSUMER_CMAKE}" --build "${dir}/build")
_check_answers("${dir}/build/consumer_cxx")
_check_answers("${dir}/build/consumer_c")

if(ROUTE MATCHES "^(add_subdirectory|fetchcontent)$")
  _run("installing" "${CONSUMER_CMAKE}" --install "${dir}/build" --prefix "${dir}/prefix")
  if(NOT EXISTS "${dir}/prefix/${LIBDIR}/libmooncake_kv_events.so.0")
    message(FATAL_ERROR "${ROUTE}: the library the consumer runs with is not installed")
  endif()
  if(EXISTS "${dir}/prefix/include/mooncake" OR EXISTS "${dir}/prefix/${LIBDIR}/cmake")
    message(FATAL_ERROR "${ROUTE}: a consumer's install put our headers or package in its prefix")
  endif()
endif()
if(NOT ROUTE STREQUAL "find_package")
  _run("configuring with ENABLE_KV_EVENTS=OFF" "${CONSUMER_CMAKE}"
       -S "${CMAKE_CURRENT_LIST_DIR}/consumer" -B "${dir}/build-off" -G "${GENERATOR}"
       "-DROUTE=${ROUTE}" "-DKV_EVENTS_SOURCE_DIR=${SOURCE_DIR}" -DENABLE_KV_EVENTS=OFF)
  if(NOT out MATCHES "ENABLE_KV_EVENTS=OFF: mooncake::kv_events is the stub, whose calls do nothing"
     OR NOT out MATCHES "configure with -DENABLE_KV_EVENTS=ON for the Rust publisher")
    message(FATAL_ERROR "${ROUTE}: configuring OFF did not say the stub is linked:\n${out}")
  endif()
endif()
execute_process(COMMAND "${CONSUMER_CMAKE}" --version OUTPUT_VARIABLE version)
string(REGEX MATCH "[0-9]+\\.[0-9]+\\.[0-9]+" version "${version}")
message(STATUS "${ROUTE}: mooncake::kv_events built and ran a C++ and a C consumer "
               "(CMake ${version})")
