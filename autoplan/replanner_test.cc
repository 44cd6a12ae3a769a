// Replanner: a shape of iteration the plan never saw is recorded, planned
// and installed as a variant; from then on both shapes hit their plans with
// no driver call; a recording that cannot be planned is reported.
#include "autoplan/replanner.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "vmm/fake_driver.h"
#include "vmm/plan_loader.h"

namespace loom::autoplan {
namespace {

constexpr uint64_t kG = 64 << 10;
constexpr uint64_t kWeights = uint64_t{2} << 30;

// Opens iteration `number` (the re-planner first, at its boundary) and
// frees the buffer the previous iteration carried into it, if any.
void BeginIteration(vmm::Allocator& a, uint64_t number, Replanner* replanner,
                    vmm::DevicePtr* carried) {
  if (replanner != nullptr) replanner->BeforeIterationBegin();
  a.IterationBegin(number);
  if (carried != nullptr && *carried != 0) {
    ASSERT_TRUE(a.Free(*carried).ok());
    *carried = 0;
  }
}

// One iteration of a shape: buffers of `unit` bytes and multiples,
// allocated and freed in a fixed nesting (an activation stack). With
// `state`, the iteration also makes `state_bytes` that live on (appended
// there): what a run's first step makes for good, an optimizer's state.
// With `carried`, a buffer made at the iteration's end lives into the next
// one, which frees it first (a gradient freed by the next step).
void RunIteration(vmm::Allocator& a, uint64_t unit, uint64_t number,
                  Replanner* replanner, uint64_t state_bytes = 0,
                  std::vector<vmm::DevicePtr>* state = nullptr,
                  vmm::DevicePtr* carried = nullptr) {
  ASSERT_NO_FATAL_FAILURE(BeginIteration(a, number, replanner, carried));
  std::vector<vmm::DevicePtr> live;
  for (uint64_t i = 1; i <= 6; ++i) {
    StatusOr<vmm::DevicePtr> p = a.Allocate(unit * i, 0);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    live.push_back(*p);
  }
  if (state != nullptr) {
    StatusOr<vmm::DevicePtr> p = a.Allocate(state_bytes, 0);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    state->push_back(*p);
  }
  for (int i = 0; i < 40; ++i) {  // short-lived temporaries
    StatusOr<vmm::DevicePtr> t = a.Allocate(unit / 2 + 512 * i, 0);
    ASSERT_TRUE(t.ok());
    ASSERT_TRUE(a.Free(*t).ok());
  }
  while (!live.empty()) {
    ASSERT_TRUE(a.Free(live.back()).ok());
    live.pop_back();
  }
  if (carried != nullptr) {
    StatusOr<vmm::DevicePtr> p = a.Allocate(unit * 7, 0);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    *carried = *p;
  }
  a.IterationEnd(number);
  a.CheckInvariants();
}

class ReplannerTest : public ::testing::Test {
 protected:
  ReplannerTest() {
    vmm::FakeDriverOptions o;
    o.granularity = kG;
    o.capacity_per_device = kWeights + 4096 * kG;
    driver_ = std::make_unique<vmm::FakeDriver>(o);
    vmm::AllocatorOptions options;
    options.record_capacity = 100000;
    allocator_ = std::move(vmm::Allocator::Create(*driver_, options)).value();
  }
  // Records two iterations of shape `unit` and installs their plan.
  void PlanShape(uint64_t unit, vmm::DevicePtr* carried = nullptr) {
    RunIteration(*allocator_, unit, 0, nullptr, 0, nullptr, carried);
    RunIteration(*allocator_, unit, 1, nullptr, 0, nullptr, carried);
    plan::MakePlanOptions make;
    make.time_limit_seconds = 1;
    make.granule_bytes = kG;
    make.include_persistent = false;
    StatusOr<plan::MadePlan> made =
        plan::MakePlan(allocator_->TakeTrace(), make);
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    allocator_->StopRecording();
    StatusOr<vmm::RuntimePlan> plan =
        vmm::ToRuntimePlan(made->file, "test", kG);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    ASSERT_TRUE(allocator_->LoadPlan(*plan).ok());
  }
  uint64_t DriverCalls() const {
    uint64_t n = 0;
    for (vmm::DriverOp op :
         {vmm::DriverOp::kCreate, vmm::DriverOp::kMap, vmm::DriverOp::kUnmap,
          vmm::DriverOp::kRelease, vmm::DriverOp::kSetAccess}) {
      n += driver_->calls(op);
    }
    return n;
  }

  std::unique_ptr<vmm::FakeDriver> driver_;
  std::unique_ptr<vmm::Allocator> allocator_;
};

TEST_F(ReplannerTest, ANewShapeBecomesAVariantAndBothShapesHit) {
  constexpr uint64_t kA = 3 * kG, kB = 5 * kG;  // two "sequence lengths"
  PlanShape(kA);
  ReplanOptions options;
  options.plan_options.time_limit_seconds = 1;
  Replanner replanner(*allocator_, options);
  uint64_t n = 2;
  RunIteration(*allocator_, kA, n++, &replanner);
  EXPECT_FALSE(allocator_->PlanSuspended());
  // Shape B: the plan does not fit it (suspended). Nothing lives past an
  // iteration's end, so the iteration is planned at the next boundary and
  // its variant serves the next iteration.
  RunIteration(*allocator_, kB, n++, &replanner);
  EXPECT_TRUE(allocator_->PlanSuspended());
  RunIteration(*allocator_, kB, n++, &replanner);  // served by the variant
  EXPECT_EQ(replanner.stats().state, "watching");
  EXPECT_EQ(replanner.stats().attempts, 1u);
  EXPECT_EQ(replanner.stats().replans, 1u) << replanner.stats().last_error;
  EXPECT_EQ(allocator_->plan_variants(), 2u);
  EXPECT_FALSE(allocator_->PlanSuspended());
  // Alternating shapes: each iteration picks its variant by its first
  // requests, every planned request hits, and after one round no driver
  // call is made.
  RunIteration(*allocator_, kA, n++, &replanner);
  RunIteration(*allocator_, kB, n++, &replanner);
  const uint64_t calls = DriverCalls();
  const vmm::AllocatorStats before = allocator_->stats();
  for (int round = 0; round < 4; ++round) {
    RunIteration(*allocator_, round % 2 == 0 ? kA : kB, n++, &replanner);
    EXPECT_FALSE(allocator_->PlanSuspended()) << "round " << round;
  }
  const vmm::AllocatorStats after = allocator_->stats();
  EXPECT_EQ(after.plan_misses, before.plan_misses);
  EXPECT_EQ(after.plan_hits - before.plan_hits, 4u * 46u);
  EXPECT_GE(after.variant_switches - before.variant_switches, 3u);
  EXPECT_EQ(DriverCalls(), calls) << "driver calls in steady state";
  EXPECT_EQ(replanner.stats().attempts, 1u) << "nothing more to plan";
}

TEST_F(ReplannerTest, AnIterationWhoseRequestsLiveOnIsPlannedAfterTheNext) {
  // A buffer made at each iteration's end is freed by the next iteration:
  // the iteration that did not fit is recorded through the next one (the
  // carried buffer's lifetime ends there) and planned after it.
  constexpr uint64_t kA = 3 * kG, kB = 5 * kG;
  vmm::DevicePtr carried = 0;
  PlanShape(kA, &carried);
  ReplanOptions options;
  options.plan_options.time_limit_seconds = 1;
  Replanner replanner(*allocator_, options);
  uint64_t n = 2;
  auto run = [&](uint64_t unit) {
    RunIteration(*allocator_, unit, n++, &replanner, 0, nullptr, &carried);
  };
  run(kA);
  run(kB);  // suspended
  EXPECT_TRUE(allocator_->PlanSuspended());
  run(kB);  // recorded on
  EXPECT_EQ(replanner.stats().state, "extending");
  EXPECT_EQ(replanner.stats().attempts, 0u);
  run(kB);  // planned at its boundary
  EXPECT_EQ(replanner.stats().attempts, 1u);
  // The variant is judged as any plan: here it would hold more than loom
  // held serving the iteration dynamically (its first misses took bytes
  // the plan left idle, the rest the region's idle bytes), so it is
  // refused and the plans stop serving; nothing is lost.
  EXPECT_EQ(replanner.stats().replans, 0u);
  EXPECT_EQ(allocator_->stats().plan_variants_refused, 1u);
  EXPECT_NE(replanner.stats().last_error.find("the variant would hold"),
            std::string::npos)
      << replanner.stats().last_error;
  EXPECT_EQ(allocator_->plan_variants(), 1u);
  const vmm::AllocatorStats before = allocator_->stats();
  run(kB);
  const vmm::AllocatorStats after = allocator_->stats();
  EXPECT_EQ(after.plan_hits, before.plan_hits);
  EXPECT_EQ(after.reserved_bytes.peak, before.reserved_bytes.peak)
      << "served dynamically within what was held";
  ASSERT_TRUE(allocator_->Free(carried).ok());
}

// One iteration whose order fragments a dynamic space: pairs of a large
// and a small buffer (1.5 and 0.5 units, sharing granules), the large ones
// freed, then one of 32 units while the small ones live, and a carried
// buffer freed by the next iteration. Served as it comes, the 32 units find
// no hole (every granule between the holes holds a small buffer); a plan
// puts the small buffers together and the 32 units where the large ones
// were.
void RunFragmentingIteration(vmm::Allocator& a, uint64_t unit, uint64_t number,
                             Replanner* replanner, vmm::DevicePtr* carried) {
  ASSERT_NO_FATAL_FAILURE(BeginIteration(a, number, replanner, carried));
  std::vector<vmm::DevicePtr> large, small;
  for (int i = 0; i < 24; ++i) {
    StatusOr<vmm::DevicePtr> l = a.Allocate(unit + unit / 2, 0);
    StatusOr<vmm::DevicePtr> s = a.Allocate(unit / 2, 0);
    ASSERT_TRUE(l.ok() && s.ok());
    large.push_back(*l);
    small.push_back(*s);
  }
  for (vmm::DevicePtr p : large) ASSERT_TRUE(a.Free(p).ok());
  StatusOr<vmm::DevicePtr> wide = a.Allocate(32 * unit, 0);
  ASSERT_TRUE(wide.ok()) << wide.status().ToString();
  ASSERT_TRUE(a.Free(*wide).ok());
  for (vmm::DevicePtr p : small) ASSERT_TRUE(a.Free(p).ok());
  StatusOr<vmm::DevicePtr> c = a.Allocate(unit, 0);
  ASSERT_TRUE(c.ok());
  *carried = *c;
  a.IterationEnd(number);
  a.CheckInvariants();
}

TEST_F(ReplannerTest, AVariantWithABufferLivingIntoTheNextIterationHits) {
  // Shape B fragments the dynamic space (RunFragmentingIteration) and
  // carries a buffer into the next iteration: its variant is planned after
  // the next iteration (the carried buffer's lifetime ends there), holds
  // less than serving it dynamically did (so it is installed, not
  // refused), and serves every later B iteration with all hits, the
  // carried buffer included, and no driver call.
  constexpr uint64_t kA = kG, kB = 3 * kG;
  vmm::DevicePtr carried = 0;
  for (uint64_t it = 0; it < 2; ++it)
    RunFragmentingIteration(*allocator_, kA, it, nullptr, &carried);
  plan::MakePlanOptions make;
  make.time_limit_seconds = 1;
  make.granule_bytes = kG;
  make.include_persistent = false;
  StatusOr<plan::MadePlan> made = plan::MakePlan(allocator_->TakeTrace(), make);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  allocator_->StopRecording();
  StatusOr<vmm::RuntimePlan> plan = vmm::ToRuntimePlan(made->file, "test", kG);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_TRUE(allocator_->LoadPlan(*plan).ok());

  ReplanOptions options;
  options.plan_options.time_limit_seconds = 1;
  Replanner replanner(*allocator_, options);
  uint64_t n = 2;
  auto run = [&](uint64_t unit) {
    RunFragmentingIteration(*allocator_, unit, n++, &replanner, &carried);
  };
  run(kA);
  run(kB);  // suspended
  EXPECT_TRUE(allocator_->PlanSuspended());
  run(kB);  // recorded on: the carried buffer ends here
  EXPECT_EQ(replanner.stats().attempts, 0u);
  run(kB);  // planned at its boundary
  EXPECT_EQ(replanner.stats().attempts, 1u);
  EXPECT_EQ(replanner.stats().replans, 1u) << replanner.stats().last_error;
  EXPECT_EQ(allocator_->stats().plan_variants_refused, 0u);
  EXPECT_EQ(allocator_->plan_variants(), 2u);
  run(kB);
  const uint64_t calls = DriverCalls();
  const vmm::AllocatorStats before = allocator_->stats();
  run(kB);
  run(kB);
  const vmm::AllocatorStats after = allocator_->stats();
  EXPECT_FALSE(allocator_->PlanSuspended());
  // 24 pairs, the 32 units and the carried buffer, per iteration.
  EXPECT_EQ(after.plan_hits - before.plan_hits, 2u * 50u);
  EXPECT_EQ(after.plan_misses, before.plan_misses);
  EXPECT_EQ(after.reserved_bytes.peak, before.reserved_bytes.peak);
  EXPECT_EQ(DriverCalls(), calls) << "driver calls in steady state";
  ASSERT_TRUE(allocator_->Free(carried).ok());
}

TEST_F(ReplannerTest, WhatTheRecordedIterationMadeForGoodIsNotPlanned) {
  // The first iteration of the new shape is also the one that makes
  // state for good (a run restarted with another micro-batch: its first
  // step makes the optimizer's state). The variant planned from it leaves
  // that state where it is: laid out in the variant too, it would hold
  // its bytes in every iteration after, for requests that never come
  // again, and the variant would hold more than loom ever held (refused,
  // the plans lost).
  constexpr uint64_t kA = 3 * kG, kB = 5 * kG, kState = 64 * kG;
  PlanShape(kA);
  ReplanOptions options;
  options.plan_options.time_limit_seconds = 1;
  Replanner replanner(*allocator_, options);
  uint64_t n = 2;
  RunIteration(*allocator_, kA, n++, &replanner);  // starts watching
  std::vector<vmm::DevicePtr> state;
  RunIteration(*allocator_, kB, n++, &replanner, kState, &state);
  EXPECT_TRUE(allocator_->PlanSuspended());
  RunIteration(*allocator_, kB, n++, &replanner);  // served by the variant
  EXPECT_EQ(replanner.stats().replans, 1u) << replanner.stats().last_error;
  EXPECT_EQ(allocator_->stats().plan_variants_refused, 0u);
  EXPECT_EQ(allocator_->plan_variants(), 2u);
  const vmm::AllocatorStats before = allocator_->stats();
  RunIteration(*allocator_, kB, n++, &replanner);
  const vmm::AllocatorStats after = allocator_->stats();
  EXPECT_FALSE(allocator_->PlanSuspended());
  EXPECT_EQ(after.plan_hits - before.plan_hits, 46u);
  EXPECT_EQ(after.plan_misses, before.plan_misses);
  EXPECT_EQ(after.reserved_bytes.peak, before.reserved_bytes.peak);
  for (vmm::DevicePtr p : state) ASSERT_TRUE(allocator_->Free(p).ok());
}

TEST_F(ReplannerTest, PlansInTheBackgroundAndInstallsAtABoundary) {
  constexpr uint64_t kA = 2 * kG, kB = 7 * kG;
  PlanShape(kA);
  ReplanOptions options;
  options.background = true;
  options.plan_options.time_limit_seconds = 1;
  Replanner replanner(*allocator_, options);
  uint64_t n = 2;
  RunIteration(*allocator_, kB, n++, &replanner);  // suspended, recorded
  // Planning runs on its thread; each boundary checks whether it is done.
  for (int i = 0; i < 500 && replanner.stats().replans == 0; ++i) {
    RunIteration(*allocator_, kB, n++, &replanner);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(replanner.stats().replans, 1u) << replanner.stats().last_error;
  EXPECT_EQ(allocator_->plan_variants(), 2u);
  RunIteration(*allocator_, kB, n++, &replanner);
  EXPECT_FALSE(allocator_->PlanSuspended());
}

TEST_F(ReplannerTest, NothingIsRecordedWhileThePlanFits) {
  PlanShape(4 * kG);
  Replanner replanner(*allocator_, ReplanOptions{});
  for (uint64_t n = 2; n < 8; ++n) {
    RunIteration(*allocator_, 4 * kG, n, &replanner);
  }
  EXPECT_EQ(replanner.stats().attempts, 0u);
  EXPECT_EQ(replanner.stats().state, "watching");
  EXPECT_TRUE(allocator_->recording()) << "one iteration at a time";
  EXPECT_LT(allocator_->stats().trace_events, 200u);
}

TEST_F(ReplannerTest, APlanThatCannotBeMadeIsAFailureNotACrash) {
  // Weights, most of the memory as in a model: the few MiB the iterations
  // of a new shape hold beside the region stay within the plan referee's
  // slack (1/256 of what is held, plan_referee.h); without them the plan
  // loses to the dynamic space first, and a plan that lost is not
  // re-planned.
  StatusOr<vmm::DevicePtr> weights = allocator_->Allocate(kWeights, 0);
  ASSERT_TRUE(weights.ok()) << weights.status().ToString();
  PlanShape(4 * kG);
  ReplanOptions options;
  options.plan_options.capacity = kG;  // no plan of the new shape fits
  Replanner replanner(*allocator_, options);
  uint64_t n = 2;
  RunIteration(*allocator_, 4 * kG, n++, &replanner);  // starts watching
  RunIteration(*allocator_, 9 * kG, n++, &replanner);  // suspended
  replanner.BeforeIterationBegin();                    // plans: fails
  EXPECT_EQ(replanner.stats().attempts, 1u);
  EXPECT_EQ(replanner.stats().failures, 1u);
  EXPECT_NE(replanner.stats().last_error.find("more than"), std::string::npos)
      << replanner.stats().last_error;
  EXPECT_EQ(allocator_->plan_variants(), 1u);
  allocator_->CheckInvariants();
  ASSERT_TRUE(allocator_->Free(*weights).ok());
}

TEST_F(ReplannerTest, StopsAfterMaxReplans) {
  PlanShape(4 * kG);
  ReplanOptions options;
  options.max_replans = 2;
  options.plan_options.time_limit_seconds = 1;
  Replanner replanner(*allocator_, options);
  uint64_t n = 2;
  RunIteration(*allocator_, 4 * kG, n++, &replanner);
  // A new shape every other iteration: two attempts, then no more.
  for (uint64_t unit :
       {5 * kG, 5 * kG, 6 * kG, 6 * kG, 7 * kG, 7 * kG, 8 * kG, 8 * kG}) {
    RunIteration(*allocator_, unit, n++, &replanner);
  }
  RunIteration(*allocator_, 4 * kG, n++, &replanner);
  EXPECT_EQ(replanner.stats().attempts, 2u);
  EXPECT_EQ(replanner.stats().state, "done");
  EXPECT_EQ(allocator_->plan_variants(), 3u);
}

}  // namespace
}  // namespace loom::autoplan
