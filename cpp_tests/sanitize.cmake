# sanitize.cmake: the cache variable KV_EVENTS_SANITIZE, for building the C++ tests under
# sanitizers (scripts/sanitize.sh):
#
#   cmake -S cpp_tests -B build/asan -DENABLE_KV_EVENTS=ON -DKV_EVENTS_SANITIZE="address;undefined"
#   cmake -S cpp_tests -B build/tsan -DENABLE_KV_EVENTS=ON -DKV_EVENTS_SANITIZE=thread
#
# The value is the list -fsanitize= takes. Every target this directory and its subdirectories
# build (the test executables, their support libraries and mooncake_kv_events itself: the C++
# layer of the ON library, or the OFF stub) is compiled with it and, when linked, linked with it.
# The cargo-built Rust archive inside the ON library is not instrumented: that needs a nightly
# toolchain (-Zsanitizer) and a rebuilt std. docs/testing.md says what each run therefore covers.
#
# The flags are added when the directory has been read (cmake_language(DEFER)), so targets
# added anywhere in cpp_tests are covered without each one asking for it; the module
# cmake/MooncakeKvEvents.cmake is left as a master sees it.

set(KV_EVENTS_SANITIZE "" CACHE STRING
    "Sanitizers for the C++ tests and the library's C++ layer: address;undefined, or thread")

# _kv_events_sanitize_targets(<dir>)
# Adds the sanitizer flags to the targets built in <dir> and in its subdirectories.
function(_kv_events_sanitize_targets dir)
  list(JOIN KV_EVENTS_SANITIZE "," sanitizers)
  get_property(targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
  foreach(target IN LISTS targets)
    get_target_property(type ${target} TYPE)
    if(type MATCHES "^(EXECUTABLE|SHARED_LIBRARY|MODULE_LIBRARY|STATIC_LIBRARY|OBJECT_LIBRARY)$")
      # Frame pointers for whole stacks in reports; the first report fails the test.
      target_compile_options(${target} PRIVATE
        -fsanitize=${sanitizers} -fno-omit-frame-pointer -fno-sanitize-recover=all -g)
      # GCC's manual (-fsanitize): "sanitizers tend to increase the rate of false positive
      # warnings, most notably those around -Wmaybe-uninitialized". Seen here in libstdc++'s
      # <regex> under address;undefined at -O2; the unsanitized builds keep the warning.
      if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
        target_compile_options(${target} PRIVATE -Wno-maybe-uninitialized)
      endif()
    endif()
    if(type MATCHES "^(EXECUTABLE|SHARED_LIBRARY|MODULE_LIBRARY)$")
      target_link_options(${target} PRIVATE -fsanitize=${sanitizers})
    endif()
  endforeach()
  get_property(subdirectories DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
  foreach(subdirectory IN LISTS subdirectories)
    _kv_events_sanitize_targets("${subdirectory}")
  endforeach()
endfunction()

if(KV_EVENTS_SANITIZE)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    message(FATAL_ERROR
      "KV_EVENTS_SANITIZE needs GCC or Clang (-fsanitize=); ${CMAKE_CXX_COMPILER_ID} has none. "
      "Configure with -DKV_EVENTS_SANITIZE= to build without sanitizers.")
  endif()
  foreach(sanitizer IN LISTS KV_EVENTS_SANITIZE)
    if(NOT sanitizer MATCHES "^(address|undefined|leak|thread)$")
      message(FATAL_ERROR
        "KV_EVENTS_SANITIZE: unknown sanitizer '${sanitizer}'; use address;undefined, or thread.")
    endif()
  endforeach()
  if("thread" IN_LIST KV_EVENTS_SANITIZE AND
     ("address" IN_LIST KV_EVENTS_SANITIZE OR "leak" IN_LIST KV_EVENTS_SANITIZE))
    message(FATAL_ERROR
      "KV_EVENTS_SANITIZE: thread cannot be combined with address or leak; configure one build "
      "directory with -DKV_EVENTS_SANITIZE=\"address;undefined\" and another with "
      "-DKV_EVENTS_SANITIZE=thread.")
  endif()
  cmake_language(DEFER DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}"
                 CALL _kv_events_sanitize_targets "${CMAKE_CURRENT_SOURCE_DIR}")
endif()
