#include "whatif/sim/caching_config.h"

#include <gtest/gtest.h>

namespace loom::whatif {
namespace {

TEST(RoundSizeTest, DefaultRoundsTo512) {
  CachingConfig config;
  EXPECT_EQ(RoundSize(config, 1), 512u);
  EXPECT_EQ(RoundSize(config, 512), 512u);
  EXPECT_EQ(RoundSize(config, 513), 1024u);
  EXPECT_EQ(RoundSize(config, 600 * kKiB), 600 * kKiB);
  EXPECT_EQ(RoundSize(config, 12 * kMiB), 12 * kMiB);
  EXPECT_EQ(RoundSize(config, 12 * kMiB + 1), 12 * kMiB + 512);
}

TEST(RoundSizeTest, NextDivisionMatchesPyTorchExample) {
  // The comment in CUDACachingAllocator.cpp: 1200 with 4 divisions -> 1280.
  EXPECT_EQ(RoundupPower2NextDivision(1200, 4), 1280u);
  EXPECT_EQ(RoundupPower2NextDivision(1024, 4), 1024u);  // power of two
  EXPECT_EQ(RoundupPower2NextDivision(1280, 4), 1280u);  // on a step
  EXPECT_EQ(RoundupPower2NextDivision(1200, 1), 2048u);  // next power of 2
  EXPECT_EQ(RoundupPower2NextDivision(5, 8), 8u);        // step would be 0
}

TEST(RoundSizeTest, PowerOfTwoDivisions) {
  auto config = ParseAllocConf("roundup_power2_divisions:4");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  // 1.3 MiB lies in [1 MiB, 2 MiB): steps of 256 KiB -> 1.5 MiB.
  EXPECT_EQ(RoundSize(*config, 1363149), 1572864u);
  // Below 512 * 4 bytes the divisions do not apply.
  EXPECT_EQ(RoundSize(*config, 1200), 1536u);
  EXPECT_EQ(RoundSize(*config, 5000), 5120u);
}

TEST(RoundSizeTest, DivisionsOfOneDependOnVersion) {
  // 2.5+: a bucket value of 1 means no power-of-two rounding.
  auto modern = ParseAllocConf("roundup_power2_divisions:1");
  ASSERT_TRUE(modern.ok());
  EXPECT_EQ(RoundSize(*modern, 3 * kMiB), 3 * kMiB);
  // 2.4 and older: `divisions > 0`, so 1 rounds to the next power of two.
  auto old_base = ConfigForTorchVersion("2.4");
  ASSERT_TRUE(old_base.ok());
  auto old = ParseAllocConf("roundup_power2_divisions:1", *old_base);
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(old->roundup_rule, RoundupRule::kDivisionsAboveZero);
  EXPECT_EQ(RoundSize(*old, 3 * kMiB), 4 * kMiB);
  EXPECT_EQ(RoundSize(*old, 300), 512u);  // below kMinBlockSize first
}

TEST(ParseAllocConfTest, ListFormMatchesPyTorchTest) {
  // c10/test/core/AllocatorConfig_test.cpp.
  auto config = ParseAllocConf(
      "max_split_size_mb:40,max_non_split_rounding_mb:30,"
      "roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1],"
      "expandable_segments:True");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_TRUE(config->expandable_segments);
  EXPECT_EQ(config->max_split_size, 40 * kMiB);
  EXPECT_EQ(config->max_non_split_rounding_size, 30 * kMiB);
  EXPECT_EQ(RoundupPower2Divisions(*config, 32 * kMiB), 8u);
  EXPECT_EQ(RoundupPower2Divisions(*config, 64 * kMiB), 8u);
  EXPECT_EQ(RoundupPower2Divisions(*config, 128 * kMiB), 2u);
  EXPECT_EQ(RoundupPower2Divisions(*config, 256 * kMiB), 4u);
  EXPECT_EQ(RoundupPower2Divisions(*config, 512 * kMiB), 2u);
  EXPECT_EQ(RoundupPower2Divisions(*config, 1024 * kMiB), 4u);
  EXPECT_EQ(RoundupPower2Divisions(*config, 2048 * kMiB), 1u);
  EXPECT_EQ(RoundupPower2Divisions(*config, 64 * kGiB), 1u);
  EXPECT_EQ(RoundupPower2Divisions(*config, 1), 8u);  // bucket 0 filled
}

TEST(ParseAllocConfTest, SpacesAndEmptyAndRoundTrip) {
  auto empty = ParseAllocConf("");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(FormatAllocConf(*empty), "");
  auto spaced = ParseAllocConf(
      " expandable_segments : True , "
      "roundup_power2_divisions:[ 2:4 , >:8 ]");
  ASSERT_TRUE(spaced.ok()) << spaced.status().ToString();
  auto again = ParseAllocConf(FormatAllocConf(*spaced));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->roundup_power2_divisions, spaced->roundup_power2_divisions);
  EXPECT_EQ(again->roundup_power2_divisions[0], 4u);
  EXPECT_EQ(again->roundup_power2_divisions[1], 4u);
  EXPECT_EQ(again->roundup_power2_divisions[2], 8u);
  EXPECT_TRUE(again->expandable_segments);
}

TEST(ParseAllocConfTest, ResetsUnspecifiedSplitAndRoundingSettings) {
  auto first =
      ParseAllocConf("max_split_size_mb:64,roundup_power2_divisions:2");
  ASSERT_TRUE(first.ok());
  auto second = ParseAllocConf("expandable_segments:False", *first);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->max_split_size, kNoMaxSplitSize);
  EXPECT_EQ(second->roundup_power2_divisions[3], 0u);
}

TEST(ParseAllocConfTest, RejectsBadSettingsWithClearErrors) {
  struct Case {
    const char* text;
    StatusCode code;
    const char* fragment;
  };
  const Case cases[] = {
      {"expandable_segments:true", StatusCode::kInvalidArgument,
       "True or False"},
      {"max_split_size_mb:10", StatusCode::kInvalidArgument, ">= 20"},
      {"max_split_size_mb:abc", StatusCode::kInvalidArgument, "'abc'"},
      {"max_non_split_rounding_mb:1", StatusCode::kInvalidArgument, ">= 20"},
      {"roundup_power2_divisions:3", StatusCode::kInvalidArgument,
       "power of 2"},
      {"roundup_power2_divisions:[64:3]", StatusCode::kInvalidArgument,
       "power of 2"},
      {"roundup_power2_divisions:[63:2]", StatusCode::kInvalidArgument,
       "interval 63"},
      {"roundup_power2_divisions:[64:2", StatusCode::kInvalidArgument, "']'"},
      {"frobnicate:1", StatusCode::kInvalidArgument, "'frobnicate'"},
      {"expandable_segments", StatusCode::kInvalidArgument, "':'"},
      {"expandable_segments:True;", StatusCode::kInvalidArgument, "True;"},
      {"large_segment_size_mb:3", StatusCode::kInvalidArgument, "multiple"},
      {"backend:cudaMallocAsync", StatusCode::kUnimplemented, "not simulated"},
      {"garbage_collection_threshold:0.5", StatusCode::kUnimplemented,
       "fraction"},
  };
  for (const Case& c : cases) {
    auto config = ParseAllocConf(c.text);
    ASSERT_FALSE(config.ok()) << c.text;
    EXPECT_EQ(config.status().code(), c.code) << c.text;
    EXPECT_NE(config.status().message().find(c.fragment), std::string::npos)
        << c.text << ": " << config.status().message();
  }
}

TEST(ParseAllocConfTest, AcceptsOptionsWithoutEffect) {
  auto config = ParseAllocConf(
      "backend:native,release_lock_on_cudamalloc:True,"
      "pinned_use_cuda_host_register:False,pinned_num_register_threads:8");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(FormatAllocConf(*config), "");
}

TEST(GetAllocationSizeTest, SegmentSizes) {
  CachingConfig config;
  EXPECT_EQ(GetAllocationSize(config, 512), 2 * kMiB);
  EXPECT_EQ(GetAllocationSize(config, kMiB), 2 * kMiB);
  EXPECT_EQ(GetAllocationSize(config, kMiB + 512), 20 * kMiB);
  EXPECT_EQ(GetAllocationSize(config, 10 * kMiB - 512), 20 * kMiB);
  EXPECT_EQ(GetAllocationSize(config, 10 * kMiB), 10 * kMiB);
  EXPECT_EQ(GetAllocationSize(config, 12 * kMiB + 512), 14 * kMiB);
  auto big = ParseAllocConf("large_segment_size_mb:64");
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(GetAllocationSize(*big, 5 * kMiB), 64 * kMiB);
}

TEST(ConfigForTorchVersionTest, VersionSwitches) {
  auto v24 = ConfigForTorchVersion("2.4");
  auto v25 = ConfigForTorchVersion("2.5.1");
  auto v211 = ConfigForTorchVersion("2.11");
  ASSERT_TRUE(v24.ok() && v25.ok() && v211.ok());
  EXPECT_EQ(v24->non_split_rule, NonSplitRule::kLargeBuffer);
  EXPECT_EQ(v25->roundup_rule, RoundupRule::kDivisionsAboveOne);
  EXPECT_EQ(v25->non_split_rule, NonSplitRule::kLargeBuffer);
  EXPECT_EQ(v211->non_split_rule, NonSplitRule::kConfigured);
  EXPECT_FALSE(ConfigForTorchVersion("two").ok());
  EXPECT_FALSE(ConfigForTorchVersion("2").ok());
  EXPECT_FALSE(ConfigForTorchVersion("2.x").ok());
}

}  // namespace
}  // namespace loom::whatif
