#include "whatif/loom/plan_check.h"

#include <gtest/gtest.h>

#include <string>

#include "base/byte_stream.h"
#include "plan/planfile/plan_file.h"
#include "plan/trace/trace.h"
#include "vmm/runtime_plan.h"
#include "whatif/loom/self_plan.h"
#include "whatif/workloads/load.h"

namespace loom::whatif {
namespace {

constexpr uint64_t kG = uint64_t{2} << 20;
constexpr int kN = 8;

// kN buffers of one granule, laid one after the other (the plan of a
// request sequence where all of them live together at the middle).
vmm::RuntimePlan Stack() {
  vmm::RuntimePlan plan;
  plan.period = 2 * kN;
  for (int i = 0; i < kN; ++i)
    plan.iteration.push_back({kG, static_cast<int64_t>(i * kG), i, 2 * kN - i});
  plan.region_bytes = kN * kG;
  return plan;
}

// Four iterations of kN one-granule requests: all live together (`nested`)
// or each freed before the next one comes.
plan::Trace Iterations(bool nested) {
  plan::Trace trace;
  trace.header.granularity = kG;
  uint64_t id = 0;
  for (uint64_t it = 0; it < 4; ++it) {
    trace.events.push_back(plan::Event::IterationBegin(it));
    const uint64_t first = id;
    for (int i = 0; i < kN; ++i) {
      trace.events.push_back(plan::Event::Alloc(id, kG));
      if (!nested) trace.events.push_back(plan::Event::Free(id));
      ++id;
    }
    if (nested) {
      for (uint64_t k = id; k > first; --k)
        trace.events.push_back(plan::Event::Free(k - 1));
    }
    trace.events.push_back(plan::Event::IterationEnd(it));
  }
  return trace;
}

TEST(PlanCheckTest, APlanThatFitsItsRecordingEarnsItsPlace) {
  StatusOr<PlanCheck> check =
      CheckPlanOnRecording(Iterations(/*nested=*/true), Stack(), kG);
  ASSERT_TRUE(check.ok()) << check.status().ToString();
  // No persistent buffer: installed after the recorded iterations, as auto
  // mode installs its plan, then the last iteration twice more.
  EXPECT_TRUE(check->mid_run);
  EXPECT_EQ(check->unplanned_peak_reserved, kN * kG);
  EXPECT_EQ(check->planned_peak_reserved, kN * kG);
  EXPECT_EQ(check->peak_allocated, kN * kG);
  EXPECT_TRUE(check->earns_its_place);
}

TEST(PlanCheckTest, APlanThatHoldsMoreOnItsRecordingDoesNot) {
  // The requests never live together: without a plan one granule serves
  // them all; the plan backs a granule per request until the referee stops
  // it (plan_referee.h), more than the slack (one granule) above.
  StatusOr<PlanCheck> check =
      CheckPlanOnRecording(Iterations(/*nested=*/false), Stack(), kG);
  ASSERT_TRUE(check.ok()) << check.status().ToString();
  EXPECT_TRUE(check->mid_run);
  EXPECT_EQ(check->unplanned_peak_reserved, kG);
  EXPECT_GT(check->planned_peak_reserved, check->unplanned_peak_reserved + kG);
  EXPECT_FALSE(check->earns_its_place);
  EXPECT_NE(check->Summary().find("does not earn its place"),
            std::string::npos);
  EXPECT_NE(check->Json().find("\"earns_its_place\":false"), std::string::npos);
}

// The generated MoE workload, planned from its own trace: its experts'
// requests live in the dynamic space beside the region, and on this seed
// the two together hold more than the dynamic space serving everything
// (bench/results/misses.md, fifth session). A dense one earns its place.
TEST(PlanCheckTest, OnGeneratedWorkloads) {
  SelfPlanOptions options;
  options.time_limit_seconds = 2;
  StatusOr<Workload> moe = LoadWorkload("builtin:moe:seed=2");
  ASSERT_TRUE(moe.ok()) << moe.status().ToString();
  StatusOr<SelfPlan> moe_plan = PlanTraceForRuntime(moe->trace, options);
  ASSERT_TRUE(moe_plan.ok()) << moe_plan.status().ToString();
  StatusOr<PlanCheck> moe_check =
      CheckPlanOnRecording(moe->trace, moe_plan->runtime, options.granularity);
  ASSERT_TRUE(moe_check.ok()) << moe_check.status().ToString();
  EXPECT_FALSE(moe_check->mid_run);  // it has persistent buffers
  EXPECT_FALSE(moe_check->earns_its_place) << moe_check->Summary();
  EXPECT_GT(moe_check->planned_peak_reserved,
            moe_check->unplanned_peak_reserved + moe_check->slack);

  StatusOr<Workload> dense = LoadWorkload("builtin:dense:seed=2");
  ASSERT_TRUE(dense.ok()) << dense.status().ToString();
  StatusOr<SelfPlan> dense_plan = PlanTraceForRuntime(dense->trace, options);
  ASSERT_TRUE(dense_plan.ok()) << dense_plan.status().ToString();
  StatusOr<PlanCheck> dense_check = CheckPlanOnRecording(
      dense->trace, dense_plan->runtime, options.granularity);
  ASSERT_TRUE(dense_check.ok()) << dense_check.status().ToString();
  EXPECT_TRUE(dense_check->earns_its_place) << dense_check->Summary();
  EXPECT_LT(dense_check->planned_peak_reserved,
            dense_check->unplanned_peak_reserved);
}

// A plan file with one buffer (what a section rides on).
plan::PlanFile OneBufferPlan() {
  plan::PlanFile file;
  file.source = "test";
  file.granule_bytes = kG;
  file.buffers.push_back({0, 0, kG, 0, 1, 1});
  file.peak_bytes = file.lower_bound_bytes = kG;
  file.peak_granules = 1;
  file.region_size = kG;
  return file;
}

PlanCheck Losing() {
  PlanCheck check;
  check.mid_run = true;
  check.planned_peak_reserved = 12 * kG;
  check.unplanned_peak_reserved = 10 * kG;
  check.peak_allocated = 9 * kG;
  check.slack = kG;
  check.earns_its_place = false;
  return check;
}

TEST(PlanCheckSectionTest, TheCheckTravelsWithThePlanFile) {
  plan::PlanFile file = OneBufferPlan();
  StatusOr<std::optional<PlanCheck>> none = RecordedPlanCheck(file, "p");
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_FALSE(none->has_value());  // made without the check

  RecordPlanCheck(Losing(), file);
  // Through the file's bytes, as `loom plan` writes them and plan mode reads
  // them.
  StatusOr<plan::PlanFile> read =
      plan::DecodePlanFile(plan::EncodePlanFile(file), "p");
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  StatusOr<std::optional<PlanCheck>> back = RecordedPlanCheck(*read, "p");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_TRUE(back->has_value());
  EXPECT_EQ((*back)->Json(), Losing().Json());

  // Recorded again (a re-check): replaced, never two.
  PlanCheck earns = Losing();
  earns.planned_peak_reserved = 10 * kG;
  earns.mid_run = false;
  earns.earns_its_place = true;
  RecordPlanCheck(earns, file);
  int sections = 0;
  for (const plan::PlanSection& s : file.extra)
    sections += s.tag == kPlanCheckTag;
  EXPECT_EQ(sections, 1);
  back = RecordedPlanCheck(file, "p");
  ASSERT_TRUE(back.ok() && back->has_value());
  EXPECT_EQ((*back)->Json(), earns.Json());
}

// The CHEK payload with these varints.
plan::PlanFile WithPayload(std::initializer_list<uint64_t> fields,
                           std::string tail = "") {
  plan::PlanFile file = OneBufferPlan();
  std::string payload;
  for (uint64_t v : fields) plan::AppendVarint(&payload, v);
  file.extra.push_back({kPlanCheckTag, false, payload + tail});
  return file;
}

TEST(PlanCheckSectionTest, ACorruptSectionIsRefusedWithItsReason) {
  const uint64_t g = kG;
  struct Case {
    plan::PlanFile file;
    std::string reason;
  };
  const Case cases[] = {
      {WithPayload({1, 2, 10 * g, 10 * g}), "bad allocated peak"},
      {WithPayload({2, 2, 10 * g, 10 * g, 9 * g, g}), "version 2"},
      {WithPayload({1, 6, 10 * g, 10 * g, 9 * g, g}), "unknown flags"},
      {WithPayload({1, 2, uint64_t{1} << 51, 10 * g, 9 * g, g}), "absurd"},
      {WithPayload({1, 2, 10 * g, 10 * g, 9 * g, g}, "x"), "after the payload"},
      {WithPayload({1, 2, 10 * g, 10 * g, 11 * g, g}), "more than reserved"},
      // Says it earns its place, holding 2 granules above with 1 of slack.
      {WithPayload({1, 2, 12 * g, 10 * g, 9 * g, g}), "contradicts"},
      {WithPayload({1, 0, 10 * g, 10 * g, 9 * g, g}), "contradicts"},
  };
  for (const Case& c : cases) {
    StatusOr<std::optional<PlanCheck>> read =
        RecordedPlanCheck(c.file, "bad.plan");
    ASSERT_FALSE(read.ok()) << c.reason;
    EXPECT_EQ(read.status().code(), StatusCode::kDataLoss) << c.reason;
    EXPECT_NE(read.status().message().find("bad.plan: CHEK: "),
              std::string::npos)
        << read.status().ToString();
    EXPECT_NE(read.status().message().find(c.reason), std::string::npos)
        << c.reason << ": " << read.status().ToString();
  }
  // The same figures, consistent: read.
  StatusOr<std::optional<PlanCheck>> good =
      RecordedPlanCheck(WithPayload({1, 3, 12 * g, 10 * g, 9 * g, 2 * g}), "p");
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_TRUE((*good)->earns_its_place && (*good)->mid_run);
}

}  // namespace
}  // namespace loom::whatif
