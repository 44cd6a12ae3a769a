#include "plan/planfile/plan_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "plan/solver/verifier.h"
#include "plan/testing/plan_corpus.h"

namespace loom::plan {
namespace {

// A small valid plan: MiniMalloc's README example at capacity 12, with a
// dynamic window, every figure set and one extra section.
PlanFile Sample() {
  PlanFile plan = testing::ReadmePlanFile();
  plan.fingerprint = 0x0123456789abcdefull;
  plan.capacity = 12;
  plan.time_limit_seconds = 10;
  plan.seconds = 0.25;
  plan.optimal = true;
  plan.extra = {{PlanTag("MTCH"), false, "matching table"}};
  return plan;
}

TEST(PlanFileTest, RoundTrip) {
  const PlanFile plan = Sample();
  const std::string bytes = EncodePlanFile(plan);
  EXPECT_TRUE(LooksLikePlanFile(bytes));
  StatusOr<PlanFile> back = DecodePlanFile(bytes, "x.plan");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, plan);
  // Header 16, META 16+84+4, FIGS 16+49+4, BUFS 16+248+4, DYNS 16+55+4,
  // MTCH 16+14+4: the layout is fixed, so the size is too.
  EXPECT_EQ(bytes.size(), 566u);
  // The plan's buffers verify as an instance.
  Verdict v = VerifyPlacement(PlanAsInstance(*back), PlanOffsets(*back),
                              {.capacity = back->region_size});
  EXPECT_TRUE(v.valid()) << v.message;
}

TEST(PlanFileTest, FileRoundTripAndDump) {
  const std::string path = ::testing::TempDir() + "roundtrip.plan";
  ASSERT_TRUE(WritePlanFile(path, Sample()).ok());
  StatusOr<PlanFile> back = ReadPlanFile(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, Sample());
  const std::string text = FormatPlanText(*back);
  EXPECT_NE(text.find("peak          12 bytes = 1.000000 x lower bound 12 "
                      "(optimal)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("window [10, 20) moe: 4 bytes idle in 1 ranges, 1 "
                      "whole granules"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("section       'MTCH' optional (14 bytes)"),
            std::string::npos);
  EXPECT_NE(FormatPlanText(*back, 2).find("... 3 more"), std::string::npos);
  EXPECT_EQ(ReadPlanFile(path + ".missing").status().message(),
            path + ".missing: cannot open file: No such file or directory");
  std::remove(path.c_str());
}

// Rewrites the CRC of the section whose header starts at `at`.
void FixCrc(std::string& bytes, size_t at) {
  uint64_t length = 0;
  for (int k = 7; k >= 0; --k) {
    length = (length << 8) | static_cast<uint8_t>(bytes[at + 8 + k]);
  }
  const uint32_t crc = Crc32c(std::string_view(bytes).substr(at, 16 + length));
  for (int k = 0; k < 4; ++k) {
    bytes[at + 16 + length + k] = static_cast<char>((crc >> (8 * k)) & 0xff);
  }
}

// Offsets of the sections of an encoded Sample().
constexpr size_t kMetaAt = 16;
constexpr size_t kFigsAt = 16 + 16 + 84 + 4;        // 120
constexpr size_t kBufsAt = kFigsAt + 16 + 49 + 4;   // 189
constexpr size_t kDynsAt = kBufsAt + 16 + 248 + 4;  // 457

TEST(PlanFileTest, SectionOffsetsAreAsDocumented) {
  const std::string bytes = EncodePlanFile(Sample());
  EXPECT_EQ(bytes.substr(kMetaAt, 4), "META");
  EXPECT_EQ(bytes.substr(kFigsAt, 4), "FIGS");
  EXPECT_EQ(bytes.substr(kBufsAt, 4), "BUFS");
  EXPECT_EQ(bytes.substr(kDynsAt, 4), "DYNS");
}

struct Corruption {
  const char* name;
  std::string (*mutate)(std::string);
  const char* message;
};

std::string SetU32(std::string b, size_t at, uint32_t v) {
  for (int k = 0; k < 4; ++k)
    b[at + k] = static_cast<char>((v >> (8 * k)) & 0xff);
  return b;
}
std::string SetU64(std::string b, size_t at, uint64_t v) {
  for (int k = 0; k < 8; ++k)
    b[at + k] = static_cast<char>((v >> (8 * k)) & 0xff);
  return b;
}

TEST(PlanFileTest, CorruptFilesAreRejectedWithExactMessages) {
  const Corruption cases[] = {
      {"empty", [](std::string) { return std::string(); },
       "x.plan: offset 0: empty file (not a loom plan file)"},
      {"bad magic", [](std::string b) { return "id,lower,upper,size\n" + b; },
       "x.plan: offset 0: bad magic (not a loom plan file)"},
      {"short header", [](std::string b) { return b.substr(0, 11); },
       "x.plan: offset 11: truncated header (11 of 16 bytes)"},
      {"version", [](std::string b) { return SetU32(b, 8, 2); },
       "x.plan: offset 8: unsupported version 2 (this reader reads 1)"},
      {"section count", [](std::string b) { return SetU32(b, 12, 5000); },
       "x.plan: offset 12: section count 5000 above the limit 1024"},
      {"truncated in a section",
       [](std::string b) { return b.substr(0, kBufsAt + 100); },
       "x.plan: offset 197: truncated: section 'BUFS' needs 252 bytes, 84 "
       "are left"},
      {"truncated between sections",
       [](std::string b) { return b.substr(0, kBufsAt); },
       "x.plan: offset 189: truncated: section 3 of 5 starts here but only 0 "
       "bytes are left"},
      {"flipped payload byte",
       [](std::string b) {
         b[kBufsAt + 16 + 8 + 8] ^= 0x40;  // first buffer's offset
         return b;
       },
       "x.plan: offset 453: checksum mismatch in section 'BUFS' (stored "
       "0xfdd77912, computed 0xbf7dd638)"},
      {"unknown flags", [](std::string b) { return SetU32(b, kFigsAt + 4, 3); },
       "x.plan: offset 124: section 'FIGS' has unknown flags 0x3"},
      {"bad tag", [](std::string b) { return SetU32(b, kFigsAt, 0x01020304); },
       "x.plan: offset 120: bad section tag 0x01020304"},
      {"trailing bytes", [](std::string b) { return b + "xyz"; },
       "x.plan: offset 566: 3 trailing bytes after the last section"},
      {"unknown required section",
       [](std::string b) {
         // Turn the optional MTCH section into a required one.
         const size_t at = b.find("MTCH");
         b = SetU32(b, at + 4, 1);
         FixCrc(b, at);
         return b;
       },
       "x.plan: offset 532: unsupported required section 'MTCH'"},
      {"duplicate section",
       [](std::string b) {
         const size_t at = b.find("MTCH");
         b = SetU32(b, at, PlanTag("FIGS"));
         b = SetU32(b, at + 4, 1);
         FixCrc(b, at);
         return b;
       },
       "x.plan: offset 532: duplicate section 'FIGS'"},
      {"missing section",
       [](std::string b) {
         b = SetU32(b, kBufsAt, PlanTag("BUFX"));
         b = SetU32(b, kBufsAt + 4, 0);
         FixCrc(b, kBufsAt);
         return b;
       },
       "x.plan: offset 566: missing required section 'BUFS'"},
      {"optional known section",
       [](std::string b) {
         b = SetU32(b, kFigsAt + 4, 0);
         FixCrc(b, kFigsAt);
         return b;
       },
       "x.plan: offset 124: section 'FIGS' must be marked required"},
      {"huge section length",
       [](std::string b) { return SetU64(b, kFigsAt + 8, ~uint64_t{0}); },
       "x.plan: offset 128: truncated: section 'FIGS' needs 3 bytes, 430 are "
       "left"},
  };
  const std::string good = EncodePlanFile(Sample());
  for (const Corruption& c : cases) {
    StatusOr<PlanFile> plan = DecodePlanFile(c.mutate(good), "x.plan");
    ASSERT_FALSE(plan.ok()) << c.name;
    EXPECT_EQ(plan.status().message(), c.message) << c.name;
  }
}

// Values that pass the checksum (the writer does not validate) but not the
// reader's range checks.
TEST(PlanFileTest, OutOfRangeValuesAreRejected) {
  struct Case {
    const char* name;
    void (*edit)(PlanFile&);
    const char* message;
  };
  const Case cases[] = {
      {"size 0", [](PlanFile& p) { p.buffers[1].size = 0; },
       "x.plan: offset 261: section 'BUFS': buffer 1 (id 1): size 0 outside "
       "[1, 2^56]"},
      {"alignment", [](PlanFile& p) { p.buffers[0].alignment = 3; },
       "x.plan: offset 213: section 'BUFS': buffer 0 (id 0): alignment 3 is "
       "not a power of two in [1, 2^56]"},
      {"misaligned", [](PlanFile& p) { p.buffers[2].alignment = 8; },
       "x.plan: offset 309: section 'BUFS': buffer 2 (id 2): offset 4 is not "
       "aligned to 8"},
      {"lifetime", [](PlanFile& p) { p.buffers[3].end = 9; },
       "x.plan: offset 357: section 'BUFS': buffer 3 (id 3): empty lifetime "
       "[9, 9)"},
      {"beyond region", [](PlanFile& p) { p.buffers[4].offset = 10; },
       "x.plan: offset 405: section 'BUFS': buffer 4 (id 4): [10, +4) runs "
       "past the region size 12"},
      {"peak disagrees",
       [](PlanFile& p) {
         p.peak_bytes = 11;
         p.lower_bound_bytes = 11;
       },
       "x.plan: offset 205: section 'BUFS': the buffers reach 12 but the peak "
       "is 11"},
      {"peak above region", [](PlanFile& p) { p.peak_bytes = 13; },
       "x.plan: offset 177: section 'FIGS': peak 13 above the region size 12"},
      {"negative period", [](PlanFile& p) { p.period = -1; },
       "x.plan: offset 169: section 'FIGS': period -1 outside [0, 2^56]"},
      {"cyclic lifetime", [](PlanFile& p) { p.period = 20; },
       "x.plan: offset 405: section 'BUFS': buffer 4 (id 4): lifetime [0, 21) "
       "does not fit the period 20"},
      {"rounding", [](PlanFile& p) { p.size_round = 0; },
       "x.plan: offset 76: section 'META': size rounding 0 outside [1, 2^56]"},
      {"negative seconds", [](PlanFile& p) { p.seconds = -1; },
       "x.plan: offset 160: section 'FIGS': seconds is not a finite "
       "non-negative number"},
      {"window",
       [](PlanFile& p) {
         p.dynamic_spaces[0].window = {5, 5};
       },
       "x.plan: offset 481: section 'DYNS': window 0: [5, 5) is not a valid "
       "window"},
      {"range",
       [](PlanFile& p) {
         p.dynamic_spaces[0].ranges = {{8, 13}};
       },
       "x.plan: offset 512: section 'DYNS': window 0: range [8, 13) is empty, "
       "unsorted, touching the previous one or beyond the region"},
  };
  for (const Case& c : cases) {
    PlanFile plan = Sample();
    c.edit(plan);
    StatusOr<PlanFile> back = DecodePlanFile(EncodePlanFile(plan), "x.plan");
    ASSERT_FALSE(back.ok()) << c.name;
    EXPECT_EQ(back.status().message(), c.message) << c.name;
  }
}

TEST(PlanFileTest, EveryPrefixIsRejectedAndNothingCrashes) {
  const std::string good = EncodePlanFile(Sample());
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_FALSE(DecodePlanFile(good.substr(0, n), "x.plan").ok()) << n;
  }
}

TEST(PlanFileTest, UnknownOptionalSectionsAreKept) {
  PlanFile plan = Sample();
  plan.extra.push_back({PlanTag("ZZZZ"), false, std::string(1000, 'z')});
  StatusOr<PlanFile> back = DecodePlanFile(EncodePlanFile(plan), "x.plan");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->extra.size(), 2u);
  EXPECT_EQ(back->extra[1].payload.size(), 1000u);
}

TEST(PlanFileTest, FingerprintChangesWithTheInstance) {
  Instance a;
  a.buffers = {{0, 0, 3, 4}, {1, 3, 9, 4}};
  Instance b = a;
  EXPECT_EQ(InstanceFingerprint(a), InstanceFingerprint(b));
  b.buffers[1].size = 5;
  EXPECT_NE(InstanceFingerprint(a), InstanceFingerprint(b));
  b = a;
  b.period = 9;
  EXPECT_NE(InstanceFingerprint(a), InstanceFingerprint(b));
}

TEST(PlanFileTest, Crc32cKnownAnswer) {
  // The standard check value of CRC-32C.
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
}

}  // namespace
}  // namespace loom::plan
