#include "vmm/matcher.h"

#include <gtest/gtest.h>

namespace loom::vmm {
namespace {

RuntimePlan PlanOf(std::vector<uint64_t> prologue,
                   std::vector<uint64_t> iteration) {
  RuntimePlan plan;
  int64_t t = 0;
  for (uint64_t size : prologue)
    plan.prologue.push_back({size, 0, t, t + 1}), ++t;
  t = 0;
  for (uint64_t size : iteration) {
    plan.iteration.push_back({size, static_cast<int64_t>(t * 1000), t, t + 1});
    ++t;
  }
  plan.period = t;
  plan.region_bytes = 1 << 20;
  return plan;
}

// The index (in plan.iteration) each request matched, -1 for a miss.
std::vector<int> MatchAll(Matcher& m, const RuntimePlan& plan,
                          std::vector<uint64_t> sizes) {
  std::vector<int> out;
  for (uint64_t size : sizes) {
    Matcher::Match match = m.Next(size);
    out.push_back(match.entry == nullptr
                      ? -1
                      : static_cast<int>(match.entry - plan.iteration.data()));
  }
  return out;
}

TEST(MatcherTest, ExactSequenceHitsEveryEntryEveryIteration) {
  RuntimePlan plan = PlanOf({}, {10, 20, 30, 20});
  Matcher m(plan);
  for (int iteration = 0; iteration < 3; ++iteration) {
    m.IterationBegin();
    EXPECT_EQ(MatchAll(m, plan, {10, 20, 30, 20}),
              (std::vector<int>{0, 1, 2, 3}));
  }
}

TEST(MatcherTest, AnExtraRequestCostsOnlyItself) {
  RuntimePlan plan = PlanOf({}, {10, 20, 30, 40, 50});
  Matcher m(plan);
  m.IterationBegin();
  EXPECT_EQ(MatchAll(m, plan, {10, 20, 999, 30, 40, 50}),
            (std::vector<int>{0, 1, -1, 2, 3, 4}));
}

TEST(MatcherTest, AMissingRequestIsSkipped) {
  RuntimePlan plan = PlanOf({}, {10, 20, 30, 40, 50});
  Matcher m(plan);
  m.IterationBegin();
  EXPECT_EQ(MatchAll(m, plan, {10, 30, 40, 50}),
            (std::vector<int>{0, 2, 3, 4}));
}

TEST(MatcherTest, AResizedRequestTakesTheEntryUnderTheCursor) {
  constexpr uint64_t kM = 1 << 20;
  RuntimePlan plan = PlanOf({}, {kM, 2 * kM, 3 * kM, 4 * kM, 5 * kM});
  Matcher m(plan);
  m.IterationBegin();
  // 2 MiB + 4 KiB and 3 MiB - 60 KiB: close to the cursor's entries (within
  // an eighth and 64 KiB): theirs, marked near; the rest still hit exactly.
  EXPECT_EQ(MatchAll(m, plan, {kM, 2 * kM + 4096, 3 * kM - (60 << 10),
                               4 * kM, 5 * kM}),
            (std::vector<int>{0, 1, 2, 3, 4}));
  m.IterationBegin();
  EXPECT_TRUE(m.Next(kM).entry != nullptr);
  const Matcher::Match near = m.Next(2 * kM + 512);
  ASSERT_NE(near.entry, nullptr);
  EXPECT_TRUE(near.near);
  EXPECT_FALSE(m.Next(3 * kM).near);
  // Too far from the cursor's entry (more than 64 KiB away): an extra
  // request; the cursor stays and the next request still hits.
  m.IterationBegin();
  EXPECT_EQ(MatchAll(m, plan, {kM, 2 * kM + (65 << 10), 2 * kM, 3 * kM}),
            (std::vector<int>{0, -1, 1, 2}));
  // Small sizes: an eighth, at least 512 bytes.
  RuntimePlan small = PlanOf({}, {1000, 2000});
  Matcher s(small);
  s.IterationBegin();
  EXPECT_EQ(MatchAll(s, small, {1400, 2000}), (std::vector<int>{0, 1}));
  s.IterationBegin();
  EXPECT_EQ(MatchAll(s, small, {1600, 2000}), (std::vector<int>{-1, 1}));
}

TEST(MatcherTest, NearestMatchWinsOverAFartherRepeat) {
  // Sizes repeat (layers): after a wrong match the real request is one step
  // back, nearer than the repeat ahead.
  RuntimePlan plan = PlanOf({}, {10, 20, 30, 40, 10, 20});
  Matcher m(plan);
  m.IterationBegin();
  EXPECT_EQ(m.Next(10).entry, &plan.iteration[0]);
  EXPECT_EQ(m.Next(20).entry, &plan.iteration[1]);
  EXPECT_EQ(m.Next(20).entry, &plan.iteration[1])
      << "one step back, not three ahead";
}

TEST(MatcherTest, AWrongSkipAheadIsRepairedByLookingBack) {
  // The extra request (30) matches entry 2 ahead; the real 20 then comes and
  // the matcher steps back to it.
  RuntimePlan plan = PlanOf({}, {10, 20, 30, 40, 30, 50});
  Matcher m(plan);
  m.IterationBegin();
  std::vector<int> got = MatchAll(m, plan, {10, 30, 20, 30, 40, 30, 50});
  EXPECT_EQ(got[0], 0);
  EXPECT_EQ(got[2], 1);
  EXPECT_EQ(got.back(), 5);
}

TEST(MatcherTest, PrologueThenSteadyState) {
  RuntimePlan plan = PlanOf({7, 8}, {10, 20});
  plan.prologue_iterations = 1;  // the prologue holds one recorded iteration
  Matcher m(plan);
  EXPECT_TRUE(m.in_prologue());
  EXPECT_TRUE(m.in_setup());
  Matcher::Match a = m.Next(7);
  ASSERT_NE(a.entry, nullptr);
  EXPECT_TRUE(a.prologue);
  EXPECT_EQ(a.entry, &plan.prologue[0]);
  m.IterationBegin();  // the recorded early iteration: still the prologue
  EXPECT_FALSE(m.in_setup());
  EXPECT_TRUE(m.in_prologue());
  EXPECT_EQ(m.Next(8).entry, &plan.prologue[1]);
  m.IterationBegin();  // the steady state
  EXPECT_FALSE(m.in_prologue());
  EXPECT_EQ(MatchAll(m, plan, {10, 20}), (std::vector<int>{0, 1}));
}

TEST(MatcherTest, WithoutMarkersTheIterationRepeats) {
  RuntimePlan plan = PlanOf({5}, {10, 20});
  Matcher m(plan);
  EXPECT_NE(m.Next(5).entry, nullptr);
  EXPECT_EQ(MatchAll(m, plan, {10, 20, 10, 20, 10}),
            (std::vector<int>{0, 1, 0, 1, 0}));
  EXPECT_EQ(m.now(), 1);
}

}  // namespace
}  // namespace loom::vmm
