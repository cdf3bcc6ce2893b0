#include "msgpack_reader.h"

#include <cstdio>

namespace kv_events_test {

namespace {

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error("msgpack: " + what); }

}  // namespace

class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}

  bool at_end() const { return pos_ == data_.size(); }
  size_t pos() const { return pos_; }

  Value read(int depth = 0) {
    if (depth > 64) fail("nesting too deep");
    const uint8_t tag = byte();
    Value v;
    if (tag <= 0x7f) return uint_value(tag, true);
    if (tag >= 0xe0) return int_value(static_cast<int8_t>(tag), true);
    if ((tag & 0xf0) == 0x80) return map(tag & 0x0f, true, depth);
    if ((tag & 0xf0) == 0x90) return array(tag & 0x0f, true, depth);
    if ((tag & 0xe0) == 0xa0) return str(Value::Type::kStr, tag & 0x1f, true);
    switch (tag) {
      case 0xc0: return v;
      case 0xc2:
      case 0xc3:
        v.type_ = Value::Type::kBool;
        v.boolean_ = tag == 0xc3;
        return v;
      case 0xc4: {
        const uint64_t n = be(1);
        return str(Value::Type::kBin, n, true);
      }
      case 0xc5: {
        const uint64_t n = be(2);
        return str(Value::Type::kBin, n, n > 0xff);
      }
      case 0xc6: {
        const uint64_t n = be(4);
        return str(Value::Type::kBin, n, n > 0xffff);
      }
      case 0xcc: {
        const uint64_t n = be(1);
        return uint_value(n, n > 0x7f);
      }
      case 0xcd: {
        const uint64_t n = be(2);
        return uint_value(n, n > 0xff);
      }
      case 0xce: {
        const uint64_t n = be(4);
        return uint_value(n, n > 0xffff);
      }
      case 0xcf: {
        const uint64_t n = be(8);
        return uint_value(n, n > 0xffffffffULL);
      }
      // A signed format is minimal only for a negative value below the next smaller format's
      // range; a non-negative value belongs in a uint format.
      case 0xd0: {
        const auto n = static_cast<int8_t>(be(1));
        return int_value(n, n < -32);
      }
      case 0xd1: {
        const auto n = static_cast<int16_t>(be(2));
        return int_value(n, n < INT8_MIN);
      }
      case 0xd2: {
        const auto n = static_cast<int32_t>(be(4));
        return int_value(n, n < INT16_MIN);
      }
      case 0xd3: {
        const auto n = static_cast<int64_t>(be(8));
        return int_value(n, n < INT32_MIN);
      }
      case 0xd9: {
        const uint64_t n = be(1);
        return str(Value::Type::kStr, n, n > 0x1f);
      }
      case 0xda: {
        const uint64_t n = be(2);
        return str(Value::Type::kStr, n, n > 0xff);
      }
      case 0xdb: {
        const uint64_t n = be(4);
        return str(Value::Type::kStr, n, n > 0xffff);
      }
      case 0xdc: {
        const uint64_t n = be(2);
        return array(n, n > 0x0f, depth);
      }
      case 0xdd: {
        const uint64_t n = be(4);
        return array(n, n > 0xffff, depth);
      }
      case 0xde: {
        const uint64_t n = be(2);
        return map(n, n > 0x0f, depth);
      }
      case 0xdf: {
        const uint64_t n = be(4);
        return map(n, n > 0xffff, depth);
      }
      default: {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", tag);
        fail(std::string("unexpected tag ") + hex + " (float, ext or never used)");
      }
    }
  }

 private:
  uint8_t byte() {
    if (pos_ >= data_.size()) fail("truncated");
    return static_cast<uint8_t>(data_[pos_++]);
  }

  uint64_t be(int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v = (v << 8) | byte();
    return v;
  }

  static Value uint_value(uint64_t n, bool minimal) {
    Value v;
    v.type_ = Value::Type::kUint;
    v.uint_ = n;
    v.minimal_ = minimal;
    return v;
  }

  static Value int_value(int64_t n, bool minimal) {
    Value v;
    v.type_ = Value::Type::kInt;
    v.int_ = n;
    v.minimal_ = minimal;
    return v;
  }

  Value str(Value::Type type, uint64_t n, bool minimal) {
    if (n > data_.size() - pos_) fail("truncated string or binary");
    Value v;
    v.type_ = type;
    v.bytes_.assign(data_.substr(pos_, n));
    v.minimal_ = minimal;
    pos_ += n;
    return v;
  }

  Value array(uint64_t n, bool minimal, int depth) {
    if (n > data_.size() - pos_) fail("array longer than its input");
    Value v;
    v.type_ = Value::Type::kArray;
    v.minimal_ = minimal;
    for (uint64_t i = 0; i < n; ++i) v.array_.push_back(read(depth + 1));
    return v;
  }

  Value map(uint64_t n, bool minimal, int depth) {
    if (n > data_.size() - pos_) fail("map longer than its input");
    Value v;
    v.type_ = Value::Type::kMap;
    v.minimal_ = minimal;
    for (uint64_t i = 0; i < n; ++i) {
      Value key = read(depth + 1);
      Value value = read(depth + 1);
      v.map_.emplace_back(std::move(key), std::move(value));
    }
    return v;
  }

  std::string_view data_;
  size_t pos_ = 0;
};

Value decode(std::string_view data) {
  Reader reader(data);
  Value v = reader.read();
  if (!reader.at_end()) {
    fail(std::to_string(data.size() - reader.pos()) + " trailing bytes");
  }
  return v;
}

const char* type_name(Value::Type type) {
  switch (type) {
    case Value::Type::kNil: return "nil";
    case Value::Type::kBool: return "bool";
    case Value::Type::kUint: return "uint";
    case Value::Type::kInt: return "int";
    case Value::Type::kStr: return "str";
    case Value::Type::kBin: return "bin";
    case Value::Type::kArray: return "array";
    case Value::Type::kMap: return "map";
  }
  return "?";
}

namespace {

void expect(const Value& v, Value::Type type) {
  if (v.type() != type) {
    fail(std::string("expected ") + type_name(type) + ", got " + v.debug_string());
  }
}

}  // namespace

bool Value::all_minimal() const {
  if (!minimal_) return false;
  for (const Value& item : array_) {
    if (!item.all_minimal()) return false;
  }
  for (const auto& [key, value] : map_) {
    if (!key.all_minimal() || !value.all_minimal()) return false;
  }
  return true;
}

bool Value::as_bool() const {
  expect(*this, Type::kBool);
  return boolean_;
}

uint64_t Value::as_uint() const {
  expect(*this, Type::kUint);
  return uint_;
}

int64_t Value::as_int() const {
  expect(*this, Type::kInt);
  return int_;
}

const std::string& Value::as_str() const {
  expect(*this, Type::kStr);
  return bytes_;
}

const std::string& Value::as_bin() const {
  expect(*this, Type::kBin);
  return bytes_;
}

const std::string& Value::bytes() const {
  if (type_ != Type::kStr && type_ != Type::kBin) expect(*this, Type::kStr);
  return bytes_;
}

const std::vector<Value>& Value::as_array() const {
  expect(*this, Type::kArray);
  return array_;
}

const std::vector<std::pair<Value, Value>>& Value::as_map() const {
  expect(*this, Type::kMap);
  return map_;
}

const Value* Value::find(std::string_view key) const {
  for (const auto& [k, v] : as_map()) {
    if (k.type() == Type::kStr && k.bytes_ == key) return &v;
  }
  return nullptr;
}

const Value& Value::at(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) fail("no key \"" + std::string(key) + "\" in " + debug_string());
  return *v;
}

std::vector<std::string> Value::keys() const {
  std::vector<std::string> keys;
  for (const auto& [k, v] : as_map()) keys.push_back(k.as_str());
  return keys;
}

std::string Value::debug_string() const {
  auto quoted = [](const std::string& s) {
    std::string out = "\"";
    for (unsigned char c : s) {
      if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
        out += static_cast<char>(c);
      } else {
        char hex[8];
        std::snprintf(hex, sizeof hex, "\\x%02x", c);
        out += hex;
      }
    }
    return out + "\"";
  };
  switch (type_) {
    case Type::kNil: return "nil";
    case Type::kBool: return boolean_ ? "true" : "false";
    case Type::kUint: return std::to_string(uint_);
    case Type::kInt: return "int:" + std::to_string(int_);
    case Type::kStr: return quoted(bytes_);
    case Type::kBin: return "bin:" + quoted(bytes_);
    case Type::kArray: {
      std::string out = "[";
      for (size_t i = 0; i < array_.size(); ++i) {
        out += (i ? ", " : "") + array_[i].debug_string();
      }
      return out + "]";
    }
    case Type::kMap: {
      std::string out = "{";
      for (size_t i = 0; i < map_.size(); ++i) {
        out +=
            (i ? ", " : "") + map_[i].first.debug_string() + ": " + map_[i].second.debug_string();
      }
      return out + "}";
    }
  }
  return "?";
}

}  // namespace kv_events_test
