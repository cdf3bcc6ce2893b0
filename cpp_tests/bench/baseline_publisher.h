// The baseline the benchmark compares the library with, written for it: the usual C++ design
// of a KV event publisher, measured in the same run as the library.
//
//   caller   copies tenant, key and group into std::strings, locks one mutex, pushes onto one
//            std::deque (dropping the oldest past `capacity`), unlocks, and notifies one
//            condition variable: one notify per call;
//   worker   waits on the condition variable, takes the whole deque under the lock, and
//            writes each batch of up to 64 events as msgpack key by key (MsgpackWriter, no
//            pre-encoded parts), then sends it as the three-frame message of docs/spec.md section 5
//            on its own ZeroMQ PUB socket.
//
// The event map is the same as the library's `stored` with legacy fields (20 keys, same order,
// same values for the same config), so both send payloads of the same size. The design is
// given its best form (the worker holds the lock only to swap the deque out) so that the
// comparison is with the design, not with a careless copy of it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "mooncake/kv_events.h"

namespace kv_events_bench {

// Appends msgpack values to a byte string, each in its smallest encoding.
class MsgpackWriter {
 public:
  void map(uint32_t size);
  void array(uint32_t size);
  void uint(uint64_t value);
  void nil();
  void str(std::string_view text);
  void bin(std::string_view bytes);
  // `str` when the bytes are valid UTF-8, `bin` otherwise (as the library does).
  void bytes(std::string_view bytes);
  void optional_str(std::string_view text);  // empty: nil

  std::string& out() { return out_; }
  void clear() { out_.clear(); }

 private:
  void be(uint64_t value, int size);
  std::string out_;
};

bool is_utf8(std::string_view bytes);

// The fixed context of the baseline, as the library's Config.
struct BaselineConfig {
  std::string bind_endpoint = "tcp://127.0.0.1:*";
  std::string backend_id;
  std::string model_name;
  uint32_t block_size = 0;
  std::string additional_salt;
  std::string lora_name;
  uint32_t dp_rank = 0;
  size_t capacity = 65536;  // events held before the oldest is dropped
};

// One `stored` event, owned.
struct BaselineEvent {
  std::string tenant;
  std::string key;
  std::string group;
  mooncake::kv_events::Medium medium;
};

// Writes one batch `[timestamp_ms, [event...], dp_rank]` key by key; event ids from `next_id`.
void write_baseline_batch(MsgpackWriter& writer, const BaselineConfig& config,
                          uint64_t timestamp_ms, const BaselineEvent* events, size_t count,
                          uint64_t& next_id);

class BaselinePublisher {
 public:
  // Binds the PUB socket (throws std::runtime_error) and starts the worker.
  explicit BaselinePublisher(BaselineConfig config);
  // Sends what is queued, then stops the worker.
  ~BaselinePublisher();
  BaselinePublisher(const BaselinePublisher&) = delete;
  BaselinePublisher& operator=(const BaselinePublisher&) = delete;

  // `stored` for each medium of `media`, cpu first.
  void on_put_commit(std::string_view tenant, std::string_view key, std::string_view group,
                     mooncake::kv_events::MediumSet media) noexcept;

  // Waits until everything queued is sent: true unless `timeout` passed first.
  bool flush(std::chrono::milliseconds timeout);

  const std::string& endpoint() const { return endpoint_; }
  // The sequence of the next message (the first is 0, as the library's): every number below
  // it was taken, by a message or by dropped events.
  uint64_t next_sequence();
  uint64_t published_events();
  uint64_t dropped_events();
  uint64_t queue_depth();

 private:
  void run();
  void send(const BaselineEvent* events, size_t count);

  BaselineConfig config_;
  std::string endpoint_;
  void* context_ = nullptr;
  void* socket_ = nullptr;

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<BaselineEvent> queue_;  // guarded by mutex_
  bool stopping_ = false;            // guarded by mutex_
  bool busy_ = false;                // guarded by mutex_: the worker holds taken events
  uint64_t dropped_ = 0;             // guarded by mutex_
  uint64_t next_sequence_ = 0;       // guarded by mutex_
  uint64_t published_ = 0;           // guarded by mutex_
  uint64_t in_flight_ = 0;           // guarded by mutex_: events the worker took, not yet sent

  // Worker only.
  uint64_t next_ = 0;  // the sequence the next message takes
  uint64_t dropped_seen_ = 0;
  uint64_t next_event_id_ = 1;
  MsgpackWriter writer_;

  std::thread worker_;
};

}  // namespace kv_events_bench
