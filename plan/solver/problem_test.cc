#include "plan/solver/problem.h"

#include <gtest/gtest.h>

namespace loom::plan {
namespace {

TEST(ProblemTest, SlotsSpansAndLowerBound) {
  Instance inst;
  inst.buffers = {
      {0, 0, 3, 4}, {1, 3, 9, 4}, {2, 0, 9, 4}, {3, 9, 21, 4}, {4, 0, 21, 4}};
  StatusOr<Problem> p = Problem::Make(inst);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  // Distinct end points 0, 3, 9, 21: three slots.
  EXPECT_EQ(p->num_slots(), 3);
  EXPECT_EQ(p->slot_time(0), 0);
  EXPECT_EQ(p->slot_time(3), 21);
  ASSERT_EQ(p->spans(3).size(), 1u);
  EXPECT_EQ(p->spans(3)[0].lo, 2);
  EXPECT_EQ(p->spans(3)[0].hi, 3);
  EXPECT_EQ(p->spans(4)[0].hi, 3);
  EXPECT_EQ(p->lower_bound(), 12u);
  EXPECT_EQ(p->slot_load(), (std::vector<uint64_t>{12, 12, 8}));
  EXPECT_EQ(p->MaxLoadOverLifetime(),
            (std::vector<uint64_t>{12, 12, 12, 8, 12}));
  EXPECT_EQ(p->duration(4), 21);
  EXPECT_EQ(p->total_bytes(), 20u);
  EXPECT_EQ(p->PeakOf(std::vector<uint64_t>{8, 8, 4, 4, 0}), 12u);
}

TEST(ProblemTest, RoundingAndAlignment) {
  Instance inst;
  inst.buffers = {{0, 0, 2, 100, 1}, {1, 1, 3, 513, 1024}};
  StatusOr<Problem> p = Problem::Make(inst, 512, 256);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->size(0), 512u);
  EXPECT_EQ(p->size(1), 1024u);
  EXPECT_EQ(p->alignment(0), 256u);
  EXPECT_EQ(p->alignment(1), 1024u);
  EXPECT_EQ(p->lower_bound(), 1536u);
  EXPECT_EQ(Problem::Make(inst, 0).status().message(),
            "size rounding 0 must be in [1, 2^56]");
  EXPECT_EQ(Problem::Make(inst, 1, 3).status().message(),
            "minimum alignment 3 must be a power of two in [1, 2^56]");
  inst.buffers[0].size = uint64_t{1} << 57;
  EXPECT_EQ(Problem::Make(inst).status().message(),
            "buffer 0 (id 0): size 144115188075855872 or alignment 1 above "
            "2^56");
}

TEST(ProblemTest, CyclicBuffersHaveTwoSpans) {
  Instance inst;
  inst.period = 10;
  inst.buffers = {{0, 8, 13, 1}, {1, 1, 2, 1}, {2, 4, 10, 1}};
  StatusOr<Problem> p = Problem::Make(inst);
  ASSERT_TRUE(p.ok());
  // End points 0, 1, 2, 3, 4, 8, 10.
  EXPECT_EQ(p->num_slots(), 6);
  ASSERT_EQ(p->spans(0).size(), 2u);
  EXPECT_EQ(p->slot_time(p->spans(0)[0].lo), 8);
  EXPECT_EQ(p->slot_time(p->spans(0)[0].hi), 10);
  EXPECT_EQ(p->slot_time(p->spans(0)[1].lo), 0);
  EXPECT_EQ(p->slot_time(p->spans(0)[1].hi), 3);
  EXPECT_EQ(p->duration(0), 5);
  EXPECT_EQ(p->lower_bound(), 2u);
}

TEST(ProblemTest, AbsurdTotalsAreRejected) {
  Instance inst;
  for (uint64_t i = 0; i < 300; ++i) {
    inst.buffers.push_back({i, 0, 1, 1, uint64_t{1} << 55});
  }
  EXPECT_EQ(Problem::Make(inst).status().message(),
            "total size of the buffers (with alignment padding) above 2^62");
}

TEST(ProblemTest, InvalidInstanceAndEmpty) {
  Instance inst;
  inst.buffers = {{7, 5, 5, 1}};
  EXPECT_EQ(Problem::Make(inst).status().message(),
            "buffer 0 (id 7): empty lifetime [5, 5)");
  inst.buffers.clear();
  StatusOr<Problem> p = Problem::Make(inst);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->num_slots(), 0);
  EXPECT_EQ(p->lower_bound(), 0u);
}

}  // namespace
}  // namespace loom::plan
