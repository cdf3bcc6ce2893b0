# Checks the symbols of the library the tests link, as a test:
#   cmake -DNM=<nm> -DLIBRARY=<file> -DVARIANT=ON|OFF -P check_symbols.cmake
#
# ON:  the dynamic symbol table of libmooncake_kv_events.so defines the public API and nothing
#      else: every defined symbol demangles into namespace mooncake::kv_events, and none is
#      Rust std, cxx, the bridge or libzmq.
# OFF: the stub archive refers to no Rust and no ZeroMQ symbol.

foreach(var NM LIBRARY VARIANT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_symbols.cmake: ${var} is not set")
  endif()
endforeach()

# The symbols `nm <args> LIBRARY` lists, one name per element (address and type dropped).
function(_kv_events_symbols out)
  execute_process(
    COMMAND "${NM}" ${ARGN} "${LIBRARY}"
    OUTPUT_VARIABLE listing
    RESULT_VARIABLE result
    ERROR_VARIABLE error)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "nm ${ARGN} ${LIBRARY} failed: ${error}")
  endif()
  string(REPLACE ";" "\\;" listing "${listing}")
  string(REPLACE "\n" ";" lines "${listing}")
  set(names "")
  foreach(line IN LISTS lines)
    # "<address> <type> <name>" or "<type> <name>"; a demangled name may contain spaces.
    if(line MATCHES "^([0-9a-fA-F]+ )?[A-Za-z] (.+)$")
      list(APPEND names "${CMAKE_MATCH_2}")
    endif()
  endforeach()
  set(${out} "${names}" PARENT_SCOPE)
endfunction()

set(forbidden "zmq_|rust_|_ZN3std|_ZN4core|_ZN5alloc|cxxbridge|_ZN4rust|rust::")
set(failures "")

if(VARIANT STREQUAL "ON")
  _kv_events_symbols(raw -D --defined-only)
  _kv_events_symbols(demangled -D --defined-only --demangle)
  list(LENGTH demangled count)
  if(count EQUAL 0)
    list(APPEND failures "no exported symbol at all")
  endif()
  foreach(name IN LISTS raw)
    if(name MATCHES "${forbidden}")
      list(APPEND failures "exports ${name}")
    endif()
  endforeach()
  foreach(name IN LISTS demangled)
    if(NOT name MATCHES "^mooncake::kv_events::")
      list(APPEND failures "exports ${name}, outside mooncake::kv_events")
    elseif(name MATCHES "^mooncake::kv_events::bridge::")
      list(APPEND failures "exports the bridge: ${name}")
    endif()
  endforeach()
  string(REPLACE ";" "\n  " shown "${demangled}")
  message(STATUS "${LIBRARY} exports ${count} symbols:\n  ${shown}")
elseif(VARIANT STREQUAL "OFF")
  _kv_events_symbols(undefined --undefined-only)
  foreach(name IN LISTS undefined)
    if(name MATCHES "${forbidden}")
      list(APPEND failures "the stub refers to ${name}")
    endif()
  endforeach()
else()
  message(FATAL_ERROR "check_symbols.cmake: VARIANT must be ON or OFF, not ${VARIANT}")
endif()

if(failures)
  string(REPLACE ";" "\n  " failures "${failures}")
  message(FATAL_ERROR "symbol check of ${LIBRARY} failed:\n  ${failures}")
endif()
