// The benchmark's subscriber: a separate process (this program re-executed with
// `--subscriber ENDPOINT [--rcvhwm N] [--curve SERVER_PUBLIC PUBLIC SECRET]`) with a ZeroMQ SUB
// socket on the libzmq C API and, unless told otherwise, a large receive high-water mark. It
// counts messages, events (read from the payload's array header) and sequence gaps, and
// answers the parent over a pipe, one text line per command:
//
//   child -> parent  JOINED                  the first message arrived
//   parent -> child  SYNC <next>             receive every sequence below <next>, then zero
//                                            the counts
//   child -> parent  SYNCED <0|1>            (0: gave up after 1 s without a message)
//   parent -> child  PAUSE <ms>              stop reading the socket for <ms> milliseconds
//   parent -> child  REPORT <next> [<ms>]    receive every sequence below <next> (or until
//                                            nothing came for <ms>, default 1000), then report
//                                            (counts stay)
//   child -> parent  COUNTS <fields...>      see SubscriberCounts
//   parent -> child  QUIT, or end of input   exit 0
//
// <next> is a publisher's next sequence: its messages are numbered from 0, so every one it
// sent is below it.
//
// Its CPU time is its own: the publisher process's getrusage never includes it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace kv_events_bench {

// How a subscriber process connects.
struct SubscriberOptions {
  SubscriberOptions() = default;
  explicit SubscriberOptions(std::string to) : endpoint(std::move(to)) {}

  std::string endpoint;
  // Messages its SUB socket holds: large enough by default that a loss is the publisher's.
  int rcvhwm = 200000;
  // CURVE keys (Z85), all three or none: the publisher's public key, this subscriber's pair.
  std::string server_public, public_key, secret_key;

  // The command line after the program's name: --subscriber ENDPOINT ...
  std::vector<std::string> arguments() const;
  // Parses what arguments() wrote (argv after the program's name); false when it is not that.
  bool parse(int argc, char** argv);
};

// The subscriber process's main: returns its exit status.
int run_subscriber(const SubscriberOptions& options);

// What the subscriber received since its last SYNC.
struct SubscriberCounts {
  bool ok = false;             // a reply arrived and parsed
  uint64_t messages = 0;       // three-frame messages
  uint64_t events = 0;         // events in their payloads
  uint64_t missing = 0;        // sequence numbers skipped (events dropped, messages lost)
  uint64_t restarts = 0;       // sequences that went backwards
  uint64_t bad = 0;            // messages that were not three frames with an 8-byte sequence
  uint64_t payload_bytes = 0;  // sum of payload sizes
  uint64_t max_payload = 0;    // largest payload
  uint64_t next_sequence = 0;  // one past the last sequence received (0: none yet)
  uint64_t first_ns = 0;       // CLOCK_MONOTONIC of the first and last message received
  uint64_t last_ns = 0;

  // Events per second between the first and the last message.
  double delivered_per_second() const;
};

// A subscriber process, started on construction and asked to quit on destruction.
class SubscriberProcess {
 public:
  SubscriberProcess(const std::string& self_exe, const SubscriberOptions& options);
  ~SubscriberProcess();
  SubscriberProcess(const SubscriberProcess&) = delete;
  SubscriberProcess& operator=(const SubscriberProcess&) = delete;

  // Calls `probe` (which should publish one message) every 10 ms until the subscriber says
  // it received one: ZeroMQ subscriptions take effect a little after connect.
  bool wait_joined(const std::function<void()>& probe, std::chrono::milliseconds timeout);

  // Lets the subscriber take every sequence below `next`, then zero its counts.
  bool sync(uint64_t next);

  // What the subscriber received since the last sync, once it has every sequence below
  // `next` (or after `give_up` without any message).
  SubscriberCounts report(uint64_t next,
                          std::chrono::milliseconds give_up = std::chrono::seconds(1));

  // Makes the subscriber stop reading its socket for `duration` (it answers nothing).
  bool pause(std::chrono::milliseconds duration);

  pid_t pid() const { return pid_; }

 private:
  bool send_line(const std::string& line);
  // One line from the child without its newline, or "" after `timeout`.
  std::string read_line(std::chrono::milliseconds timeout);

  pid_t pid_ = -1;
  int to_child_ = -1;
  int from_child_ = -1;
  std::string buffer_;
};

}  // namespace kv_events_bench
