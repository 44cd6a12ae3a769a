// Plan files into the allocator's RuntimePlan: requests, region, windows at
// the device's granularity; plans the runtime cannot serve are refused.
#include "vmm/plan_loader.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "plan/make_plan.h"
#include "plan/planfile/request_table.h"
#include "plan/trace/trace.h"

namespace loom::vmm {
namespace {

constexpr uint64_t kG = 64 << 10;

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
  EXPECT_EQ(ReadRuntimePlan(::testing::TempDir() + "no_such.lplan", kG)
                .status()
                .code(),
            StatusCode::kNotFound);
  const std::string path = ::testing::TempDir() + "damaged.lplan";
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
  EXPECT_NE(damaged.status().message().find("damaged.lplan"), std::string::npos)
      << damaged.status().ToString();
}

// A cyclic plan (period 40) of a 10000-byte region: a persistent buffer,
// two of the iteration, one idle range for a dynamic window; its request
// table names buffers by id, with an unplanned request in each sequence.
plan::RequestTable HandMadeTable() {
  plan::RequestTable table;
  table.prologue_iterations = 2;
  table.prologue = {{4000, 7, 0, 100}, {300, -1, 0, 3}};
  table.iteration = {{4096, 9, 5, 25}, {1800, 11, 20, 45}, {77, -1, 30, 31}};
  return table;
}

plan::PlanFile HandMade(const plan::RequestTable& table = HandMadeTable()) {
  plan::PlanFile file;
  file.source = "hand-made";
  file.granule_bytes = 4096;
  file.period = 40;
  file.region_size = 10000;
  file.peak_bytes = 10000;
  file.lower_bound_bytes = 9000;
  file.buffers = {{7, 0, 4096, 0, 40, 1},
                  {9, 4096, 4096, 5, 25, 1},
                  {11, 8192, 1808, 20, 45, 1}};
  plan::ReusableSpace space;
  space.window = {10, 30, "moe@forward"};
  space.ranges = {{1000, 9000}};
  space.granules = {{4096, 8192}};
  file.dynamic_spaces = {space};
  file.extra = plan::EncodeRequestTable(table);
  return file;
}

TEST(PlanLoaderTest, HandMadePlanConvertsExactly) {
  StatusOr<RuntimePlan> plan = ToRuntimePlan(HandMade(), "hand.lplan", 4096);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->region_bytes, 12288u);  // 10000 rounded up to 3 granules
  EXPECT_EQ(plan->period, 40);
  EXPECT_EQ(plan->prologue_iterations, 2);
  // Offsets are the planned buffers' (by id), unplanned ones stay so; sizes
  // are the requests' exact sizes, not the buffers'.
  EXPECT_EQ(plan->prologue, (std::vector<PlannedRequest>{
                                {4000, 0, 0, 100}, {300, kUnplanned, 0, 3}}));
  EXPECT_EQ(plan->iteration,
            (std::vector<PlannedRequest>{{4096, 4096, 5, 25},
                                         {1800, 8192, 20, 45},
                                         {77, kUnplanned, 30, 31}}));
  ASSERT_EQ(plan->windows.size(), 1u);
  EXPECT_EQ(plan->windows[0].module, "moe@forward");
  EXPECT_EQ(plan->windows[0].start, 10);
  EXPECT_EQ(plan->windows[0].end, 30);
  EXPECT_EQ(plan->windows[0].idle_granules, (std::vector<uint32_t>{1}));
}

// The idle bytes [1000, 9000) hold the whole device granules inside them,
// whatever granule the planner used.
TEST(PlanLoaderTest, IdleGranulesAreTheDeviceGranulesInsideTheIdleBytes) {
  const plan::PlanFile file = HandMade();
  StatusOr<RuntimePlan> fine = ToRuntimePlan(file, "hand.lplan", 2048);
  ASSERT_TRUE(fine.ok());
  EXPECT_EQ(fine->region_bytes, 10240u);
  EXPECT_EQ(fine->windows[0].idle_granules, (std::vector<uint32_t>{1, 2, 3}));
  StatusOr<RuntimePlan> coarse = ToRuntimePlan(file, "hand.lplan", 8192);
  ASSERT_TRUE(coarse.ok());
  EXPECT_EQ(coarse->region_bytes, 16384u);
  EXPECT_TRUE(coarse->windows[0].idle_granules.empty());
  // Offsets are bytes: the same at any granularity.
  EXPECT_EQ(coarse->iteration, fine->iteration);
}

TEST(PlanLoaderTest, ReadingTheFileGivesTheSamePlan) {
  const std::string path = ::testing::TempDir() + "hand.lplan";
  ASSERT_TRUE(plan::WritePlanFile(path, HandMade()).ok());
  StatusOr<RuntimePlan> read = ReadRuntimePlan(path, 4096);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  StatusOr<RuntimePlan> direct = ToRuntimePlan(HandMade(), path, 4096);
  ASSERT_TRUE(direct.ok());
  EXPECT_EQ(read->region_bytes, direct->region_bytes);
  EXPECT_EQ(read->prologue, direct->prologue);
  EXPECT_EQ(read->iteration, direct->iteration);
  EXPECT_EQ(read->windows[0].idle_granules, direct->windows[0].idle_granules);
  // The same file without its request table: refused, naming the file.
  plan::PlanFile bare = HandMade();
  bare.extra.clear();
  ASSERT_TRUE(plan::WritePlanFile(path, bare).ok());
  StatusOr<RuntimePlan> refused = ReadRuntimePlan(path, 4096);
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(refused.status().message().starts_with(path + ": the plan has "
                                                            "no request table"))
      << refused.status().message();
}

TEST(PlanLoaderTest, AnEmptyRegionStillHasOneGranule) {
  plan::RequestTable table;
  table.iteration = {{512, -1, 0, 1}};
  plan::PlanFile file;
  file.extra = plan::EncodeRequestTable(table);
  StatusOr<RuntimePlan> plan = ToRuntimePlan(file, "empty.lplan", 4096);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->region_bytes, 4096u);
  EXPECT_EQ(plan->iteration,
            (std::vector<PlannedRequest>{{512, kUnplanned, 0, 1}}));
}

TEST(PlanLoaderTest, ARegionAbove2To50BytesIsRefused) {
  plan::PlanFile file = HandMade();
  file.region_size = (uint64_t{1} << 50) + 1;
  StatusOr<RuntimePlan> plan = ToRuntimePlan(file, "huge.lplan", 4096);
  EXPECT_EQ(plan.status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(plan.status().message(),
            "huge.lplan: region of 1125899906842625 bytes");
  file.region_size = uint64_t{1} << 50;
  StatusOr<RuntimePlan> largest = ToRuntimePlan(file, "huge.lplan", 4096);
  ASSERT_TRUE(largest.ok());
  EXPECT_EQ(largest->region_bytes, uint64_t{1} << 50);
}

// A damaged request table is refused with the file, the entry and the
// reason, whatever is wrong with it.
TEST(PlanLoaderTest, DamagedRequestTablesAreRefusedWithTheReason) {
  struct Case {
    std::string what;
    plan::PlanFile file;
    StatusCode code;
    std::string message;
  };
  auto with = [](auto change) {
    plan::RequestTable table = HandMadeTable();
    change(table);
    return HandMade(table);
  };
  auto payload = [](auto change) {
    plan::PlanFile file = HandMade();
    change(file.extra[0].payload);
    return file;
  };
  const std::vector<Case> cases = {
      {"unknown buffer",
       with([](plan::RequestTable& t) { t.iteration[0].buffer = 8; }),
       StatusCode::kOutOfRange, "t.lplan: REQS: entry 2: no buffer with id 8"},
      {"larger than its buffer",
       with([](plan::RequestTable& t) { t.iteration[1].size = 1809; }),
       StatusCode::kOutOfRange,
       "t.lplan: REQS: entry 3: 1809 bytes do not fit buffer 2 (1808 bytes)"},
      {"empty request",
       with([](plan::RequestTable& t) { t.prologue[1].size = 0; }),
       StatusCode::kOutOfRange, "t.lplan: REQS: entry 1: size 0 out of range"},
      {"backwards lifetime",
       with([](plan::RequestTable& t) { t.iteration[2].end = 29; }),
       StatusCode::kOutOfRange, "t.lplan: REQS: entry 4: lifetime [30, 29)"},
      {"negative prologue",
       with([](plan::RequestTable& t) { t.prologue_iterations = -1; }),
       StatusCode::kDataLoss,
       "t.lplan: REQS: negative prologue iteration count"},
      {"truncated", payload([](std::string& p) { p.pop_back(); }),
       StatusCode::kDataLoss,
       "t.lplan: REQS: bad end at payload byte 27: varint runs past the end "
       "of its chunk"},
      {"trailing byte", payload([](std::string& p) { p.push_back(0); }),
       StatusCode::kDataLoss, "t.lplan: REQS: 1 trailing bytes"},
      {"count beyond the payload",
       payload([](std::string& p) { p[2] = 100; }),  // iteration count
       StatusCode::kDataLoss,
       "t.lplan: REQS: 2 + 100 entries cannot fit in 25 bytes"},
  };
  for (const Case& c : cases) {
    StatusOr<RuntimePlan> plan = ToRuntimePlan(c.file, "t.lplan", 4096);
    EXPECT_EQ(plan.status().code(), c.code) << c.what;
    EXPECT_EQ(plan.status().message(), c.message) << c.what;
  }
}

TEST(PlanLoaderTest, EveryTruncationOfAPlanFileIsRefused) {
  const std::string bytes = plan::EncodePlanFile(HandMade());
  const std::string path = ::testing::TempDir() + "cut.lplan";
  for (size_t length = 0; length < bytes.size(); ++length) {
    std::ofstream(path, std::ios::binary | std::ios::trunc)
        << bytes.substr(0, length);
    StatusOr<RuntimePlan> plan = ReadRuntimePlan(path, 4096);
    ASSERT_FALSE(plan.ok()) << "a prefix of " << length << " bytes loaded";
    EXPECT_TRUE(plan.status().message().starts_with(path))
        << plan.status().message();
  }
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  EXPECT_TRUE(ReadRuntimePlan(path, 4096).ok());
}

// Buffers that do not fit the plan's own region never reach the runtime:
// the reader refuses the file.
TEST(PlanLoaderTest, ABufferBeyondTheRegionIsRefused) {
  plan::PlanFile file = HandMade();
  file.region_size = 9999;
  file.peak_bytes = 9999;
  file.dynamic_spaces.clear();
  const std::string path = ::testing::TempDir() + "beyond.lplan";
  ASSERT_TRUE(plan::WritePlanFile(path, file).ok());
  StatusOr<RuntimePlan> plan = ReadRuntimePlan(path, 4096);
  EXPECT_EQ(plan.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(plan.status().message().find("runs past the region size 9999"),
            std::string::npos)
      << plan.status().message();
}

TEST(PlanLoaderDeathTest, TheGranularityMustBeAPowerOfTwo) {
  const plan::PlanFile file = HandMade();
  EXPECT_DEATH(ToRuntimePlan(file, "x", 3000).status().IgnoreError(),
               "granularity");
  EXPECT_DEATH(ToRuntimePlan(file, "x", 0).status().IgnoreError(),
               "granularity");
}

}  // namespace
}  // namespace loom::vmm
