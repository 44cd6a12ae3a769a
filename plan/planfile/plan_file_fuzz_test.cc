// Seeded mutation fuzzing of the plan-file reader, run by `bazel test`
// (a libFuzzer target for longer runs: bench/fuzz/plan_file_fuzz.sh).
//
// Valid plans are mutated (bit flips, random bytes, interesting integers,
// truncation, insertion, deletion, duplication). Half the mutants get their
// section checksums repaired, so the value checks behind the CRC are
// reached too. The reader must never crash (this target also runs under
// --config=asan), and whatever it accepts must re-encode to the same bytes
// meaning (decode(encode(x)) == x) and respect the format's guarantees.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "plan/planfile/plan_file.h"
#include "plan/testing/plan_corpus.h"

namespace loom::plan {
namespace {

std::vector<PlanFile> Seeds() { return testing::PlanSeeds(); }

// Recomputes every section checksum that can be located.
void RepairChecksums(std::string& bytes) {
  size_t pos = 16;
  while (pos + 16 <= bytes.size()) {
    uint64_t length = 0;
    for (int k = 7; k >= 0; --k) {
      length = (length << 8) | static_cast<uint8_t>(bytes[pos + 8 + k]);
    }
    if (length > bytes.size() || pos + 16 + length + 4 > bytes.size()) return;
    const uint32_t crc =
        Crc32c(std::string_view(bytes).substr(pos, 16 + length));
    for (int k = 0; k < 4; ++k) {
      bytes[pos + 16 + length + k] = static_cast<char>((crc >> (8 * k)) & 0xff);
    }
    pos += 16 + length + 4;
  }
}

void Mutate(std::string& bytes, std::mt19937_64& rng) {
  static const uint64_t kInteresting[] = {0,
                                          1,
                                          2,
                                          3,
                                          7,
                                          8,
                                          12,
                                          13,
                                          0x7f,
                                          0xff,
                                          4096,
                                          uint64_t{1} << 31,
                                          uint64_t{1} << 56,
                                          (uint64_t{1} << 56) + 1,
                                          uint64_t{1} << 62,
                                          ~uint64_t{0},
                                          ~uint64_t{0} - 1,
                                          uint64_t{1} << 63};
  if (bytes.empty()) {
    bytes.push_back(static_cast<char>(rng()));
    return;
  }
  const size_t at = rng() % bytes.size();
  switch (rng() % 7) {
    case 0:  // flip a bit
      bytes[at] ^= static_cast<char>(1 << (rng() % 8));
      break;
    case 1:  // random byte
      bytes[at] = static_cast<char>(rng());
      break;
    case 2: {  // an interesting 64-bit value
      const uint64_t v = kInteresting[rng() % std::size(kInteresting)];
      for (size_t k = 0; k < 8 && at + k < bytes.size(); ++k) {
        bytes[at + k] = static_cast<char>((v >> (8 * k)) & 0xff);
      }
      break;
    }
    case 3:  // truncate
      bytes.resize(at);
      break;
    case 4:  // insert random bytes
      bytes.insert(at, std::string(1 + rng() % 16, static_cast<char>(rng())));
      break;
    case 5:  // delete a range
      bytes.erase(at, 1 + rng() % 16);
      break;
    case 6: {  // duplicate a range somewhere else
      const std::string chunk = bytes.substr(at, 1 + rng() % 64);
      bytes.insert(rng() % (bytes.size() + 1), chunk);
      break;
    }
  }
}

TEST(PlanFileFuzzTest, MutantsNeverCrashAndAcceptedPlansAreConsistent) {
  const std::vector<PlanFile> seeds = Seeds();
  std::vector<std::string> encoded;
  for (const PlanFile& seed : seeds) encoded.push_back(EncodePlanFile(seed));
  std::mt19937_64 rng(20261122);
  int accepted = 0;
  int repaired_rejects = 0;
  for (int round = 0; round < 30000; ++round) {
    std::string bytes = encoded[rng() % encoded.size()];
    const int mutations = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < mutations; ++m) Mutate(bytes, rng);
    const bool repair = rng() % 2 == 0;
    if (repair) RepairChecksums(bytes);
    StatusOr<PlanFile> plan = DecodePlanFile(bytes, "fuzz");
    if (!plan.ok()) {
      EXPECT_FALSE(plan.status().message().empty());
      EXPECT_EQ(plan.status().message().rfind("fuzz: offset ", 0), 0u)
          << plan.status().message();
      repaired_rejects += repair;
      continue;
    }
    ++accepted;
    // What the reader accepts is self-consistent and round-trips.
    uint64_t reach = 0;
    for (const PlannedBuffer& b : plan->buffers) {
      ASSERT_GT(b.size, 0u);
      ASSERT_LT(b.start, b.end);
      ASSERT_LE(b.offset + b.size, plan->region_size);
      ASSERT_EQ(b.offset % b.alignment, 0u);
      reach = std::max(reach, b.offset + b.size);
    }
    if (!plan->buffers.empty()) {
      ASSERT_EQ(reach, plan->peak_bytes);
    }
    ASSERT_LE(plan->peak_bytes, plan->region_size);
    StatusOr<PlanFile> again = DecodePlanFile(EncodePlanFile(*plan), "again");
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    ASSERT_EQ(*again, *plan);
  }
  // The mutants reach both outcomes and the value checks behind the CRC.
  EXPECT_GT(accepted, 100);
  EXPECT_GT(repaired_rejects, 1000);
}

}  // namespace
}  // namespace loom::plan
