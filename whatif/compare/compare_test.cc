// The comparison on a small CSV with hand-checked numbers.
#include "whatif/compare/compare.h"

#include <gtest/gtest.h>

#include <fstream>

#include "whatif/workloads/load.h"
#include "base/text.h"

namespace loom::whatif {
namespace {

// a: 600000 B (small pool), b, d: 5 MiB, c: 16 MiB.
constexpr char kCsv[] =
    "id,lower,upper,size\n"
    "a,0,4,600000\n"
    "b,1,3,5242880\n"
    "c,2,6,16777216\n"
    "d,5,7,5242880\n";
constexpr uint64_t kPeakRequested = 600000 + 5242880 + 16777216;

Comparison RunSmallCsv(uint64_t capacity = 0) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path = std::string(dir ? dir : "/tmp") + "/small.csv";
  std::ofstream(path) << kCsv;
  auto workload = LoadWorkload(path);
  EXPECT_TRUE(workload.ok()) << workload.status().ToString();
  CompareOptions options;
  options.capacity = capacity;
  options.check_invariants = true;
  auto comparison = Compare(workload->trace, "small.csv",
                            BaselineAllocators(options), options);
  EXPECT_TRUE(comparison.ok()) << comparison.status().ToString();
  return *comparison;
}

TEST(CompareTest, HandCheckedRows) {
  Comparison c = RunSmallCsv();
  ASSERT_EQ(c.rows.size(), 3u);
  EXPECT_EQ(c.summary.allocs, 4u);
  EXPECT_EQ(c.summary.events, 8u);
  const ReplayResult& pytorch = c.rows[0];
  const ReplayResult& expandable = c.rows[1];
  const ReplayResult& gmlake = c.rows[2];
  EXPECT_EQ(pytorch.allocator, "pytorch");
  EXPECT_EQ(expandable.allocator, "pytorch_expandable");
  EXPECT_EQ(gmlake.allocator, "gmlake");
  for (const ReplayResult& r : c.rows) {
    EXPECT_EQ(r.peak_requested, kPeakRequested) << r.allocator;
    EXPECT_FALSE(r.oom);
  }
  // PyTorch: a 2 MiB small segment, a 20 MiB segment for b (d reuses it;
  // c does not fit its 15 MiB remainder) and a 16 MiB one for c. a rounds
  // to 600064 B.
  EXPECT_EQ(pytorch.peak_reserved, 38 * kMiB);
  EXPECT_EQ(pytorch.peak_allocated, 600064 + 21 * kMiB);
  EXPECT_EQ(pytorch.driver_calls.malloc, 3u);
  EXPECT_EQ(pytorch.driver_calls.total(), 3u);
  EXPECT_DOUBLE_EQ(pytorch.efficiency(),
                   double(kPeakRequested) / double(38 * kMiB));
  // Expandable: c extends b's segment by a second 20 MiB page (15 MiB free
  // tail + 20 MiB), plus one 2 MiB small page: 42 MiB. Calls: 2 reserves,
  // 3 x (create, map, set access).
  EXPECT_EQ(expandable.peak_reserved, 42 * kMiB);
  EXPECT_EQ(expandable.driver_calls.total(), 11u);
  EXPECT_EQ(expandable.stats.num_device_alloc, 3u);
  // GMLake: b rounds to 6 MiB in a 10-chunk pBlock; c gets an 8-chunk one.
  EXPECT_EQ(gmlake.peak_reserved, 38 * kMiB);
  EXPECT_EQ(gmlake.peak_allocated, 600064 + 22 * kMiB);
  EXPECT_EQ(gmlake.driver_calls.malloc, 1u);
  EXPECT_EQ(gmlake.driver_calls.mem_create, 18u);
  EXPECT_EQ(gmlake.driver_calls.total(), 1u + 31u + 25u);
}

TEST(CompareTest, JsonRowsCarryTheNumbers) {
  std::string json = FormatJson(RunSmallCsv());
  EXPECT_EQ(json.front(), '[');
  for (const char* fragment :
       {"\"allocator\": \"pytorch\"", "\"allocator\": \"pytorch_expandable\"",
        "\"allocator\": \"gmlake\"", "\"peak_allocated_bytes\": 22620096",
        "\"peak_reserved_bytes\": 39845888",
        "\"peak_reserved_bytes\": 44040192",
        "\"allocator_peak_allocated_bytes\": 22620160",
        "\"allocator_peak_allocated_bytes\": 23668736",
        "\"efficiency\": 0.56768", "\"fragmentation\": 0.43231",
        "\"efficiency\": 0.51362", "\"fragmentation_bytes\": 17225792",
        "\"cudaMalloc\": 3", "\"total\": 57", "\"oom\": false",
        "\"oom_event\": null", "\"stitches\": 0"}) {
    EXPECT_NE(json.find(fragment), std::string::npos) << fragment << "\n"
                                                      << json;
  }
}

TEST(CompareTest, TableIsReadable) {
  std::string table = FormatTable(RunSmallCsv());
  for (const char* fragment :
       {"input: small.csv", "8 events, 4 allocations", "unlimited",
        "peak reserved", "38.00 MiB", "42.00 MiB", "21.57 MiB", "56.77%",
        "43.23%", "51.36%", "cudaMalloc 3", "cuMemCreate 18",
        "expandable_segments 2"}) {
    EXPECT_NE(table.find(fragment), std::string::npos) << fragment << "\n"
                                                       << table;
  }
}

TEST(CompareTest, CapacityStopsTheAllocatorThatNeedsMore) {
  // 40 MiB: PyTorch and GMLake need 38 MiB; expandable segments need a
  // second 20 MiB page for c (42 MiB), release nothing (every page holds a
  // live block) and run out of memory at c, event 2, after one retry.
  Comparison c = RunSmallCsv(40 * kMiB);
  EXPECT_FALSE(c.rows[0].oom);
  EXPECT_TRUE(c.rows[1].oom);
  EXPECT_EQ(c.rows[1].oom_event, 2u);
  EXPECT_EQ(c.rows[1].stats.num_alloc_retries, 1u);
  EXPECT_EQ(c.rows[1].stats.num_ooms, 1u);
  EXPECT_FALSE(c.rows[2].oom);
  std::string json = FormatJson(c);
  EXPECT_NE(json.find("\"oom_event\": 2"), std::string::npos);
  std::string table = FormatTable(c);
  EXPECT_NE(table.find("OOM at event 2"), std::string::npos) << table;
  EXPECT_NE(table.find("device capacity: 40.00 MiB"), std::string::npos);
}

TEST(CompareTest, SeriesCsvHasEveryAllocator) {
  std::string csv = FormatSeriesCsv(RunSmallCsv());
  EXPECT_EQ(csv.rfind("allocator,time,iteration,requested_bytes,"
                      "allocated_bytes,reserved_bytes\n",
                      0),
            0u);
  EXPECT_NE(csv.find("pytorch,2,-1,22620096,22620160,39845888\n"),
            std::string::npos)
      << csv;
  size_t lines = std::count(csv.begin(), csv.end(), '\n');
  EXPECT_EQ(lines, 1u + 3 * 8);
}

TEST(CompareTest, FactoryErrorsNameTheAllocator) {
  plan::Trace trace;
  trace.AddAlloc(1, 10);
  AllocatorFactory broken{
      "broken",
      [](const plan::Trace&,
         const SimOptions&) -> StatusOr<std::unique_ptr<SimAllocator>> {
        return UnavailableError("no plan");
      }};
  auto result = Compare(trace, "x", {broken}, CompareOptions{});
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("broken"), std::string::npos);
}

TEST(CompareTest, FormatBytesInTables) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(34 * kMiB), "34.00 MiB");
  EXPECT_EQ(FormatBytes(uint64_t{5} << 30), "5.00 GiB");
}

}  // namespace
}  // namespace loom::whatif
