// A ZeroMQ SUB socket for the tests, on the libzmq C API: it reads the publisher's stream as
// any subscriber would, message by message, with a receive timeout.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace kv_events_test {

// One multipart message: its frames, in order.
using Message = std::vector<std::string>;

// The keys of a CURVE subscriber, each 40 characters of Z85.
struct CurveKeys {
  std::string server_public;  // the publisher's public key
  std::string public_key;     // this subscriber's
  std::string secret_key;     // this subscriber's
};

class Subscriber {
 public:
  // Connects to `endpoint` and subscribes to everything, with a receive high-water mark
  // large enough that no test message is dropped on this side; as a CURVE client with
  // `curve`'s keys when given.
  explicit Subscriber(const std::string& endpoint, const CurveKeys* curve = nullptr);
  ~Subscriber();
  Subscriber(const Subscriber&) = delete;
  Subscriber& operator=(const Subscriber&) = delete;

  // Returns once the subscription has reached the publisher, so that the next message it
  // sends is delivered (ZeroMQ's slow joiner). Waits for the connection's handshake (throws
  // if none within 10 s), then a margin for the subscription to cross to the PUB socket.
  void wait_joined();

  // The next message, or nothing when none arrives within `timeout`.
  std::optional<Message> receive(std::chrono::milliseconds timeout);

  // Every message that arrives until none comes for `quiet`.
  std::vector<Message> receive_all(std::chrono::milliseconds quiet);

 private:
  void* context_;
  void* socket_;
  void* monitor_;  // PAIR receiving the handshake event; null once wait_joined() returned
};

// A DEALER on the publisher's replay socket (kv_events_replay_endpoint), as an indexer
// would use it: requests are the frames as the protocol writes them, the empty one first.
class ReplayClient {
 public:
  explicit ReplayClient(const std::string& endpoint);
  ~ReplayClient();
  ReplayClient(const ReplayClient&) = delete;
  ReplayClient& operator=(const ReplayClient&) = delete;

  void send(const Message& request);
  // The next reply, or nothing when none arrives within `timeout`.
  std::optional<Message> receive(std::chrono::milliseconds timeout);

 private:
  void* context_;
  void* socket_;
};

}  // namespace kv_events_test
