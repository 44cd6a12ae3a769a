// Plan files into the allocator's RuntimePlan: requests, region, windows at
// the device's granularity; plans the runtime cannot serve are refused.
#include "vmm/plan_loader.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "plan/make_plan.h"
#include "plan/trace/trace.h"

namespace loom::vmm {
namespace {

constexpr uint64_t kG = 64 << 10;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

// Weights, then three iterations of two requests and a dynamic module.
plan::Trace Training() {
  plan::Trace t;
  t.AddAlloc(1, 3 * kG);
  uint64_t id = 10;
  for (uint64_t it = 0; it < 3; ++it) {
    t.AddIterationBegin(it);
    t.AddPhase("forward");
    const uint64_t a = id++, b = id++, moe = id++;
    t.AddAlloc(a, 5 * kG);
    t.AddAlloc(b, 1000);
    t.AddModuleEnter("moe", true);
    t.AddAlloc(moe, kG * (it + 1));
    t.AddFree(moe);
    t.AddModuleExit("moe");
    t.AddFree(b);
    t.AddFree(a);
    t.AddIterationEnd(it);
  }
  return t;
}

plan::PlanFile MadeFile() {
  plan::MakePlanOptions options;
  options.time_limit_seconds = 1;
  options.granule_bytes = kG;
  StatusOr<plan::MadePlan> made = plan::MakePlan(Training(), options);
  EXPECT_TRUE(made.ok()) << made.status().ToString();
  return made->file;
}

TEST(PlanLoaderTest, RequestsRegionAndWindows) {
  const plan::PlanFile file = MadeFile();
  StatusOr<RuntimePlan> plan = ToRuntimePlan(file, "made", kG);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->region_bytes % kG, 0u);
  EXPECT_GE(plan->region_bytes, file.region_size);
  EXPECT_EQ(plan->period, file.period);
  // The steady iteration's two planned requests, exact sizes, in order.
  ASSERT_EQ(plan->iteration.size(), 2u);
  EXPECT_EQ(plan->iteration[0].size, 5 * kG);
  EXPECT_EQ(plan->iteration[1].size, 1000u);
  for (const PlannedRequest& r : plan->iteration) {
    ASSERT_NE(r.offset, kUnplanned);
    EXPECT_LE(static_cast<uint64_t>(r.offset) + r.size, plan->region_bytes);
    EXPECT_LT(r.start, r.end);
  }
  // The prologue: the weights, then the early iterations' requests.
  ASSERT_FALSE(plan->prologue.empty());
  EXPECT_EQ(plan->prologue[0].size, 3 * kG);
  // One window per dynamic module and phase, idle granules inside the region.
  ASSERT_EQ(plan->windows.size(), 1u);
  EXPECT_EQ(plan->windows[0].module, "moe@forward");
  for (uint32_t k : plan->windows[0].idle_granules) {
    EXPECT_LT(uint64_t{k} * kG, plan->region_bytes);
  }
}

TEST(PlanLoaderTest, CoarserDeviceGranularityRoundsTheRegion) {
  const plan::PlanFile file = MadeFile();
  StatusOr<RuntimePlan> plan = ToRuntimePlan(file, "made", 4 * kG);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->region_bytes % (4 * kG), 0u);
  EXPECT_GE(plan->region_bytes, file.region_size);
}

TEST(PlanLoaderTest, APlanOfABareInstanceIsRefused) {
  plan::Instance instance;
  instance.buffers = {{0, 0, 3, 4096}, {1, 3, 9, 4096}};
  StatusOr<plan::MadePlan> made =
      plan::MakePlan(instance, plan::MakePlanOptions{});
  ASSERT_TRUE(made.ok());
  StatusOr<RuntimePlan> plan = ToRuntimePlan(made->file, "bare.lplan", kG);
  EXPECT_EQ(plan.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(plan.status().message().find("no request table"),
            std::string::npos);
  EXPECT_NE(plan.status().message().find("bare.lplan"), std::string::npos);
}

TEST(PlanLoaderTest, FilesThatAreMissingOrDamagedGiveTheirReason) {
  EXPECT_EQ(ReadRuntimePlan(TempPath("no_such.lplan"), kG).status().code(),
            StatusCode::kNotFound);
  const std::string path = TempPath("damaged.lplan");
  ASSERT_TRUE(plan::WritePlanFile(path, MadeFile()).ok());
  ASSERT_TRUE(ReadRuntimePlan(path, kG).ok());
  // Flip one byte in the middle: the checksum catches it.
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(0, std::ios::end);
  const std::streamoff size = f.tellg();
  f.seekp(size / 2);
  char byte = 0;
  f.seekg(size / 2);
  f.read(&byte, 1);
  byte = static_cast<char>(byte ^ 0x40);
  f.seekp(size / 2);
  f.write(&byte, 1);
  f.close();
  StatusOr<RuntimePlan> damaged = ReadRuntimePlan(path, kG);
  EXPECT_FALSE(damaged.ok());
  EXPECT_NE(damaged.status().message().find("damaged.lplan"),
            std::string::npos)
      << damaged.status().ToString();
}

}  // namespace
}  // namespace loom::vmm
