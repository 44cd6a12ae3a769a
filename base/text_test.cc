#include "base/text.h"

#include <cerrno>

#include <gtest/gtest.h>

namespace loom {
namespace {

TEST(TextTest, TrimBlanks) {
  EXPECT_EQ(TrimBlanks(" \t a b \t\r"), "a b");
  EXPECT_EQ(TrimBlanks("   "), "");
}

TEST(TextTest, QuotedForMessageEscapesAndCuts) {
  EXPECT_EQ(QuotedForMessage("ab'c\n", 40), "'ab\\x27c\\x0a'");
  EXPECT_EQ(QuotedForMessage("abcdef", 3), "'abc...'");
}

TEST(TextTest, TagName) {
  EXPECT_EQ(TagName(0x4E414C50), "PLAN");
  EXPECT_EQ(TagName(0x00414201), "?BA?");
}

TEST(TextTest, FormatBytes) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(uint64_t{5} << 30), "5.00 GiB");
}

TEST(TextTest, OsErrorText) {
  EXPECT_EQ(OsErrorText(ENOENT), "No such file or directory");
  EXPECT_EQ(OsErrorText(0), "the system gave no reason");
}

}  // namespace
}  // namespace loom
