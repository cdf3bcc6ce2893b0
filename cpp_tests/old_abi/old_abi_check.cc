// A master built with the old libstdc++ string ABI (-D_GLIBCXX_USE_CXX11_ABI=0, as some prebuilt
// toolchains and Python wheels are): it creates a publisher through the C++ header, whose
// std::string and std::function never cross into the library, and checks that a subscriber
// reads the configured backend id and key. Before the C API, this create misread the Config.
//
// A plain program, not a GoogleTest one: GoogleTest's library is built with the new ABI. The
// subscriber and the msgpack reader are compiled into it, with the old ABI.

#include <unistd.h>

#include <chrono>
#include <iostream>
#include <string>

#include "mooncake/kv_events.h"
#include "msgpack_reader.h"
#include "subscriber.h"

namespace kv = mooncake::kv_events;

#if _GLIBCXX_USE_CXX11_ABI
#error "this check must be compiled with -D_GLIBCXX_USE_CXX11_ABI=0"
#endif

namespace {

int fail(const std::string& what) {
  std::cerr << "kv_events_old_abi_check: " << what << "\n";
  return 1;
}

}  // namespace

int main() {
  kv::Config config;
  config.enable_kv_events = true;
  config.bind_endpoint = "ipc:///tmp/kvev-old-abi-" + std::to_string(getpid()) + ".sock";
  config.backend_id = "old-abi-store";
  config.model_name = "old-abi-model";
  try {
    const auto publisher = kv::Publisher::create(config);
    kv_events_test::Subscriber subscriber(config.bind_endpoint);
    subscriber.wait_joined();
    publisher->on_put_commit("tenant", "old-abi-key", "group", {kv::Medium::kCpu});
    if (!publisher->flush(std::chrono::seconds(10))) return fail("flush failed");
    const auto message = subscriber.receive(std::chrono::seconds(10));
    if (!message || message->size() != 3) return fail("no three-frame message arrived");
    const kv_events_test::Value payload = kv_events_test::decode((*message)[2]);
    const kv_events_test::Value& event = payload.as_array().at(1).as_array().at(0);
    if (event.at("backend_id").as_str() != config.backend_id) {
      return fail("backend_id is " + event.at("backend_id").debug_string());
    }
    if (event.at("model_name").as_str() != config.model_name) {
      return fail("model_name is " + event.at("model_name").debug_string());
    }
    if (event.at("object_key").as_str() != "old-abi-key") {
      return fail("object_key is " + event.at("object_key").debug_string());
    }
    const std::string status = publisher->status_json();
    if (status.find("\"published_events\":1") == std::string::npos) return fail(status);
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  std::cout << "kv_events_old_abi_check: the stream carries backend_id old-abi-store\n";
  return 0;
}
