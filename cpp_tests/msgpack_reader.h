// A small, strict msgpack reader for the tests: independent of the library's encoder, it keeps
// every distinction the wire format makes (uint vs int, str vs bin, nil vs absent) and records
// whether each integer, string, binary, array and map header used its smallest encoding.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kv_events_test {

class Value {
 public:
  enum class Type { kNil, kBool, kUint, kInt, kStr, kBin, kArray, kMap };

  Type type() const { return type_; }
  // Whether the header of this value (not of its members) used the smallest encoding of its
  // integer or length.
  bool minimal() const { return minimal_; }
  // Whether this value and every value inside it used their smallest encodings.
  bool all_minimal() const;

  bool is_nil() const { return type_ == Type::kNil; }
  bool as_bool() const;
  uint64_t as_uint() const;           // kUint only
  int64_t as_int() const;             // kInt only (a negative or non-minimal signed format)
  const std::string& as_str() const;  // kStr only
  const std::string& as_bin() const;  // kBin only
  const std::string& bytes() const;   // kStr or kBin
  const std::vector<Value>& as_array() const;
  const std::vector<std::pair<Value, Value>>& as_map() const;

  // The value of the map entry whose key is the str `key`; nullptr when absent.
  const Value* find(std::string_view key) const;
  // Like find(), but a missing key is an error.
  const Value& at(std::string_view key) const;
  // The map's keys, in wire order; every key must be a str.
  std::vector<std::string> keys() const;

  // A readable rendering for test failure messages.
  std::string debug_string() const;

 private:
  friend class Reader;
  Type type_ = Type::kNil;
  bool minimal_ = true;
  bool boolean_ = false;
  uint64_t uint_ = 0;
  int64_t int_ = 0;
  std::string bytes_;
  std::vector<Value> array_;
  std::vector<std::pair<Value, Value>> map_;
};

const char* type_name(Value::Type type);

// Decodes exactly one msgpack value filling all of `data`. Throws std::runtime_error on
// malformed input, trailing bytes or a type the wire format never uses (float, ext).
Value decode(std::string_view data);

}  // namespace kv_events_test
