#include "whatif/workloads/repeat.h"

#include <gtest/gtest.h>

#include <unordered_map>
#include <vector>

#include "whatif/workloads/load.h"
#include "whatif/workloads/perturb.h"

namespace loom::whatif {
namespace {

using plan::Event;
using plan::EventKind;

// A head (a weight), then iterations 0..2: an activation freed in the same
// iteration and a gradient freed by the next iteration's zero_grad; the
// optimizer state is made in iteration 0 and lives on.
plan::Trace Training() {
  plan::Trace t;
  uint64_t id = 1;
  t.events.push_back(Event::Alloc(id++, 4096));  // weight (1)
  uint64_t grad = 0;
  for (uint64_t it = 0; it < 3; ++it) {
    t.events.push_back(Event::IterationBegin(it));
    if (grad != 0) t.events.push_back(Event::Free(grad));
    const uint64_t act = id++;
    t.events.push_back(Event::Alloc(act, 1 << 20));
    grad = id++;
    t.events.push_back(Event::Alloc(grad, 4096));
    t.events.push_back(Event::Free(act));
    if (it == 0) t.events.push_back(Event::Alloc(id++, 8192));  // state
    t.events.push_back(Event::IterationEnd(it));
  }
  return t;
}

TEST(RepeatTest, CopiesTheLastKeptIterationWithItsCarriedFrees) {
  const plan::Trace trace = Training();
  StatusOr<RepeatedTrace> out =
      RepeatSteadyIteration(trace, RepeatOptions{3, 2});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_TRUE(plan::ValidateTrace(out->trace).ok());
  EXPECT_EQ(out->kept_events, trace.events.size());
  EXPECT_EQ(out->template_events, 6u);  // begin, free, 2 allocs, free, end
  EXPECT_EQ(out->carried_frees, 1u);
  EXPECT_EQ(out->dropped_frees, 0u);
  EXPECT_EQ(out->lasting_allocs, 0u);
  ASSERT_EQ(out->trace.events.size(), trace.events.size() + 12);
  // The first copy frees the template's gradient, the second the first
  // copy's.
  const auto& e = out->trace.events;
  const size_t first = trace.events.size();
  const uint64_t template_grad = trace.events[first - 3].id;
  EXPECT_EQ(e[first].kind, EventKind::kIterationBegin);
  EXPECT_EQ(e[first].id, 3u);
  EXPECT_EQ(e[first + 1].kind, EventKind::kFree);
  EXPECT_EQ(e[first + 1].id, template_grad);
  const uint64_t copy_grad = e[first + 3].id;
  EXPECT_EQ(e[first + 3].size, 4096u);
  EXPECT_EQ(e[first + 7].id, copy_grad);  // freed by the second copy
  EXPECT_EQ(e[first + 11].kind, EventKind::kIterationEnd);
  EXPECT_EQ(e[first + 11].id, 4u);
}

TEST(RepeatTest, KeepsOnlyTheIterationsAsked) {
  const plan::Trace trace = Training();
  StatusOr<RepeatedTrace> out =
      RepeatSteadyIteration(trace, RepeatOptions{2, 1});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_TRUE(plan::ValidateTrace(out->trace).ok());
  // Iteration 1 is copied in place of iteration 2: the same events.
  EXPECT_EQ(out->trace.events.size(), trace.events.size());
  for (size_t t = 0; t < trace.events.size(); ++t) {
    EXPECT_EQ(out->trace.events[t].kind, trace.events[t].kind) << t;
    EXPECT_EQ(out->trace.events[t].size, trace.events[t].size) << t;
  }
}

TEST(RepeatTest, AFreeWithoutCounterpartIsLeftOutAndALastingAllocStays) {
  plan::Trace t;
  t.events.push_back(Event::Alloc(1, 100));  // freed once, in iteration 0
  t.events.push_back(Event::IterationBegin(0));
  t.events.push_back(Event::Free(1));
  t.events.push_back(Event::Alloc(2, 300));  // never freed
  t.events.push_back(Event::IterationEnd(0));
  StatusOr<RepeatedTrace> out = RepeatSteadyIteration(t, RepeatOptions{1, 3});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_TRUE(plan::ValidateTrace(out->trace).ok());
  EXPECT_EQ(out->dropped_frees, 1u);
  EXPECT_EQ(out->lasting_allocs, 1u);
  EXPECT_EQ(out->trace.events.size(), t.events.size() + 3 * 3);
}

// Live bytes at each iteration's end marker.
std::vector<uint64_t> LiveAtIterationEnds(const plan::Trace& trace) {
  std::unordered_map<uint64_t, uint64_t> live;
  uint64_t bytes = 0;
  std::vector<uint64_t> out;
  for (const Event& e : trace.events) {
    if (e.kind == EventKind::kAlloc) {
      live[e.id] = e.size;
      bytes += e.size;
    } else if (e.kind == EventKind::kFree) {
      bytes -= live.at(e.id);
      live.erase(e.id);
    } else if (e.kind == EventKind::kIterationEnd) {
      out.push_back(bytes);
    }
  }
  return out;
}

// A perturbed template: its gradient resized (the free of the previous
// iteration's 4096 bytes, a 4608-byte one made) and an added request never
// freed. By size nothing matches: the copies drop the free and keep both
// requests live, growing by 4608 + 700 bytes each. A stationary repeat
// pairs the gradient whatever its size and makes the added request once.
TEST(RepeatTest, AStationaryRepeatCarriesAnySizeAndMakesLeftoversOnce) {
  plan::Trace t;
  t.events.push_back(Event::IterationBegin(0));
  t.events.push_back(Event::Alloc(1, 4096));  // gradient
  t.events.push_back(Event::IterationEnd(0));
  t.events.push_back(Event::IterationBegin(1));
  t.events.push_back(Event::Free(1));
  t.events.push_back(Event::Alloc(2, 1 << 20));  // activation
  t.events.push_back(Event::Alloc(3, 4608));     // gradient, resized
  t.events.push_back(Event::Alloc(4, 700));      // added, never freed
  t.events.push_back(Event::Free(2));
  t.events.push_back(Event::IterationEnd(1));

  StatusOr<RepeatedTrace> by_size = RepeatSteadyIteration(t, {2, 3});
  ASSERT_TRUE(by_size.ok()) << by_size.status().ToString();
  EXPECT_EQ(by_size->dropped_frees, 1u);
  EXPECT_EQ(by_size->lasting_allocs, 2u);
  EXPECT_EQ(LiveAtIterationEnds(by_size->trace),
            (std::vector<uint64_t>{4096, 5308, 10616, 15924, 21232}));

  StatusOr<RepeatedTrace> stationary = RepeatSteadyIteration(
      t, {.keep = 2, .copies = 3, .carry_any_size = true});
  ASSERT_TRUE(stationary.ok()) << stationary.status().ToString();
  EXPECT_TRUE(plan::ValidateTrace(stationary->trace).ok());
  EXPECT_EQ(stationary->carried_frees, 1u);
  EXPECT_EQ(stationary->dropped_frees, 0u);
  EXPECT_EQ(stationary->lasting_allocs, 0u);
  EXPECT_EQ(LiveAtIterationEnds(stationary->trace),
            (std::vector<uint64_t>{4096, 5308, 5308, 5308, 5308}));
}

// The same on a perturbed training loop whose gradients cross the
// boundary (freed by the next iteration's zero_grad): every copy ends with
// the same live bytes; by size alone the copies drift.
TEST(RepeatTest, APerturbedTrainingLoopRepeatsStationary) {
  plan::Trace t;
  uint64_t id = 1;
  std::vector<uint64_t> grads;
  for (uint64_t it = 0; it < 4; ++it) {
    t.events.push_back(Event::IterationBegin(it));
    for (uint64_t g : grads) t.events.push_back(Event::Free(g));
    grads.clear();
    for (int layer = 0; layer < 8; ++layer) {
      const uint64_t act = id++;
      t.events.push_back(Event::Alloc(act, 1 << 20));
      grads.push_back(id);
      t.events.push_back(Event::Alloc(id++, 65536));
      t.events.push_back(Event::Free(act));
    }
    t.events.push_back(Event::IterationEnd(it));
  }
  const plan::Trace perturbed =
      Perturb(t, PerturbOptions{.add = 0.3, .resize = 0.5, .seed = 3});
  const int64_t keep = CompleteIterations(perturbed, 1);
  ASSERT_EQ(keep, 4);
  StatusOr<RepeatedTrace> out = RepeatSteadyIteration(
      perturbed, {.keep = keep, .copies = 4, .carry_any_size = true});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_TRUE(plan::ValidateTrace(out->trace).ok());
  EXPECT_EQ(out->lasting_allocs, 0u);
  const std::vector<uint64_t> live = LiveAtIterationEnds(out->trace);
  ASSERT_EQ(live.size(), static_cast<size_t>(keep + 4));
  for (size_t i = keep + 1; i < live.size(); ++i)
    EXPECT_EQ(live[i], live[keep]) << i;
  StatusOr<RepeatedTrace> by_size = RepeatSteadyIteration(perturbed, {keep, 4});
  ASSERT_TRUE(by_size.ok());
  const std::vector<uint64_t> drifting = LiveAtIterationEnds(by_size->trace);
  EXPECT_NE(drifting.back(), drifting[keep]);
}

TEST(RepeatTest, ThenRepeatCopiesTheLastCompleteIteration) {
  const plan::Trace trace = Training();  // iterations 0..2
  StatusOr<plan::Trace> out = ThenRepeatLastIteration(trace, 2);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_TRUE(plan::ValidateTrace(*out).ok());
  EXPECT_EQ(CompleteIterations(*out, 1), 5);
  EXPECT_EQ(LiveAtIterationEnds(*out),
            (std::vector<uint64_t>{4096 + 4096 + 8192, 4096 + 4096 + 8192,
                                   4096 + 4096 + 8192, 4096 + 4096 + 8192,
                                   4096 + 4096 + 8192}));
  StatusOr<plan::Trace> none = ThenRepeatLastIteration(trace, 0);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->events.size(), trace.events.size());
  EXPECT_FALSE(ThenRepeatLastIteration(trace, -1).ok());
  plan::Trace unmarked;  // one step without iteration markers
  unmarked.events.push_back(Event::Alloc(1, 4096));
  unmarked.events.push_back(Event::Free(1));
  StatusOr<plan::Trace> refused = ThenRepeatLastIteration(unmarked, 1);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("last complete iteration"),
            std::string::npos)
      << refused.status().message();
}

TEST(RepeatTest, Errors) {
  const plan::Trace trace = Training();
  EXPECT_FALSE(RepeatSteadyIteration(trace, RepeatOptions{0, 1}).ok());
  EXPECT_FALSE(RepeatSteadyIteration(trace, RepeatOptions{1, -1}).ok());
  // No iteration 4 to copy.
  EXPECT_FALSE(RepeatSteadyIteration(trace, RepeatOptions{5, 1}).ok());
  // Iteration 2 is not complete without its end marker.
  plan::Trace open = trace;
  open.events.pop_back();
  EXPECT_FALSE(RepeatSteadyIteration(open, RepeatOptions{3, 1}).ok());
}

TEST(RepeatTest, CountsTheCompleteIterations) {
  const plan::Trace trace = Training();
  EXPECT_EQ(CompleteIterations(trace, 0), 3);
  EXPECT_EQ(CompleteIterations(trace, 2), 3);
  for (int64_t keep = 1; keep <= 3; ++keep)
    EXPECT_TRUE(RepeatSteadyIteration(trace, RepeatOptions{keep, 0}).ok());
  plan::Trace open = trace;  // iteration 2 without its end marker
  open.events.pop_back();
  EXPECT_EQ(CompleteIterations(open, 0), 2);
  EXPECT_FALSE(RepeatSteadyIteration(open, RepeatOptions{3, 0}).ok());
}

TEST(RepeatTest, ABuiltinWorkloadRepeatsIntoAValidTrace) {
  StatusOr<Workload> w = LoadWorkload("builtin:dense");
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  StatusOr<RepeatedTrace> out =
      RepeatSteadyIteration(w->trace, RepeatOptions{2, 4});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_TRUE(plan::ValidateTrace(out->trace).ok());
  EXPECT_EQ(out->dropped_frees, 0u);
}

}  // namespace
}  // namespace loom::whatif
