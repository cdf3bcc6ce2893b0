# Checks the symbols of the library the tests link, as a test:
#   cmake -DNM=<nm> -DLIBRARY=<file> -DVARIANT=ON|OFF -P check_symbols.cmake
#
# ON:  the dynamic symbol table of libmooncake_kv_events.so defines the C API and nothing else:
#      every defined symbol is a plain C name kv_events_* (no C++ name, so no C++ type in the
#      ABI), and none is Rust std, cxx, the bridge or libzmq.
# OFF: the stub archive refers to no Rust and no ZeroMQ symbol, and to nothing of the C++
#      runtime, so that a C program links it as it is.

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
  list(LENGTH raw count)
  if(count EQUAL 0)
    list(APPEND failures "no exported symbol at all")
  endif()
  foreach(name IN LISTS raw)
    if(name MATCHES "${forbidden}")
      list(APPEND failures "exports ${name}")
    elseif(NOT name MATCHES "^kv_events_[a-z_]+$")
      list(APPEND failures "exports ${name}, not a kv_events_* C function")
    endif()
  endforeach()
  string(REPLACE ";" "\n  " shown "${raw}")
  message(STATUS "${LIBRARY} exports ${count} symbols:\n  ${shown}")
elseif(VARIANT STREQUAL "OFF")
  _kv_events_symbols(undefined --undefined-only)
  foreach(name IN LISTS undefined)
    if(name MATCHES "${forbidden}")
      list(APPEND failures "the stub refers to ${name}")
    elseif(name MATCHES "^(_Z|__cxa_|__gxx_)")
      list(APPEND failures "the stub needs the C++ runtime: ${name}")
    endif()
  endforeach()
else()
  message(FATAL_ERROR "check_symbols.cmake: VARIANT must be ON or OFF, not ${VARIANT}")
endif()

if(failures)
  string(REPLACE ";" "\n  " failures "${failures}")
  message(FATAL_ERROR "symbol check of ${LIBRARY} failed:\n  ${failures}")
endif()
