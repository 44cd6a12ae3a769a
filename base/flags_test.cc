#include "base/flags.h"

#include <gtest/gtest.h>

#include "base/text.h"

namespace loom {
namespace {

TEST(ParseSizeTest, UnitsAndErrors) {
  EXPECT_EQ(*ParseSize("4096"), 4096u);
  EXPECT_EQ(*ParseSize("2MiB"), 2u << 20);
  EXPECT_EQ(*ParseSize("2M"), 2u << 20);
  EXPECT_EQ(*ParseSize("1.5GiB"), 3ull << 29);
  EXPECT_EQ(*ParseSize("80GB"), 80000000000ull);
  EXPECT_FALSE(ParseSize("").ok());
  EXPECT_FALSE(ParseSize("12 parsecs").ok());
  EXPECT_FALSE(ParseSize("0.3").ok());
  EXPECT_FALSE(ParseSize("1e40").ok());
  EXPECT_FALSE(ParseSize("99999999999TiB").ok());
}

TEST(FormatBytesTest, HumanUnits) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(3u << 20), "3.00 MiB");
}

TEST(FlagParserTest, ParsesAllForms) {
  std::string input, out = "default";
  uint64_t capacity = 0;
  bool json = false, check = true;
  int64_t seed = 0;
  double limit = 10;
  std::vector<std::string> rest;
  FlagParser flags("plan", "<input>", "test");
  flags.AddPositional("input", &input, "input file");
  flags.AddString("o", &out, "output");
  flags.AddSize("capacity", &capacity, "bytes");
  flags.AddBool("json", &json, "json");
  flags.AddBool("check", &check, "check");
  flags.AddInt("seed", &seed, "seed");
  flags.AddDouble("time-limit", &limit, "seconds");
  flags.AddRest("more", &rest, "more inputs");
  EXPECT_EQ(flags.Parse({"a.csv", "--o", "p.plan", "--capacity=1MiB", "--json",
                         "--no-check", "--seed=-4", "--time-limit", "2.5", "b",
                         "--", "--c"}),
            std::nullopt);
  EXPECT_EQ(input, "a.csv");
  EXPECT_EQ(out, "p.plan");
  EXPECT_EQ(capacity, 1u << 20);
  EXPECT_TRUE(json);
  EXPECT_FALSE(check);
  EXPECT_EQ(seed, -4);
  EXPECT_EQ(limit, 2.5);
  EXPECT_EQ(rest, (std::vector<std::string>{"b", "--c"}));
}

TEST(FlagParserTest, ErrorsAndHelpExitCodes) {
  std::string input;
  uint64_t capacity = 0;
  FlagParser flags("plan", "<input>", "test");
  flags.AddPositional("input", &input, "input file");
  flags.AddSize("capacity", &capacity, "bytes");
  EXPECT_EQ(flags.Parse({"--help"}), 0);
  EXPECT_EQ(flags.Parse({}), 2);
  EXPECT_EQ(flags.Parse({"x", "--bogus"}), 2);
  EXPECT_EQ(flags.Parse({"x", "--capacity"}), 2);
  EXPECT_EQ(flags.Parse({"x", "--capacity=lots"}), 2);
  EXPECT_EQ(flags.Parse({"x", "y"}), 2);
  EXPECT_NE(flags.Help().find("--capacity BYTES"), std::string::npos);
}

}  // namespace
}  // namespace loom
