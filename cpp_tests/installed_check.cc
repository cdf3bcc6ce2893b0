// A stand-in for an installed master: linked and installed as a master is
// (kv_events_install_rpath), then run from the install prefix by check_install.cmake. It
// creates an enabled publisher on the ipc endpoint given as its argument and prints the
// publisher's status_json(), which says which library answered.

#include <iostream>

#include "mooncake/kv_events.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: kv_events_installed_check ipc:///path/to/socket\n";
    return 2;
  }
  namespace kv = mooncake::kv_events;
  kv::Config config;
  config.enable_kv_events = true;
  config.bind_endpoint = argv[1];
  config.backend_id = "installed-check";
  try {
    std::cout << kv::Publisher::create(config)->status_json() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "kv_events_installed_check: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
