#include "base/json.h"

#include <gtest/gtest.h>

#include <limits>

namespace loom {
namespace {

TEST(JsonWriterTest, NestedStructureWithCommas) {
  JsonWriter w;
  w.BeginObject();
  w.Key("peak").Uint(18446744073709551615ull);
  w.Key("delta").Int(-3);
  w.Key("ratio").Double(0.5);
  w.Key("nan").Double(std::numeric_limits<double>::quiet_NaN());
  w.Key("rows").BeginArray();
  w.BeginObject().Key("ok").Bool(true).EndObject();
  w.BeginArray().EndArray();
  w.Null();
  w.EndArray();
  w.Key("empty").BeginObject().EndObject();
  w.EndObject();
  EXPECT_EQ(w.str(),
            R"({"peak":18446744073709551615,"delta":-3,"ratio":0.5,"nan":null,)"
            R"("rows":[{"ok":true},[],null],"empty":{}})");
}

TEST(JsonWriterTest, EscapesStrings) {
  EXPECT_EQ(JsonWriter::Quote("a\"b\\c\nd\x01"), R"("a\"b\\c\nd\u0001")");
}

TEST(JsonWriterTest, PrettyPrints) {
  JsonWriter w(2);
  w.BeginObject().Key("a").BeginArray().Int(1).Int(2).EndArray().EndObject();
  EXPECT_EQ(w.str(), "{\n  \"a\": [\n    1,\n    2\n  ]\n}");
}

TEST(JsonWriterDeathTest, MisuseAborts) {
  EXPECT_DEATH(
      {
        JsonWriter w;
        w.BeginObject().Int(1);
      },
      "without a key");
  EXPECT_DEATH(
      {
        JsonWriter w;
        w.BeginArray();
        (void)w.str();
      },
      "unclosed");
}

}  // namespace
}  // namespace loom
