# Installs a configured and built cpp_tests tree into a scratch prefix and checks what an
# installed master gets, as a test:
#   cmake -DBUILD_DIR=<dir> -DPREFIX=<dir> -DVARIANT=ON|OFF -DREADELF=<readelf>
#         -DLIBDIR=<libdir> -P check_install.cmake
#
# Both: both headers, the CMake package (MooncakeKvEventsConfig.cmake, its version file and the
# exported targets) and mooncake-kv-events.pc are installed, and kv_events_installed_check
# (installed like a master, with kv_events_install_rpath) runs from the prefix with no
# LD_LIBRARY_PATH. The prefix stays for the tests that consume it (ctypes, find_package,
# pkg-config).
# ON:  the library is installed as libmooncake_kv_events.so.0 and the versioned file it links
#      to, its SONAME is libmooncake_kv_events.so.0, the installed program's RUNPATH names
#      $ORIGIN/../<libdir> and not the build tree, and the library that answers is the real one.
# OFF: no shared library is installed; the stub inside the program answers.

foreach(var BUILD_DIR PREFIX VARIANT READELF LIBDIR)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "check_install.cmake: ${var} is not set")
  endif()
endforeach()

set(failures "")
macro(_fail what)
  list(APPEND failures "${what}")
endmacro()

file(REMOVE_RECURSE "${PREFIX}")
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${PREFIX}"
                RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "cmake --install failed: ${out}${err}")
endif()

foreach(file
    include/mooncake/kv_events.h
    include/mooncake/kv_events_c.h
    ${LIBDIR}/cmake/MooncakeKvEvents/MooncakeKvEventsConfig.cmake
    ${LIBDIR}/cmake/MooncakeKvEvents/MooncakeKvEventsConfigVersion.cmake
    ${LIBDIR}/cmake/MooncakeKvEvents/MooncakeKvEventsTargets.cmake
    ${LIBDIR}/pkgconfig/mooncake-kv-events.pc)
  if(NOT EXISTS "${PREFIX}/${file}")
    _fail("${file} is not installed")
  endif()
endforeach()
# Nothing installed may name the build or source tree: the package works from any prefix.
file(GLOB_RECURSE package_files "${PREFIX}/${LIBDIR}/cmake/*" "${PREFIX}/${LIBDIR}/pkgconfig/*")
get_filename_component(source_dir "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
foreach(file IN LISTS package_files)
  file(READ "${file}" text)
  if(text MATCHES "${source_dir}|${BUILD_DIR}")
    _fail("${file} names the source or build tree")
  endif()
endforeach()

set(program "${PREFIX}/bin/kv_events_installed_check")
set(library "${PREFIX}/${LIBDIR}/libmooncake_kv_events.so.0")
file(GLOB installed_libraries "${PREFIX}/${LIBDIR}/libmooncake_kv_events.so*")
if(VARIANT STREQUAL "ON")
  if(NOT EXISTS "${library}" OR NOT EXISTS "${PREFIX}/${LIBDIR}/libmooncake_kv_events.so")
    _fail("${LIBDIR}/libmooncake_kv_events.so.0 or its link-time name is not installed "
          "(found: ${installed_libraries})")
  else()
    execute_process(COMMAND "${READELF}" -d "${library}" OUTPUT_VARIABLE dynamic)
    if(NOT dynamic MATCHES "Library soname: \\[libmooncake_kv_events\\.so\\.0\\]")
      _fail("the library's SONAME is not libmooncake_kv_events.so.0:\n${dynamic}")
    endif()
  endif()
  execute_process(COMMAND "${READELF}" -d "${program}" OUTPUT_VARIABLE dynamic)
  if(NOT dynamic MATCHES "(RUNPATH|RPATH)[^\n]*\\$ORIGIN/\\.\\./${LIBDIR}")
    _fail("the installed program's RUNPATH lacks $ORIGIN/../${LIBDIR}:\n${dynamic}")
  endif()
  if(dynamic MATCHES "${BUILD_DIR}")
    _fail("the installed program still points into the build tree:\n${dynamic}")
  endif()
  set(expected "\"built_with_kv_events\":true")
else()
  if(installed_libraries)
    _fail("the OFF build installed a shared library: ${installed_libraries}")
  endif()
  set(expected "\"built_with_kv_events\":false")
endif()

string(RANDOM LENGTH 8 suffix)
execute_process(
  COMMAND "${CMAKE_COMMAND}" -E env --unset=LD_LIBRARY_PATH
          "${program}" "ipc:///tmp/kvev-install-${suffix}.sock"
  RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT result EQUAL 0)
  _fail("the installed program did not run (exit ${result}): ${err}")
elseif(NOT out MATCHES "${expected}")
  _fail("the installed program's status lacks ${expected}: ${out}")
endif()

if(failures)
  list(JOIN failures "\n  " text)
  message(FATAL_ERROR "check_install.cmake (${VARIANT}):\n  ${text}")
endif()
message(STATUS "check_install.cmake (${VARIANT}): ${PREFIX} holds what an installed master needs")
