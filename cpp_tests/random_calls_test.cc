// docs/spec.md section 3 under random calls from several threads at once: each thread makes a long,
// seeded sequence of random calls with hostile bytes, and the decoded stream is checked against
// a model of what each call emits, under each `non_utf8` mode (skip, the default: a call with a
// string that is not UTF-8 publishes nothing and is counted; bin; str) and with
// `reannounce_remaining`.
//
// Each thread tags its keys ("k<thread>/...") and owns a few tenants of its own for RemoveAll,
// so that the events of one thread can be picked out of the stream and compared, in order, with
// what the model of that thread expects, whatever the interleaving of the threads.
//
// Reproduce a failure with the seed it prints (each thread's calls depend on it alone):
//   KV_EVENTS_RANDOM_SEED=<seed> build/on/kv_events_random_calls_test
// KV_EVENTS_RANDOM_CALLS sets the calls per thread (default 3000; the valgrind run uses fewer).

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "test_support.h"

namespace {

using namespace kv_events_test;
using kv::Medium;
using kv::MediumSet;

constexpr int kThreads = 4;
constexpr uint64_t kDefaultCallsPerThread = 3000;
constexpr uint32_t kCapacity = 65536;
constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

uint64_t env_or(const char* name, uint64_t fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::strtoull(value, nullptr, 10) : fallback;
}

// Bytes for a failure message: printable, and cut short when long.
std::string shown(const std::string& bytes) {
  std::string out = kv_events_test::printable(bytes.substr(0, 48));
  if (bytes.size() > 48) out += "...(" + std::to_string(bytes.size()) + " bytes)";
  return out;
}

// What the publisher's config changes in what each call emits.
struct Policy {
  std::string non_utf8 = "skip";      // "skip", "bin" or "str"
  bool reannounce_remaining = false;  // a removal stores every medium left
  bool emit_object_key = true;

  bool skip() const { return non_utf8 == "skip"; }
  kv::Config apply(kv::Config config) const {
    config.non_utf8 = non_utf8;
    config.reannounce_remaining = reannounce_remaining;
    config.emit_object_key = emit_object_key;
    return config;
  }
};

// One event the model expects, with the fields a call decides.
struct Expected {
  std::string type;       // "stored", "removed" or "cleared"
  std::string medium;     // "cpu" or "disk"; empty for cleared
  std::string tenant;     // as on the wire: an empty tenant is "default"
  std::string key;        // stored/removed only
  std::string group;      // stored/removed only; empty is nil
  bool optional = false;  // a cleared the rules allow but do not require (see Caller)
  uint64_t call = 0;      // which call of its thread made it

  std::string describe() const {
    if (type == "cleared") {
      return std::string(optional ? "(optional) " : "") + "cleared tenant=" + shown(tenant);
    }
    return type + " " + medium + " tenant=" + shown(tenant) + " key=" + shown(key) +
           " group=" + shown(group);
  }
};

std::string describe(const Value& event) {
  const std::string type = event.at("event_type").as_str();
  const std::string tenant = shown(event.at("tenant_id").bytes());
  if (type == "cleared") return "cleared tenant=" + tenant;
  const Value& group = event.at("group_id");
  return type + " " + event.at("medium").as_str() + " tenant=" + tenant +
         " key=" + shown(event.at("object_key").bytes()) +
         " group=" + (group.is_nil() ? std::string("nil") : shown(group.bytes()));
}

// Whether `value` carries exactly `bytes`, as `str` when they are UTF-8 and otherwise as
// `non_utf8` says (`bin`, or a `str` of the raw bytes).
bool same_bytes(const Value& value, const std::string& bytes, const Policy& policy) {
  const Value::Type type =
      valid_utf8(bytes) || policy.non_utf8 == "str" ? Value::Type::kStr : Value::Type::kBin;
  return value.type() == type && value.bytes() == bytes;
}

// Why `event` is not `expected`; empty when it is.
std::string mismatch(const Value& event, const Expected& expected, const Policy& policy) {
  const Value* type = event.find("event_type");
  if (type == nullptr || type->type() != Value::Type::kStr || type->as_str() != expected.type) {
    return "event type";
  }
  static const std::map<std::string, std::pair<std::string, size_t>> kLegacy = {
      {"stored", {"BlockStored", 20}},
      {"removed", {"BlockRemoved", 17}},
      {"cleared", {"AllBlocksCleared", 12}}};
  const auto& [legacy_type, keys] = kLegacy.at(expected.type);
  if (event.as_map().size() != keys) return "number of keys";
  if (event.at("type").as_str() != legacy_type) return "legacy type";
  if (!same_bytes(event.at("tenant_id"), expected.tenant, policy)) return "tenant_id";
  if (event.at("backend_id").as_str() != "store-a") return "backend_id";
  if (expected.type == "cleared") {
    if (!event.at("medium").is_nil()) return "medium";
    return "";
  }
  if (event.at("medium").as_str() != expected.medium) return "medium";
  if (!same_bytes(event.at("object_key"), expected.key, policy)) return "object_key";
  const Value& group = event.at("group_id");
  if (expected.group.empty() ? !group.is_nil() : !same_bytes(group, expected.group, policy)) {
    return "group_id";
  }
  return "";
}

// The tag of thread `thread`'s keys: "k<digit>/"; no tag is a prefix of another.
std::string tag_of(int thread) { return "k" + std::to_string(thread) + "/"; }

// The tenants only thread `thread` touches; RemoveAll results with allowed counts name only
// these, so whether a medium was added since the scan began is decided by that thread alone.
std::vector<std::string> own_tenants(int thread) {
  const std::string n = std::to_string(thread);
  return {"own-" + n, "own\xff" + n, std::string("own\0", 4) + n, "\xce\xa9own-" + n,
          std::string(300, 'o') + n};
}

// Tenants every thread uses: the same bytes from several threads, the empty tenant and the
// one it stands for, bytes that are not UTF-8, NULs, long ones.
const std::vector<std::string> kSharedTenants = {
    "", "default", "shared", "\xff\xfe", std::string("t\0n", 3), "\xc3\xbc", std::string(300, 'T')};

// The events of one (stored/removed) medium set difference, cpu before disk.
std::vector<const char*> media_of(MediumSet set) {
  std::vector<const char*> out;
  if (set.contains(Medium::kCpu)) out.push_back("cpu");
  if (set.contains(Medium::kDisk)) out.push_back("disk");
  return out;
}

MediumSet minus(MediumSet a, MediumSet b) {
  return MediumSet::from_bits(static_cast<uint8_t>(a.bits() & ~b.bits()));
}

// One thread's random calls and the model of what they emit.
class Caller {
 public:
  // `alone`: no other thread begins scans, so none of this thread's can be forgotten and
  // every allowed `cleared` is required.
  Caller(kv::Publisher& publisher, int thread, uint64_t seed, const Policy& policy, bool alone)
      : publisher_(publisher),
        policy_(policy),
        alone_(alone),
        rng_(seed * kThreads + static_cast<uint64_t>(thread)),
        tag_(tag_of(thread)),
        own_(own_tenants(thread)) {}

  // Makes `calls` calls (each of the four API calls counts as one).
  void run(uint64_t calls) {
    while (calls_ < calls) {
      if (chance(8)) {
        remove_all(calls);
      } else {
        mutation();
      }
    }
  }

  std::vector<Expected> expected;   // in call order
  uint64_t skipped_keyless = 0;     // stored/removed suppressed for an empty key
  uint64_t skipped_non_utf8 = 0;    // events of calls with a string not UTF-8, under skip
  uint64_t cleared_skipped = 0;     // of those, the allowed `cleared` of such tenants
  uint64_t invalid_media = 0;       // Put commits with no medium
  uint64_t remove_all_results = 0;  // on_remove_all calls
  uint64_t cleared_allowed = 0;     // of those, the ones the rules let emit `cleared`
  uint64_t records = 0;             // queue slots the calls took, at most

 private:
  struct Mutation {
    bool put = true;
    std::string tenant, key, group;
    MediumSet before, after;  // a put: {} and its media
  };

  uint64_t below(uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng_); }
  bool chance(uint64_t percent) { return below(100) < percent; }
  template <typename T>
  const T& pick(const std::vector<T>& from) {
    return from[below(from.size())];
  }

  std::string random_bytes(size_t n) {
    std::string out(n, '\0');
    for (char& c : out) c = static_cast<char>(below(256));
    return out;
  }

  std::string ascii(size_t n) {
    std::string out(n, ' ');
    for (char& c : out) c = static_cast<char>(0x20 + below(0x5f));
    return out;
  }

  // A key's bytes after the tag: printable, random, UTF-8 text, broken UTF-8, NULs, a few
  // hundred bytes, one seen before, or (rarely) about 64 KiB, around the 16-bit length limit.
  std::string key_body() {
    static const std::vector<std::string> kText = {
        "a", "/", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9d\x84\x9e", std::string(1, '\0')};
    static const std::vector<std::string> kBroken = {"\xff",         "\x80",     "\xc0\xaf",
                                                     "\xed\xa0\x80", "\xe2\x82", "\xf4\x90\x80\x80",
                                                     "\xf0\x9f\x98", "\xc3"};
    switch (below(8)) {
      case 0: return ascii(below(41));
      case 1: return random_bytes(below(301));
      case 2: {
        std::string out;
        for (uint64_t n = below(30); n > 0; --n) out += pick(kText);
        return out;
      }
      case 3: return ascii(below(5)) + pick(kBroken) + ascii(below(5));
      case 4: return chance(50) ? std::string(1 + below(20), '\0') : std::string("a\0b\0", 4);
      case 5: return random_bytes(200 + below(300));
      case 6:
        if (!keys_.empty()) return pick(keys_);
        return "";
      default:
        if (chance(3)) {
          // Total key sizes 65535..65537: both sides of the str16/bin16 limit.
          const size_t size = 65535 + below(3) - tag_.size();
          return chance(50) ? ascii(size) : random_bytes(size);
        }
        return "";
    }
  }

  std::string key() {
    if (chance(5)) return "";
    std::string body = key_body();
    if (body.size() < 1000 && keys_.size() < 64) keys_.push_back(body);
    return tag_ + body;
  }

  std::string group() {
    static const std::vector<std::string> kGroups = {
        "", "", "g", "\x80\x81", std::string("g\0g", 3), "gr\xc3\xbcppe", std::string(300, 'G')};
    return chance(10) ? random_bytes(below(50)) : pick(kGroups);
  }

  std::string mutation_tenant() { return chance(40) ? pick(own_) : pick(kSharedTenants); }

  MediumSet media() { return MediumSet::from_bits(static_cast<uint8_t>(below(4))); }

  static std::string wire_tenant(const std::string& tenant) {
    return tenant.empty() ? "default" : tenant;
  }

  // A Put commit or a delta (sometimes the previous one again), and its model.
  void mutation() {
    Mutation m;
    if (last_ && chance(5)) {
      m = *last_;
    } else {
      m.put = chance(50);
      m.tenant = mutation_tenant();
      m.key = key();
      m.group = group();
      m.before = m.put ? MediumSet() : media();
      m.after = media();
    }
    const uint64_t call = calls_++;
    if (m.put && m.after.empty()) ++invalid_media;
    if (m.put) {
      publisher_.on_put_commit(m.tenant, m.key, m.group, m.after);
    } else {
      publisher_.on_medium_delta(m.tenant, m.key, m.group, m.before, m.after);
    }
    const MediumSet removed = minus(m.before, m.after);
    // With reannounce_remaining, a call that removes a medium stores every medium left.
    const MediumSet stored =
        policy_.reannounce_remaining && !removed.empty() ? m.after : minus(m.after, m.before);
    std::vector<Expected> events;
    for (const char* medium : media_of(removed)) {
      events.push_back({"removed", medium, wire_tenant(m.tenant), m.key, m.group, false, call});
    }
    for (const char* medium : media_of(stored)) {
      events.push_back({"stored", medium, wire_tenant(m.tenant), m.key, m.group, false, call});
    }
    if (m.key.empty() || !policy_.emit_object_key) {
      skipped_keyless += events.size();
    } else if (!events.empty()) {
      ++records;
      if (policy_.skip() && !(valid_utf8(m.tenant) && valid_utf8(m.key) && valid_utf8(m.group))) {
        // Skipped by the publishing thread: nothing published, and nothing a `cleared`
        // could wipe, so no obstacle to one either.
        skipped_non_utf8 += events.size();
      } else {
        expected.insert(expected.end(), events.begin(), events.end());
        // A call that adds a medium to an own tenant (a reannounced one too) forbids `cleared`
        // for it to every scan taken before. A keyless call emits no `stored`, so there is
        // nothing for a `cleared` to wipe; docs/spec.md section 3 does not say whether it
        // counts, and the model allows either.
        if (!stored.empty()) last_added_[wire_tenant(m.tenant)] = call;
      }
    }
    last_ = m;
  }

  uint64_t removed_count() {
    static const std::vector<uint64_t> kCounts = {0, 1, 2, kMax, kMax - 1, uint64_t{1} << 63};
    return chance(50) ? pick(kCounts) : below(100000);
  }

  uint64_t skipped_count() {
    if (chance(70)) return 0;
    static const std::vector<uint64_t> kCounts = {1, 2, kMax, kMax - 1, uint64_t{1} << 63};
    return chance(50) ? pick(kCounts) : 1 + below(1000);
  }

  // A RemoveAll: its token, a few calls during its loop, then one result per tenant; now and
  // then a result for an older scan or for the token of no scan.
  void remove_all(uint64_t budget) {
    const kv::RemoveAllScan scan = publisher_.begin_remove_all();
    const uint64_t began = calls_++;
    ++records;
    scans_.push_back({scan, began});
    for (uint64_t n = below(6); n > 0 && calls_ < budget; --n) mutation();
    for (uint64_t n = 1 + below(3); n > 0 && calls_ < budget; --n) {
      std::pair<kv::RemoveAllScan, uint64_t> token = scans_.back();
      if (chance(10)) token = pick(scans_);
      if (chance(5)) token = {kv::RemoveAllScan(), 0};
      const bool own = chance(75);
      const std::string tenant = own ? pick(own_) : pick(kSharedTenants);
      uint64_t removed = removed_count();
      uint64_t skipped = skipped_count();
      // A shared tenant's `cleared` could not be told apart from another thread's: give it
      // only results the rules forbid to clear.
      if (!own && removed != 0 && skipped == 0) skipped = chance(50) ? 1 : kMax;
      const uint64_t call = calls_++;
      publisher_.on_remove_all(token.first, tenant, removed, skipped);
      ++remove_all_results;
      if (removed == 0 || skipped != 0) continue;  // forbidden: the publisher must stay silent
      ++records;
      if (policy_.skip() && !valid_utf8(tenant)) {
        // Skipped by the publishing thread whatever the scan: counted, never suppressed.
        ++skipped_non_utf8;
        ++cleared_skipped;
        continue;
      }
      const auto added = last_added_.find(wire_tenant(tenant));
      if (token.first.id() == 0 || (added != last_added_.end() && added->second > token.second)) {
        continue;  // forbidden: no scan, or a medium was added since it began
      }
      // Allowed. Required when this thread is alone: it keeps its last 9 scans, and the
      // publisher remembers its latest 64. With other threads it is not: their scans may have
      // pushed this one out of those 64 (a preempted thread's window can see hundreds), and
      // then the publisher suppresses, which is safe.
      ++cleared_allowed;
      expected.push_back({"cleared", "", wire_tenant(tenant), "", "", !alone_, call});
    }
    if (scans_.size() > 8) scans_.erase(scans_.begin());
  }

  kv::Publisher& publisher_;
  const Policy policy_;
  const bool alone_;
  std::mt19937_64 rng_;
  const std::string tag_;
  const std::vector<std::string> own_;
  uint64_t calls_ = 0;
  std::vector<std::string> keys_;                              // bodies to reuse
  std::vector<std::pair<kv::RemoveAllScan, uint64_t>> scans_;  // token, call it began at
  std::map<std::string, uint64_t> last_added_;                 // own tenant -> call
  std::optional<Mutation> last_;
};

// Receives the stream while the callers run, so that no ZeroMQ buffer has to hold all of it.
class Reader {
 public:
  explicit Reader(Subscriber& subscriber) : thread_([this, &subscriber] { run(subscriber); }) {}
  ~Reader() {
    if (thread_.joinable()) finish(0);
  }

  // Waits for the first `count` messages (or for 30 s without one) and returns what came.
  std::vector<Message> finish(uint64_t count) {
    target_.store(count);
    thread_.join();
    return std::move(messages_);
  }

 private:
  void run(Subscriber& subscriber) {
    int silent_polls = 0;
    while (messages_.size() < target_.load()) {
      std::optional<Message> message = subscriber.receive(std::chrono::milliseconds(200));
      if (message) {
        messages_.push_back(std::move(*message));
      } else if (target_.load() != kUnknown && ++silent_polls >= 150) {
        return;  // the rest never arrives: the caller reports what is missing
      }
    }
  }

  static constexpr uint64_t kUnknown = std::numeric_limits<uint64_t>::max();
  std::atomic<uint64_t> target_{kUnknown};
  std::vector<Message> messages_;
  std::thread thread_;  // last: starts once the members above exist
};

struct Outcome {
  uint64_t events = 0;
  uint64_t cleared = 0;
  uint64_t skipped_non_utf8 = 0;
};

// Runs `threads` callers of `calls` calls each against one publisher with `policy` and checks
// the stream against their models.
Outcome run_and_check(uint64_t seed, int threads, uint64_t calls, const Policy& policy) {
  kv::Config config = enabled_config();
  config.queue_capacity = kCapacity;
  config = policy.apply(config);
  Session session(config);
  kv::Publisher& publisher = session.publisher();

  std::vector<Caller> callers;
  callers.reserve(threads);
  for (int t = 0; t < threads; ++t) {
    callers.emplace_back(publisher, t, seed, policy, threads == 1);
  }
  Reader reader(session.subscriber());
  {
    std::vector<std::thread> running;
    for (Caller& caller : callers) running.emplace_back([&caller, calls] { caller.run(calls); });
    for (std::thread& thread : running) thread.join();
  }
  EXPECT_TRUE(publisher.flush(std::chrono::seconds(60)));
  const kv::Stats stats = publisher.stats();
  const std::vector<Message> messages = reader.finish(stats.published_batches);
  Outcome outcome;
  if (messages.size() != stats.published_batches) {
    ADD_FAILURE() << "received " << messages.size() << " of " << stats.published_batches
                  << " messages";
    return outcome;
  }

  // The stream as a whole: sequence and event_id +1 with no gap, batches of 1 to 64 events
  // sharing their timestamp.
  std::vector<Value> events;
  std::vector<size_t> batch_of;  // per event
  for (size_t b = 0; b < messages.size(); ++b) {
    const Batch batch = parse(messages[b]);
    EXPECT_EQ(batch.sequence, b) << "a gap before message " << b << " (the first is 0)";
    EXPECT_GE(batch.events.size(), 1u);
    EXPECT_LE(batch.events.size(), 64u);
    for (const Value& event : batch.events) {
      EXPECT_EQ(event.at("timestamp").as_uint(), batch.timestamp_ms);
      EXPECT_EQ(event.at("event_id").as_uint(), events.size() + 1);
      events.push_back(event);
      batch_of.push_back(b);
    }
  }
  outcome.events = events.size();

  // Each event to the thread it belongs to: by the tag of its key, or by the tenant of its
  // `cleared`.
  std::map<std::string, int> owner_of_tenant;
  for (int t = 0; t < threads; ++t) {
    for (const std::string& tenant : own_tenants(t)) owner_of_tenant[tenant] = t;
  }
  std::vector<std::vector<size_t>> stream_of(threads);
  for (size_t i = 0; i < events.size(); ++i) {
    const Value& event = events[i];
    int owner = -1;
    if (event.at("event_type").as_str() == "cleared") {
      ++outcome.cleared;
      const auto found = owner_of_tenant.find(event.at("tenant_id").bytes());
      if (found != owner_of_tenant.end()) owner = found->second;
    } else {
      const std::string& key = event.at("object_key").bytes();
      for (int t = 0; t < threads && owner < 0; ++t) {
        if (key.compare(0, tag_of(t).size(), tag_of(t)) == 0) owner = t;
      }
    }
    if (owner < 0) {
      ADD_FAILURE() << "event " << i + 1 << " was made by no call: " << describe(event);
      return outcome;
    }
    stream_of[owner].push_back(i);
  }

  // Each thread's events, in order, are its model's, and a call's events are adjacent in the
  // stream and in one message.
  uint64_t skipped_keyless = 0, remove_all_results = 0, cleared_allowed = 0, records = 0;
  uint64_t invalid_media = 0, skipped_non_utf8 = 0, cleared_skipped = 0;
  for (int t = 0; t < threads; ++t) {
    SCOPED_TRACE("thread " + std::to_string(t));
    const Caller& caller = callers[t];
    skipped_keyless += caller.skipped_keyless;
    skipped_non_utf8 += caller.skipped_non_utf8;
    cleared_skipped += caller.cleared_skipped;
    invalid_media += caller.invalid_media;
    remove_all_results += caller.remove_all_results;
    cleared_allowed += caller.cleared_allowed;
    records += caller.records;
    const std::vector<size_t>& actual = stream_of[t];
    const std::vector<Expected>& expected = caller.expected;
    std::vector<size_t> position(expected.size(), SIZE_MAX);  // of each expected event
    size_t a = 0;
    bool failed = false;
    for (size_t e = 0; e < expected.size(); ++e) {
      const std::string why =
          a < actual.size() ? mismatch(events[actual[a]], expected[e], policy) : "end of stream";
      if (why.empty()) {
        position[e] = actual[a++];
      } else if (!expected[e].optional) {
        ADD_FAILURE() << "expected event " << e << " of the model (call " << expected[e].call
                      << "): " << expected[e].describe() << "\n  stream event "
                      << (a < actual.size()
                              ? std::to_string(actual[a] + 1) + ": " + describe(events[actual[a]])
                              : std::string("none"))
                      << "\n  differs in: " << why;
        failed = true;
        break;
      }
    }
    if (a < actual.size() && !failed) {
      ADD_FAILURE() << "stream event " << actual[a] + 1
                    << " is not in the model: " << describe(events[actual[a]]);
    }
    for (size_t e = 1; e < expected.size(); ++e) {
      if (expected[e].call != expected[e - 1].call || position[e] == SIZE_MAX) continue;
      EXPECT_EQ(position[e], position[e - 1] + 1)
          << "the events of call " << expected[e].call << " are split";
      EXPECT_EQ(batch_of[position[e]], batch_of[position[e - 1]])
          << "the events of call " << expected[e].call << " are in two messages";
    }
  }

  // Nothing dropped at this capacity, and every suppression counted.
  EXPECT_LE(records, kCapacity) << "too many calls for the queue: lower KV_EVENTS_RANDOM_CALLS";
  EXPECT_EQ(stats.dropped_events, 0u);
  EXPECT_EQ(stats.send_failures, 0u);
  EXPECT_EQ(stats.published_events, events.size());
  EXPECT_EQ(stats.skipped_keyless_events, skipped_keyless);
  EXPECT_EQ(stats.skipped_non_utf8_events, skipped_non_utf8);
  EXPECT_EQ(stats.invalid_media_calls, invalid_media);
  EXPECT_LE(outcome.cleared, cleared_allowed);
  EXPECT_EQ(stats.cleared_suppressed, remove_all_results - outcome.cleared - cleared_skipped);
  outcome.skipped_non_utf8 = skipped_non_utf8;
  std::printf(
      "random_calls_test: %d threads x %llu calls, non_utf8=%s%s: %llu events in %llu messages, "
      "%llu keyless skipped, %llu not UTF-8 skipped, %llu of %llu allowed cleared emitted, "
      "%llu suppressed\n",
      threads, static_cast<unsigned long long>(calls), policy.non_utf8.c_str(),
      policy.reannounce_remaining ? ", reannounce_remaining" : "",
      static_cast<unsigned long long>(events.size()),
      static_cast<unsigned long long>(messages.size()),
      static_cast<unsigned long long>(skipped_keyless),
      static_cast<unsigned long long>(skipped_non_utf8),
      static_cast<unsigned long long>(outcome.cleared),
      static_cast<unsigned long long>(cleared_allowed),
      static_cast<unsigned long long>(stats.cleared_suppressed));
  return outcome;
}

uint64_t seed() {
  static const uint64_t seed = env_or("KV_EVENTS_RANDOM_SEED", std::random_device{}());
  return seed;
}

uint64_t calls_per_thread() { return env_or("KV_EVENTS_RANDOM_CALLS", kDefaultCallsPerThread); }

// Prints and records the seed, for a failure to be reproduced.
void announce_seed() {
  std::printf("random_calls_test: KV_EVENTS_RANDOM_SEED=%llu\n",
              static_cast<unsigned long long>(seed()));
  ::testing::Test::RecordProperty("seed", std::to_string(seed()));
}

Policy with_non_utf8(const char* mode) {
  Policy policy;
  policy.non_utf8 = mode;
  return policy;
}

// The default config: calls with a string that is not UTF-8 are skipped, from every thread.
TEST(RandomCalls, SeveralThreadsGetExactlyWhatTheModelExpects) {
  announce_seed();
  SCOPED_TRACE("KV_EVENTS_RANDOM_SEED=" + std::to_string(seed()));
  const Outcome outcome = run_and_check(seed(), kThreads, calls_per_thread(), Policy{});
  EXPECT_GT(outcome.events, 0u);
  EXPECT_GT(outcome.skipped_non_utf8, 0u) << "no call with a string that is not UTF-8";
  // Hundreds of allowed results, each from a scan a few calls old: for none of them to emit,
  // 64 other scans would have to begin inside every one of those windows.
  EXPECT_GT(outcome.cleared, 0u) << "no allowed RemoveAll result emitted `cleared`";
}

TEST(RandomCalls, SeveralThreadsWithNonUtf8AsBinGetExactlyWhatTheModelExpects) {
  announce_seed();
  SCOPED_TRACE("KV_EVENTS_RANDOM_SEED=" + std::to_string(seed()));
  const Outcome outcome = run_and_check(seed(), kThreads, calls_per_thread(), with_non_utf8("bin"));
  EXPECT_GT(outcome.events, 0u);
  EXPECT_EQ(outcome.skipped_non_utf8, 0u);
  EXPECT_GT(outcome.cleared, 0u);
}

TEST(RandomCalls, SeveralThreadsWithNonUtf8AsStrGetExactlyWhatTheModelExpects) {
  announce_seed();
  SCOPED_TRACE("KV_EVENTS_RANDOM_SEED=" + std::to_string(seed()));
  const Outcome outcome = run_and_check(seed(), kThreads, calls_per_thread(), with_non_utf8("str"));
  EXPECT_GT(outcome.events, 0u);
  EXPECT_EQ(outcome.skipped_non_utf8, 0u);
  EXPECT_GT(outcome.cleared, 0u);
}

// A reannounced `stored` travels with its call's `removed` and counts as an addition for
// RemoveAll: the model says which `cleared` that forbids.
TEST(RandomCalls, SeveralThreadsWithReannounceRemainingGetExactlyWhatTheModelExpects) {
  announce_seed();
  SCOPED_TRACE("KV_EVENTS_RANDOM_SEED=" + std::to_string(seed()));
  Policy policy;
  policy.reannounce_remaining = true;
  const Outcome outcome = run_and_check(seed(), kThreads, calls_per_thread(), policy);
  EXPECT_GT(outcome.events, 0u);
  EXPECT_GT(outcome.cleared, 0u);
}

TEST(RandomCalls, OneThreadGetsEveryAllowedCleared) {
  announce_seed();
  SCOPED_TRACE("KV_EVENTS_RANDOM_SEED=" + std::to_string(seed()));
  const Outcome outcome = run_and_check(seed(), 1, calls_per_thread(), Policy{});
  EXPECT_GT(outcome.cleared, 0u);
}

TEST(RandomCalls, WithoutObjectKeysOnlyClearedIsPublished) {
  announce_seed();
  SCOPED_TRACE("KV_EVENTS_RANDOM_SEED=" + std::to_string(seed()));
  Policy policy;
  policy.emit_object_key = false;
  const Outcome outcome = run_and_check(seed(), 2, calls_per_thread() / 4, policy);
  EXPECT_EQ(outcome.events, outcome.cleared);
}

}  // namespace
