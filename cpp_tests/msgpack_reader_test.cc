// The tests' own msgpack reader, checked against hand-written bytes.

#include "msgpack_reader.h"

#include <gtest/gtest.h>

#include <string>

namespace {

using kv_events_test::decode;
using kv_events_test::Value;
using Type = Value::Type;

std::string bytes(std::initializer_list<int> list) {
  std::string s;
  for (int b : list) s.push_back(static_cast<char>(b));
  return s;
}

TEST(MsgpackReader, KeepsUintIntStrBinAndNilApart) {
  EXPECT_EQ(decode(bytes({0x05})).type(), Type::kUint);
  EXPECT_EQ(decode(bytes({0xff})).as_int(), -1);
  EXPECT_EQ(decode(bytes({0xa1, 'a'})).as_str(), "a");
  EXPECT_EQ(decode(bytes({0xc4, 0x01, 'a'})).as_bin(), "a");
  EXPECT_TRUE(decode(bytes({0xc0})).is_nil());
  EXPECT_TRUE(decode(bytes({0xc3})).as_bool());
  EXPECT_THROW(decode(bytes({0xa1, 'a'})).as_bin(), std::runtime_error);
}

TEST(MsgpackReader, RecordsWhetherIntegersUseTheSmallestEncoding) {
  EXPECT_TRUE(decode(bytes({0x7f})).minimal());
  EXPECT_FALSE(decode(bytes({0xcc, 0x7f})).minimal());
  EXPECT_TRUE(decode(bytes({0xcc, 0x80})).minimal());
  EXPECT_FALSE(decode(bytes({0xcd, 0x00, 0xff})).minimal());
  EXPECT_TRUE(decode(bytes({0xcd, 0x01, 0x00})).minimal());
  EXPECT_FALSE(decode(bytes({0xce, 0x00, 0x00, 0xff, 0xff})).minimal());
  EXPECT_FALSE(decode(bytes({0xcf, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff})).minimal());
  EXPECT_TRUE(decode(bytes({0xcf, 0, 0, 0, 1, 0, 0, 0, 0})).minimal());
  EXPECT_FALSE(decode(bytes({0xd0, 0x05})).minimal()) << "non-negative in a signed format";
  EXPECT_EQ(decode(bytes({0xd0, 0x05})).type(), Type::kInt);
  EXPECT_TRUE(decode(bytes({0xd0, 0x80})).minimal());
  EXPECT_FALSE(decode(bytes({0xd9, 0x01, 'a'})).minimal()) << "str8 for a fixstr";
  EXPECT_FALSE(decode(bytes({0x91, 0xcc, 0x01})).all_minimal());
}

TEST(MsgpackReader, DecodesNestedMapsAndArrays) {
  const Value v = decode(bytes({0x93, 0x01, 0x91, 0x81, 0xa1, 'k', 0xc0, 0x02}));
  const auto& items = v.as_array();
  ASSERT_EQ(items.size(), 3u);
  EXPECT_EQ(items[0].as_uint(), 1u);
  const Value& event = items[1].as_array()[0];
  EXPECT_EQ(event.keys(), std::vector<std::string>{"k"});
  EXPECT_TRUE(event.at("k").is_nil());
  EXPECT_EQ(event.find("absent"), nullptr);
  EXPECT_EQ(items[2].as_uint(), 2u);
}

TEST(MsgpackReader, RefusesTruncatedTrailingAndUnusedInput) {
  EXPECT_THROW(decode(bytes({0xa2, 'a'})), std::runtime_error);
  EXPECT_THROW(decode(bytes({0x01, 0x02})), std::runtime_error);
  EXPECT_THROW(decode(bytes({0xca, 0, 0, 0, 0})), std::runtime_error);  // float
  EXPECT_THROW(decode(bytes({0xdd, 0xff, 0xff, 0xff, 0xff})), std::runtime_error);
  EXPECT_THROW(decode(""), std::runtime_error);
}

}  // namespace
