#include "plan/solver/verifier.h"
#include "plan/solver/testing/instances.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace loom::plan {
namespace {

// MiniMalloc's README example and its published solution at capacity 12.
Instance Readme() { return testing::ReadmeInstance(); }
const std::vector<uint64_t> kReadmeOffsets = testing::ReadmeOffsets();

TEST(VerifierTest, AcceptsTheReadmeSolution) {
  Verdict v = VerifyPlacement(Readme(), kReadmeOffsets, {.capacity = 12});
  EXPECT_TRUE(v.valid()) << v.message;
  EXPECT_EQ(v.peak_bytes, 12u);
  EXPECT_EQ(v.message, "");
}

TEST(VerifierTest, PlantedOverlapIsNamed) {
  std::vector<uint64_t> offsets = kReadmeOffsets;
  offsets[3] = 2;  // b3 [9,21) at [2,6) now meets b4 at [0,4)
  Verdict v = VerifyPlacement(Readme(), offsets);
  ASSERT_EQ(v.kind, ViolationKind::kOverlap);
  EXPECT_EQ(v.buffer, 3u);
  EXPECT_EQ(v.other, 4u);
  EXPECT_EQ(v.time, 9);
  EXPECT_EQ(v.message,
            "buffer 3 (id 3) at [2, 6) and buffer 4 (id 4) at [0, 4) share "
            "bytes [2, 4) at time 9");
}

TEST(VerifierTest, OverlapWithTheNeighbourAbove) {
  std::vector<uint64_t> offsets = kReadmeOffsets;
  offsets[4] = 2;  // b4 [0,21) at [2,6) meets b2 at [4,8) from time 0
  Verdict v = VerifyPlacement(Readme(), offsets);
  ASSERT_EQ(v.kind, ViolationKind::kOverlap);
  EXPECT_EQ(v.time, 0);
  EXPECT_EQ(v.buffer, 4u);
  EXPECT_EQ(v.other, 2u);
}

TEST(VerifierTest, SameOffsetIsAnOverlapAndTouchingIsNot) {
  Instance inst;
  inst.buffers = {{0, 0, 10, 8}, {1, 5, 6, 1}};
  EXPECT_EQ(VerifyPlacement(inst, std::vector<uint64_t>{0, 0}).kind,
            ViolationKind::kOverlap);
  EXPECT_TRUE(VerifyPlacement(inst, std::vector<uint64_t>{0, 8}).valid());
  EXPECT_EQ(VerifyPlacement(inst, std::vector<uint64_t>{0, 7}).kind,
            ViolationKind::kOverlap);
  // Lifetimes that only touch ([0,10) and [10,12)) may share bytes.
  inst.buffers[1] = {1, 10, 12, 8};
  EXPECT_TRUE(VerifyPlacement(inst, std::vector<uint64_t>{0, 0}).valid());
}

TEST(VerifierTest, CyclicWrapAround) {
  // Period 10: w lives [8, 10) and [0, 3); e lives [1, 2).
  Instance inst;
  inst.period = 10;
  inst.buffers = {{0, 8, 13, 4}, {1, 1, 2, 4}, {2, 4, 7, 4}};
  Verdict v = VerifyPlacement(inst, std::vector<uint64_t>{0, 0, 0});
  ASSERT_EQ(v.kind, ViolationKind::kOverlap);
  EXPECT_EQ(v.time, 1);
  EXPECT_EQ(v.buffer, 1u);
  EXPECT_EQ(v.other, 0u);
  EXPECT_TRUE(VerifyPlacement(inst, std::vector<uint64_t>{0, 4, 0}).valid());
  // Not cyclic: the same offsets are fine.
  inst.period = 0;
  EXPECT_TRUE(VerifyPlacement(inst, std::vector<uint64_t>{0, 0, 0}).valid());
}

TEST(VerifierTest, AlignmentCapacityCountAndRounding) {
  Instance inst;
  inst.buffers = {{0, 0, 4, 100, 64}, {1, 2, 6, 10}};
  Verdict v = VerifyPlacement(inst, std::vector<uint64_t>{32, 200});
  EXPECT_EQ(v.kind, ViolationKind::kAlignment);
  EXPECT_EQ(v.message,
            "buffer 0 (id 0): offset 32 is not a multiple of its alignment 64");
  v = VerifyPlacement(inst, std::vector<uint64_t>{0, 100}, {.capacity = 109});
  EXPECT_EQ(v.kind, ViolationKind::kCapacity);
  EXPECT_EQ(v.message,
            "buffer 1 (id 1): [100, 110) ends beyond the capacity 109");
  EXPECT_TRUE(
      VerifyPlacement(inst, std::vector<uint64_t>{0, 100}, {.capacity = 110})
          .valid());
  v = VerifyPlacement(inst, std::vector<uint64_t>{0});
  EXPECT_EQ(v.kind, ViolationKind::kCount);
  EXPECT_EQ(v.message, "1 offsets for 2 buffers");
  // With 512-byte rounding buffer 0 takes [0, 512): 100 is inside it, and
  // 100 is not a multiple of the minimum alignment either.
  v = VerifyPlacement(inst, std::vector<uint64_t>{0, 100},
                      {.size_round = 512, .min_alignment = 1});
  EXPECT_EQ(v.kind, ViolationKind::kOverlap);
  v = VerifyPlacement(inst, std::vector<uint64_t>{0, 100},
                      {.size_round = 512, .min_alignment = 512});
  EXPECT_EQ(v.kind, ViolationKind::kAlignment);
  v = VerifyPlacement(inst, std::vector<uint64_t>{0, 512},
                      {.size_round = 512, .min_alignment = 512});
  EXPECT_TRUE(v.valid());
  EXPECT_EQ(v.peak_bytes, 1024u);
  v = VerifyPlacement(inst, std::vector<uint64_t>{0, UINT64_MAX - 3});
  EXPECT_EQ(v.kind, ViolationKind::kCapacity);
  EXPECT_EQ(v.message,
            "buffer 1 (id 1): offset 18446744073709551612 + size "
            "10 overflows");
}

TEST(VerifierTest, LabelsAppearInMessages) {
  Instance inst = Readme();
  inst.labels = {"b1", "b2", "b3", "b4", "b5"};
  std::vector<uint64_t> offsets = kReadmeOffsets;
  offsets[0] = 6;
  Verdict v = VerifyPlacement(inst, offsets);
  ASSERT_EQ(v.kind, ViolationKind::kOverlap);
  EXPECT_NE(v.message.find("'b1'"), std::string::npos) << v.message;
}

// Random small instances and random offsets: the sweep agrees with the
// quadratic definition (some conflicting pair shares a byte).
TEST(VerifierTest, AgreesWithBruteForce) {
  std::mt19937_64 rng(42);
  int invalid = 0;
  for (int round = 0; round < 2000; ++round) {
    Instance inst;
    inst.period = round % 2 == 0 ? 0 : 20;
    const int n = 1 + static_cast<int>(rng() % 8);
    std::vector<uint64_t> offsets;
    for (int i = 0; i < n; ++i) {
      Buffer b;
      b.id = i;
      b.start = static_cast<int64_t>(rng() % 20);
      b.end = b.start + 1 + static_cast<int64_t>(rng() % 12);
      b.size = 1 + rng() % 6;
      inst.buffers.push_back(b);
      offsets.push_back(rng() % 24);
    }
    bool brute_ok = true;
    for (int i = 0; i < n; ++i) {
      for (int j = i + 1; j < n; ++j) {
        const Buffer& a = inst.buffers[i];
        const Buffer& b = inst.buffers[j];
        if (Conflict(a, b, inst.period) && offsets[i] < offsets[j] + b.size &&
            offsets[j] < offsets[i] + a.size) {
          brute_ok = false;
        }
      }
    }
    Verdict v = VerifyPlacement(inst, offsets);
    ASSERT_EQ(v.valid(), brute_ok) << "round " << round << ": " << v.message;
    if (!v.valid()) {
      ++invalid;
      const Buffer& a = inst.buffers[v.buffer];
      const Buffer& b = inst.buffers[v.other];
      EXPECT_TRUE(Conflict(a, b, inst.period));
    }
  }
  EXPECT_GT(invalid, 200);
  EXPECT_LT(invalid, 1900);
}

TEST(VerifierTest, CheckSameBuffers) {
  Instance a = Readme();
  Instance b = Readme();
  EXPECT_TRUE(CheckSameBuffers(a, b).ok());
  a.buffers[2].size = 8;  // a plan may reserve more (rounding)
  EXPECT_TRUE(CheckSameBuffers(a, b).ok());
  a.buffers[2].size = 3;
  EXPECT_EQ(CheckSameBuffers(a, b).message(),
            "buffer 2: the plan has id 2 [0, 9) size 3 alignment 1, the "
            "instance id 2 [0, 9) size 4 alignment 1");
  a.buffers.pop_back();
  EXPECT_EQ(CheckSameBuffers(a, b).message(),
            "the plan has 4 buffers, the instance 5");
}

}  // namespace
}  // namespace loom::plan
