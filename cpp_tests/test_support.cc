#include "test_support.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <stdexcept>

namespace kv_events_test {

std::string unique_endpoint() {
  static std::atomic<int> next{0};
  return "ipc:///tmp/kvev-cpp-" + std::to_string(getpid()) + "-" + std::to_string(next++) + ".sock";
}

kv::Config enabled_config() {
  kv::Config config;
  config.enable_kv_events = true;
  config.bind_endpoint = unique_endpoint();
  config.backend_id = "store-a";
  return config;
}

Batch parse(const Message& frames) {
  auto fail = [](const std::string& what) { throw std::runtime_error("message: " + what); };
  if (frames.size() != 3) fail(std::to_string(frames.size()) + " frames, expected 3");
  if (!frames[0].empty()) fail("topic frame is not empty");
  if (frames[1].size() != 8) fail("sequence frame is not 8 bytes");
  Batch batch;
  batch.frames = frames;
  for (unsigned char byte : frames[1]) batch.sequence = (batch.sequence << 8) | byte;
  batch.payload = decode(frames[2]);
  const std::vector<Value>& parts = batch.payload.as_array();
  if (parts.size() != 3) fail("payload is not [timestamp, events, dp_rank]");
  batch.timestamp_ms = parts[0].as_uint();
  batch.events = parts[1].as_array();
  batch.dp_rank = parts[2].as_uint();
  return batch;
}

StreamReader::StreamReader(kv::Publisher& publisher, const std::string& endpoint,
                           const CurveKeys* curve)
    : publisher_(publisher), subscriber_(endpoint, curve) {
  // Setup, not an assertion: the first sequence number a test checks makes a miss visible.
  subscriber_.wait_joined();
}

std::vector<Batch> StreamReader::collect() {
  if (!publisher_.flush(std::chrono::seconds(10))) {
    throw std::runtime_error("flush() did not complete");
  }
  const uint64_t sent = publisher_.stats().published_batches;
  std::vector<Batch> batches;
  while (received_batches_ < sent) {
    auto message = subscriber_.receive(std::chrono::seconds(10));
    if (!message) {
      throw std::runtime_error("message " + std::to_string(received_batches_ + 1) + " of " +
                               std::to_string(sent) + " never arrived");
    }
    batches.push_back(parse(*message));
    ++received_batches_;
  }
  return batches;
}

std::vector<Value> StreamReader::collect_events() { return events_of(collect()); }

Session::Session(const kv::Config& config, const CurveKeys* curve)
    : publisher_(kv::Publisher::create(config)),
      reader_(std::make_unique<StreamReader>(*publisher_, config.bind_endpoint, curve)) {}

std::vector<Value> events_of(const std::vector<Batch>& batches) {
  std::vector<Value> events;
  for (const Batch& batch : batches) {
    events.insert(events.end(), batch.events.begin(), batch.events.end());
  }
  return events;
}

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t length = 0;
    unsigned char low = 0x80, high = 0xbf;  // the range of the second byte
    if (c >= 0xc2 && c <= 0xdf) {
      length = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      length = 3;
      if (c == 0xe0) low = 0xa0;
      if (c == 0xed) high = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      length = 4;
      if (c == 0xf0) low = 0x90;
      if (c == 0xf4) high = 0x8f;
    } else {
      return false;
    }
    if (s.size() - i < length) return false;
    const unsigned char second = static_cast<unsigned char>(s[i + 1]);
    if (second < low || second > high) return false;
    for (size_t k = 2; k < length; ++k) {
      const unsigned char next = static_cast<unsigned char>(s[i + k]);
      if (next < 0x80 || next > 0xbf) return false;
    }
    i += length;
  }
  return true;
}

std::string printable(const std::string& bytes) {
  std::string out;
  for (unsigned char c : bytes) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
  }
  return out;
}

std::string summary(const Value& event) {
  const std::string& type = event.at("event_type").as_str();
  if (type == "cleared") return "cleared " + printable(event.at("tenant_id").bytes());
  return type + " " + event.at("medium").as_str() + " " + printable(event.at("object_key").bytes());
}

std::vector<std::string> summaries(const std::vector<Value>& events) {
  std::vector<std::string> out;
  for (const Value& event : events) out.push_back(summary(event));
  return out;
}

}  // namespace kv_events_test
