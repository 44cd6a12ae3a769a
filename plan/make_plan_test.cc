#include "plan/make_plan.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "plan/planfile/plan_file.h"
#include "plan/planfile/request_table.h"
#include "plan/trace/synthetic_trace.h"
#include "plan/trace/trace_io.h"

namespace loom::plan {
namespace {

Trace Training() {
  SyntheticTraceOptions options;
  options.events = 6000;
  options.moe_every = 4;
  return MakeSyntheticTrace(options);
}

MakePlanOptions Quick() {
  MakePlanOptions options;
  options.time_limit_seconds = 0.5;
  return options;
}

TEST(MakePlanTest, TracePlanIsVerifiedAndCarriesItsRequestTable) {
  StatusOr<MadePlan> made = MakePlan(Training(), Quick());
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  EXPECT_TRUE(made->ok());
  EXPECT_TRUE(made->verdict.valid()) << made->verdict.message;
  ASSERT_TRUE(made->requests.has_value());
  EXPECT_GE(made->steady_iteration, 0);
  EXPECT_NE(made->note.find("steady-state iteration"), std::string::npos);
  // The file holds exactly the table the report describes.
  StatusOr<std::optional<RequestTable>> table =
      DecodeRequestTable(made->file, "made");
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  ASSERT_TRUE(table->has_value());
  EXPECT_EQ((*table)->iteration.size(), made->requests->iteration.size());
  EXPECT_EQ((*table)->prologue.size(), made->requests->prologue.size());
  // Traces: sizes and offsets aligned to 512 bytes, a cyclic plan, a region
  // of whole granules, dynamic windows from the MoE modules.
  EXPECT_GT(made->file.period, 0);
  for (const PlannedBuffer& b : made->file.buffers) {
    EXPECT_EQ(b.offset % 512, 0u);
    EXPECT_EQ(b.size % 512, 0u);
  }
  EXPECT_EQ(made->file.region_size % made->file.granule_bytes, 0u);
  EXPECT_GE(made->file.region_size, made->result.peak_bytes);
  EXPECT_FALSE(made->file.dynamic_spaces.empty());
}

TEST(MakePlanTest, FileTraceGivesTheSamePlanAsTheTraceInMemory) {
  const Trace trace = Training();
  const std::string path = ::testing::TempDir() + "make_plan_trace.ltb";
  ASSERT_TRUE(WriteTrace(path, trace, TraceFormat::kBinary).ok());
  MakePlanOptions options = Quick();
  options.algorithm = Algorithm::kBestFit;  // deterministic, no time limit
  StatusOr<MadePlan> from_file = MakePlanFromFile(path, options);
  options.source = path;
  StatusOr<MadePlan> in_memory = MakePlan(trace, options);
  ASSERT_TRUE(from_file.ok()) << from_file.status().ToString();
  ASSERT_TRUE(in_memory.ok()) << in_memory.status().ToString();
  EXPECT_EQ(from_file->file.source, path);
  EXPECT_EQ(from_file->result.offsets, in_memory->result.offsets);
  EXPECT_EQ(from_file->note, in_memory->note);
  EXPECT_EQ(from_file->file.buffers, in_memory->file.buffers);
  EXPECT_EQ(from_file->file.dynamic_spaces, in_memory->file.dynamic_spaces);
  EXPECT_EQ(from_file->file.extra, in_memory->file.extra);
}

TEST(MakePlanTest, ATraceIsPlannedForTheGranularityItWasRecordedAt) {
  Trace trace = Training();
  const std::string path = ::testing::TempDir() + "make_plan_granule.ltb";
  for (uint64_t recorded : {uint64_t{64} << 10, uint64_t{0}}) {
    trace.header.granularity = recorded;
    ASSERT_TRUE(WriteTrace(path, trace, TraceFormat::kBinary).ok());
    // 0 (not recorded): 2 MiB.
    const uint64_t expected = recorded != 0 ? recorded : kDefaultGranule;
    StatusOr<MadePlan> in_memory = MakePlan(trace, Quick());
    StatusOr<MadePlan> from_file = MakePlanFromFile(path, Quick());
    for (const StatusOr<MadePlan>* made : {&in_memory, &from_file}) {
      ASSERT_TRUE(made->ok()) << made->status().ToString();
      EXPECT_EQ((*made)->file.granule_bytes, expected);
      EXPECT_EQ((*made)->file.region_size % expected, 0u);
      // The granules touched at the peak are counted in those units.
      EXPECT_GE((*made)->result.peak_granules * expected,
                (*made)->result.peak_bytes);
      EXPECT_LT(((*made)->result.peak_granules - 1) * expected,
                (*made)->file.region_size);
    }
  }
  // Told otherwise, the planner's granule wins.
  trace.header.granularity = uint64_t{64} << 10;
  MakePlanOptions options = Quick();
  options.granule_bytes = uint64_t{1} << 20;
  StatusOr<MadePlan> told = MakePlan(trace, options);
  ASSERT_TRUE(told.ok()) << told.status().ToString();
  EXPECT_EQ(told->file.granule_bytes, uint64_t{1} << 20);
}

TEST(MakePlanTest, CsvInstanceHasNoRequestTable) {
  MakePlanOptions options = Quick();
  StatusOr<MadePlan> made = MakePlanFromFile(
      "bench/data/minimalloc/examples/input.12.csv", options);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  EXPECT_FALSE(made->requests.has_value());
  EXPECT_TRUE(made->ok());
  EXPECT_EQ(made->file.period, 0);
  // CSV defaults: no rounding or alignment.
  EXPECT_EQ(made->file.size_round, 1u);
  EXPECT_EQ(made->file.min_alignment, 1u);
}

TEST(MakePlanTest, CapacityTooSmallIsReportedNotFailed) {
  MakePlanOptions options = Quick();
  options.capacity = 1024;
  StatusOr<MadePlan> made = MakePlan(Training(), options);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  EXPECT_FALSE(made->result.fits);
  EXPECT_FALSE(made->ok());
  const std::string json = MadePlanJson(*made, options);
  EXPECT_NE(json.find("\"fits\":false"), std::string::npos) << json;
}

TEST(MakePlanTest, ReportJsonNamesTheFigures) {
  MakePlanOptions options = Quick();
  options.source = "unit";
  StatusOr<MadePlan> made = MakePlan(Training(), options);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  const std::string json = MadePlanJson(*made, options);
  for (const char* key :
       {"\"input\":\"unit\"", "\"derived\":", "\"requests\":", "\"buffers\":",
        "\"peak_bytes\":", "\"lower_bound_bytes\":", "\"region_bytes\":",
        "\"valid\":true", "\"attempts\":[", "\"dynamic_windows\":["}) {
    EXPECT_NE(json.find(key), std::string::npos) << key << " in " << json;
  }
}

TEST(MakePlanTest, BadInputsFailWithTheirReason) {
  // Nothing to plan: only dynamic requests.
  Trace dynamic_only;
  dynamic_only.AddModuleEnter("moe", /*dynamic=*/true);
  dynamic_only.AddAlloc(1, 4096);
  dynamic_only.AddFree(1);
  dynamic_only.AddModuleExit("moe");
  StatusOr<MadePlan> made = MakePlan(dynamic_only, Quick());
  EXPECT_EQ(made.status().code(), StatusCode::kInvalidArgument);
  // A file that does not exist.
  made = MakePlanFromFile(::testing::TempDir() + "no_such_trace.ltb", Quick());
  EXPECT_EQ(made.status().code(), StatusCode::kNotFound);
  // A plan file is not an input.
  StatusOr<MadePlan> good = MakePlan(Training(), Quick());
  ASSERT_TRUE(good.ok());
  const std::string plan_path = ::testing::TempDir() + "make_plan_input.lplan";
  ASSERT_TRUE(WritePlanFile(plan_path, good->file).ok());
  made = MakePlanFromFile(plan_path, Quick());
  EXPECT_EQ(made.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(made.status().message().find("plan file"), std::string::npos);
}

TEST(MakePlanTest, ParsesSettings) {
  MakePlanOptions options;
  ASSERT_TRUE(ParseMakePlanOptions(
                  "time_limit=2.5; persistent=0\nalgorithm=best-fit;"
                  "granule=4096;scope=iteration;steady_iteration=3;seed=9",
                  &options)
                  .ok());
  EXPECT_DOUBLE_EQ(options.time_limit_seconds, 2.5);
  EXPECT_FALSE(options.include_persistent);
  EXPECT_EQ(options.algorithm, Algorithm::kBestFit);
  EXPECT_EQ(options.granule_bytes, 4096u);
  EXPECT_EQ(options.scope, PlanScope::kIteration);
  EXPECT_EQ(options.steady_iteration, 3);
  EXPECT_EQ(options.seed, 9u);
  // Errors change nothing.
  for (const char* bad :
       {"time_limit=0", "time_limit=fast", "persistent=maybe", "colour=red",
        "algorithm=magic", "granule=0", "novalue", "seed=-1"}) {
    MakePlanOptions before;
    before.seed = 5;
    MakePlanOptions after = before;
    const Status status =
        ParseMakePlanOptions(std::string("seed=7;") + bad, &after);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(after.seed, 5u) << bad;
  }
}

}  // namespace
}  // namespace loom::plan
