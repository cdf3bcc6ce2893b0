// What the ON suites share: a publisher on a private endpoint with a subscriber joined to it,
// and the stream it reads, decoded.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mooncake/kv_events.h"
#include "msgpack_reader.h"
#include "subscriber.h"

namespace kv_events_test {

namespace kv = mooncake::kv_events;

// An ipc endpoint no other test (or test process) uses.
std::string unique_endpoint();

// An enabled config on a fresh endpoint, backend "store-a", every other field default.
kv::Config enabled_config();

// One message of the stream, checked for shape and decoded.
struct Batch {
  std::vector<std::string> frames;  // exactly as received
  uint64_t sequence = 0;            // frame 2, big-endian
  Value payload;                    // frame 3, decoded
  uint64_t timestamp_ms = 0;        // payload[0]
  std::vector<Value> events;        // payload[1]
  uint64_t dp_rank = 0;             // payload[2]
};

// Decodes `frames`; throws std::runtime_error when they are not three frames with an 8-byte
// sequence and a payload [uint, array, uint].
Batch parse(const Message& frames);

// A subscriber joined to a publisher that someone else owns (a master), reading exactly what
// the publisher has sent.
class StreamReader {
 public:
  // Connects to `endpoint`, where `publisher` is bound, and waits until the subscription has
  // reached it, so that its next message is received. `publisher` must outlive the reader.
  // With `curve`, the subscriber is a CURVE client with those keys.
  StreamReader(kv::Publisher& publisher, const std::string& endpoint,
               const CurveKeys* curve = nullptr);

  Subscriber& subscriber() { return subscriber_; }

  // Flushes the publisher, then receives exactly the messages it has sent since the last
  // collect(): no timing decides where the stream ends. Throws when flush() fails or a
  // message does not arrive within a generous bound.
  std::vector<Batch> collect();
  // The events of collect(), in stream order.
  std::vector<Value> collect_events();

 private:
  kv::Publisher& publisher_;
  Subscriber subscriber_;
  uint64_t received_batches_ = 0;
};

// A publisher and a subscriber that has joined it, so that its first message is received.
class Session {
 public:
  // Creates the publisher from `config` (its endpoint is used as given); with `curve`, the
  // subscriber is a CURVE client with those keys.
  explicit Session(const kv::Config& config = enabled_config(), const CurveKeys* curve = nullptr);

  kv::Publisher& publisher() { return *publisher_; }
  Subscriber& subscriber() { return reader_->subscriber(); }

  // StreamReader::collect() and collect_events() of the session's publisher.
  std::vector<Batch> collect() { return reader_->collect(); }
  std::vector<Value> collect_events() { return reader_->collect_events(); }

 private:
  std::unique_ptr<kv::Publisher> publisher_;
  std::unique_ptr<StreamReader> reader_;
};

// The events of `batches`, in stream order.
std::vector<Value> events_of(const std::vector<Batch>& batches);

// Whether `s` is UTF-8 as Rust's std::str::from_utf8 accepts it (no overlong forms, no
// surrogates, nothing above U+10FFFF), which decides whether a string is published as is or as
// `non_utf8` says.
bool valid_utf8(const std::string& s);

// `bytes` with every byte that is not printable ASCII (and the backslash) written as \xNN.
std::string printable(const std::string& bytes);

// "stored cpu <key>", "removed disk <key>", "cleared <tenant>": one line per event, for
// comparing whole streams. Non-printable bytes are written as \xNN.
std::string summary(const Value& event);
std::vector<std::string> summaries(const std::vector<Value>& events);

}  // namespace kv_events_test
