#include "bench/planner/synthetic.h"

#include <gtest/gtest.h>

#include <map>

namespace loom::bench {
namespace {

SyntheticOptions Small() {
  SyntheticOptions o;
  o.layers = 6;
  o.micro_batches = 5;
  o.in_flight = 2;
  return o;
}

TEST(SyntheticTest, SeededAndValid) {
  const plan::Instance a = SyntheticTrainingIteration(Small());
  EXPECT_EQ(a, SyntheticTrainingIteration(Small()));
  SyntheticOptions other = Small();
  other.seed = 2;
  EXPECT_NE(a, SyntheticTrainingIteration(other));
  EXPECT_TRUE(plan::ValidateInstance(a).ok());
  EXPECT_EQ(a.period, 0);
  // One time step per event: 2 * buffers steps in all.
  int64_t last = 0;
  for (const plan::Buffer& b : a.buffers) last = std::max(last, b.end);
  EXPECT_EQ(last + 1, static_cast<int64_t>(2 * a.buffers.size()));
  // Sizes repeat a lot.
  std::map<uint64_t, int> sizes;
  for (const plan::Buffer& b : a.buffers) ++sizes[b.size];
  EXPECT_LT(sizes.size(), 20u);
  EXPECT_GT(a.buffers.size(), 1000u);
}

TEST(SyntheticTest, LifetimesNest) {
  // Saved activations of a micro-batch are freed in reverse order of their
  // allocation: no two of them cross (one inside the other or disjoint),
  // checked here over all buffers of one small instance that end in the
  // backward: at least the nesting of most pairs holds.
  const plan::Instance a = SyntheticTrainingIteration(Small());
  int crossing = 0, nested = 0;
  for (size_t i = 0; i + 1 < a.buffers.size(); ++i) {
    const plan::Buffer& x = a.buffers[i];
    const plan::Buffer& y = a.buffers[i + 1];
    if (y.start < x.end && x.end < y.end) ++crossing;
    if (y.start < x.end && y.end < x.end) ++nested;
  }
  EXPECT_GT(nested, crossing);
}

TEST(SyntheticTest, CyclicVariantWraps) {
  SyntheticOptions o = Small();
  o.cyclic = true;
  const plan::Instance c = SyntheticTrainingIteration(o);
  EXPECT_TRUE(plan::ValidateInstance(c).ok());
  EXPECT_EQ(c.period, static_cast<int64_t>(2 * c.buffers.size()));
  int wrapping = 0;
  for (const plan::Buffer& b : c.buffers) wrapping += b.end > c.period;
  EXPECT_GT(wrapping, 0);
  // The same buffers as the non-cyclic iteration, rotated.
  o.cyclic = false;
  EXPECT_EQ(plan::LowerBound(c),
            plan::LowerBound(SyntheticTrainingIteration(o)));
}

TEST(SyntheticTest, DefaultSizeIsAboutThreeHundredThousand) {
  const plan::Instance big = SyntheticTrainingIteration(SyntheticOptions{});
  EXPECT_GT(big.buffers.size(), 280000u);
  EXPECT_LT(big.buffers.size(), 340000u);
}

}  // namespace
}  // namespace loom::bench
