# MooncakeKvEventsVersion.cmake: sets MOONCAKE_KV_EVENTS_VERSION to the version of the crate
# (Cargo.toml), the one number for the crate, the library file, the CMake package and the
# pkg-config file. Stops when the C header's MOONCAKE_KV_EVENTS_VERSION_* macros say otherwise,
# since kv_events_version() reports those. Included before project() by the top-level
# CMakeLists.txt, and by cmake/MooncakeKvEvents.cmake.

# _kv_events_version(<var> <crate root>)
function(_kv_events_version var root)
  set(manifest "${root}/Cargo.toml")
  set(header "${root}/include/mooncake/kv_events_c.h")
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${manifest}" "${header}")
  file(STRINGS "${manifest}" line REGEX "^version = \"[0-9.]+\"$" LIMIT_COUNT 1)
  if(NOT line MATCHES "\"([0-9]+\\.[0-9]+\\.[0-9]+)\"")
    message(FATAL_ERROR "${manifest} has no line `version = \"X.Y.Z\"`")
  endif()
  set(version "${CMAKE_MATCH_1}")
  set(from_header "")
  foreach(part MAJOR MINOR PATCH)
    file(STRINGS "${header}" line REGEX "^#define MOONCAKE_KV_EVENTS_VERSION_${part} [0-9]+$")
    string(REGEX REPLACE ".* " "" number "${line}")
    list(APPEND from_header "${number}")
  endforeach()
  list(JOIN from_header "." from_header)
  if(NOT from_header STREQUAL version)
    message(FATAL_ERROR
      "${header} says version ${from_header}, ${manifest} ${version}: set "
      "MOONCAKE_KV_EVENTS_VERSION_{MAJOR,MINOR,PATCH} to the crate's version.")
  endif()
  set(${var} "${version}" PARENT_SCOPE)
endfunction()

_kv_events_version(MOONCAKE_KV_EVENTS_VERSION "${CMAKE_CURRENT_LIST_DIR}/..")
