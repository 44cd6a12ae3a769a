#include "plan/solver/instance.h"

#include <gtest/gtest.h>

namespace loom::plan {
namespace {

TEST(InstanceTest, LowerBoundIsMaxLiveBytes) {
  Instance inst;
  inst.buffers = {
      {0, 0, 3, 4}, {1, 3, 9, 4}, {2, 0, 9, 4}, {3, 9, 21, 4}, {4, 0, 21, 4}};
  // MiniMalloc's README example: capacity 12 is tight.
  EXPECT_EQ(LowerBound(inst), 12u);
  EXPECT_EQ(LowerBound(inst, 8), 24u);
}

TEST(InstanceTest, HalfOpenLifetimesDoNotConflictAtTheBoundary) {
  Buffer a{0, 0, 5, 10};
  Buffer b{1, 5, 9, 10};
  EXPECT_FALSE(Conflict(a, b, 0));
  b.start = 4;
  EXPECT_TRUE(Conflict(a, b, 0));
}

TEST(InstanceTest, CyclicBuffersWrapAroundTheIteration) {
  // Period 10: buffer w lives [8, 10) and [0, 3); it meets an early buffer.
  Buffer wrap{0, 8, 13, 1};
  Buffer early{1, 1, 2, 1};
  Buffer middle{2, 4, 7, 1};
  EXPECT_TRUE(Conflict(wrap, early, 10));
  EXPECT_FALSE(Conflict(wrap, middle, 10));
  EXPECT_FALSE(Conflict(wrap, early, 0));  // not cyclic: no wrap

  Instance inst;
  inst.period = 10;
  inst.buffers = {wrap, early, middle};
  EXPECT_EQ(LowerBound(inst), 2u);
  EXPECT_TRUE(ValidateInstance(inst).ok());
}

TEST(InstanceTest, ValidationNamesTheBadBuffer) {
  Instance inst;
  inst.buffers = {{7, 5, 5, 1}};
  EXPECT_EQ(ValidateInstance(inst).message(),
            "buffer 0 (id 7): empty lifetime [5, 5)");
  inst.buffers = {{7, 0, 5, 0}};
  EXPECT_FALSE(ValidateInstance(inst).ok());
  inst.buffers = {{7, 0, 5, 8, 3}};
  EXPECT_FALSE(ValidateInstance(inst).ok());
  inst.buffers = {{7, 0, 25, 8}};
  inst.period = 10;
  EXPECT_FALSE(ValidateInstance(inst).ok());
}

}  // namespace
}  // namespace loom::plan
