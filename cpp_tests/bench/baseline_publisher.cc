#include "baseline_publisher.h"

#include <pthread.h>
#include <zmq.h>

#include <chrono>
#include <stdexcept>
#include <vector>

namespace kv_events_bench {

using mooncake::kv_events::Medium;
using mooncake::kv_events::MediumSet;

void MsgpackWriter::be(uint64_t value, int size) {
  for (int shift = (size - 1) * 8; shift >= 0; shift -= 8) {
    out_.push_back(static_cast<char>((value >> shift) & 0xff));
  }
}

void MsgpackWriter::map(uint32_t size) {
  if (size <= 15) {
    out_.push_back(static_cast<char>(0x80 | size));
  } else if (size <= 0xffff) {
    out_.push_back(static_cast<char>(0xde));
    be(size, 2);
  } else {
    out_.push_back(static_cast<char>(0xdf));
    be(size, 4);
  }
}

void MsgpackWriter::array(uint32_t size) {
  if (size <= 15) {
    out_.push_back(static_cast<char>(0x90 | size));
  } else if (size <= 0xffff) {
    out_.push_back(static_cast<char>(0xdc));
    be(size, 2);
  } else {
    out_.push_back(static_cast<char>(0xdd));
    be(size, 4);
  }
}

void MsgpackWriter::uint(uint64_t value) {
  if (value <= 0x7f) {
    out_.push_back(static_cast<char>(value));
  } else if (value <= 0xff) {
    out_.push_back(static_cast<char>(0xcc));
    be(value, 1);
  } else if (value <= 0xffff) {
    out_.push_back(static_cast<char>(0xcd));
    be(value, 2);
  } else if (value <= 0xffffffffu) {
    out_.push_back(static_cast<char>(0xce));
    be(value, 4);
  } else {
    out_.push_back(static_cast<char>(0xcf));
    be(value, 8);
  }
}

void MsgpackWriter::nil() { out_.push_back(static_cast<char>(0xc0)); }

void MsgpackWriter::str(std::string_view text) {
  const size_t n = text.size();
  if (n <= 31) {
    out_.push_back(static_cast<char>(0xa0 | n));
  } else if (n <= 0xff) {
    out_.push_back(static_cast<char>(0xd9));
    be(n, 1);
  } else if (n <= 0xffff) {
    out_.push_back(static_cast<char>(0xda));
    be(n, 2);
  } else {
    out_.push_back(static_cast<char>(0xdb));
    be(n, 4);
  }
  out_.append(text);
}

void MsgpackWriter::bin(std::string_view bytes) {
  const size_t n = bytes.size();
  if (n <= 0xff) {
    out_.push_back(static_cast<char>(0xc4));
    be(n, 1);
  } else if (n <= 0xffff) {
    out_.push_back(static_cast<char>(0xc5));
    be(n, 2);
  } else {
    out_.push_back(static_cast<char>(0xc6));
    be(n, 4);
  }
  out_.append(bytes);
}

void MsgpackWriter::bytes(std::string_view bytes) {
  if (is_utf8(bytes)) {
    str(bytes);
  } else {
    bin(bytes);
  }
}

void MsgpackWriter::optional_str(std::string_view text) {
  if (text.empty()) {
    nil();
  } else {
    str(text);
  }
}

bool is_utf8(std::string_view bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const auto* end = p + bytes.size();
  while (p < end) {
    const unsigned char c = *p;
    if (c < 0x80) {
      ++p;
      continue;
    }
    int extra;
    uint32_t code;
    if ((c & 0xe0) == 0xc0) {
      extra = 1;
      code = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      extra = 2;
      code = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      extra = 3;
      code = c & 0x07;
    } else {
      return false;
    }
    if (end - p <= extra) return false;
    for (int i = 1; i <= extra; ++i) {
      if ((p[i] & 0xc0) != 0x80) return false;
      code = (code << 6) | (p[i] & 0x3f);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (code < kMin[extra] || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) {
      return false;
    }
    p += extra + 1;
  }
  return true;
}

namespace {

void write_stored(MsgpackWriter& w, const BaselineConfig& c, uint64_t timestamp_ms,
                  const BaselineEvent& e, uint64_t event_id) {
  w.map(20);
  w.str("event_id");
  w.uint(event_id);
  w.str("timestamp");
  w.uint(timestamp_ms);
  w.str("event_type");
  w.str("stored");
  w.str("type");
  w.str("BlockStored");
  w.str("model_name");
  w.optional_str(c.model_name);
  w.str("block_size");
  if (c.block_size == 0) {
    w.nil();
  } else {
    w.uint(c.block_size);
  }
  w.str("additional_salt");
  w.optional_str(c.additional_salt);
  w.str("lora_name");
  w.optional_str(c.lora_name);
  w.str("backend_id");
  w.str(c.backend_id);
  w.str("dp_rank");
  w.uint(c.dp_rank);
  w.str("tenant_id");
  w.bytes(e.tenant.empty() ? std::string_view("default") : std::string_view(e.tenant));
  w.str("medium");
  w.str(e.medium == Medium::kCpu ? "cpu" : "disk");
  w.str("group_id");
  if (e.group.empty()) {
    w.nil();
  } else {
    w.bytes(e.group);
  }
  w.str("object_key");
  w.bytes(e.key);
  w.str("seq_hashes");
  w.array(0);
  w.str("block_hashes");
  w.array(0);
  w.str("base_block_idx");
  w.nil();
  w.str("token_ids");
  w.nil();
  w.str("parent_hash");
  w.nil();
  w.str("parent_block_hash");
  w.nil();
}

uint64_t now_ms() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace

void write_baseline_batch(MsgpackWriter& writer, const BaselineConfig& config,
                          uint64_t timestamp_ms, const BaselineEvent* events, size_t count,
                          uint64_t& next_id) {
  writer.clear();
  writer.array(3);
  writer.uint(timestamp_ms);
  writer.array(static_cast<uint32_t>(count));
  for (size_t i = 0; i < count; ++i)
    write_stored(writer, config, timestamp_ms, events[i], next_id++);
  writer.uint(config.dp_rank);
}

BaselinePublisher::BaselinePublisher(BaselineConfig config) : config_(std::move(config)) {
  context_ = zmq_ctx_new();
  socket_ = zmq_socket(context_, ZMQ_PUB);
  const int linger = 1000;
  char endpoint[256] = {};
  size_t endpoint_size = sizeof endpoint;
  if (zmq_setsockopt(socket_, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
      zmq_bind(socket_, config_.bind_endpoint.c_str()) != 0 ||
      zmq_getsockopt(socket_, ZMQ_LAST_ENDPOINT, endpoint, &endpoint_size) != 0) {
    const std::string error = zmq_strerror(zmq_errno());
    zmq_close(socket_);
    zmq_ctx_term(context_);
    throw std::runtime_error("baseline publisher on " + config_.bind_endpoint + ": " + error);
  }
  endpoint_ = endpoint;
  worker_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "baseline-pub");
    run();
  });
}

BaselinePublisher::~BaselinePublisher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  ready_.notify_one();
  worker_.join();
  zmq_close(socket_);
  zmq_ctx_term(context_);
}

void BaselinePublisher::on_put_commit(std::string_view tenant, std::string_view key,
                                      std::string_view group, MediumSet media) noexcept {
  if (media.empty()) return;
  try {
    // The events are built before the lock is taken, as a careful caller would.
    BaselineEvent events[2];
    int count = 0;
    for (Medium medium : {Medium::kCpu, Medium::kDisk}) {
      if (media.contains(medium)) {
        events[count++] =
            BaselineEvent{std::string(tenant), std::string(key), std::string(group), medium};
      }
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (int i = 0; i < count; ++i) {
        if (queue_.size() >= config_.capacity) {
          queue_.pop_front();
          ++dropped_;
        }
        queue_.push_back(std::move(events[i]));
      }
    }
    ready_.notify_one();
  } catch (...) {
    // bad_alloc: the call is lost, as the library's contract allows.
  }
}

bool BaselinePublisher::flush(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (queue_.empty() && !busy_) return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

uint64_t BaselinePublisher::next_sequence() {
  std::lock_guard<std::mutex> lock(mutex_);
  return next_sequence_;
}

uint64_t BaselinePublisher::published_events() {
  std::lock_guard<std::mutex> lock(mutex_);
  return published_;
}

uint64_t BaselinePublisher::dropped_events() {
  std::lock_guard<std::mutex> lock(mutex_);
  return dropped_;
}

uint64_t BaselinePublisher::queue_depth() {
  std::lock_guard<std::mutex> lock(mutex_);
  return queue_.size() + in_flight_;
}

void BaselinePublisher::run() {
  std::deque<BaselineEvent> taken;
  std::vector<BaselineEvent> batch;
  batch.reserve(64);
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    ready_.wait(lock, [this] { return !queue_.empty() || stopping_; });
    if (queue_.empty()) break;  // stopping, and everything is sent
    taken.swap(queue_);
    busy_ = true;
    in_flight_ = taken.size();
    const uint64_t dropped = dropped_;
    lock.unlock();

    // Dropped events reserve their sequence numbers: the next message shows the gap.
    next_ += dropped - dropped_seen_;
    dropped_seen_ = dropped;
    uint64_t sent = 0;
    while (!taken.empty()) {
      batch.clear();
      while (!taken.empty() && batch.size() < 64) {
        batch.push_back(std::move(taken.front()));
        taken.pop_front();
      }
      send(batch.data(), batch.size());
      sent += batch.size();
    }

    lock.lock();
    busy_ = false;
    in_flight_ = 0;
    published_ += sent;
    next_sequence_ = next_;
  }
}

void BaselinePublisher::send(const BaselineEvent* events, size_t count) {
  write_baseline_batch(writer_, config_, now_ms(), events, count, next_event_id_);
  const uint64_t number = next_++;
  unsigned char sequence[8];
  for (int i = 0; i < 8; ++i) sequence[i] = static_cast<unsigned char>(number >> (56 - 8 * i));
  zmq_send(socket_, "", 0, ZMQ_SNDMORE);
  zmq_send(socket_, sequence, sizeof sequence, ZMQ_SNDMORE);
  zmq_send(socket_, writer_.out().data(), writer_.out().size(), 0);
}

}  // namespace kv_events_bench
