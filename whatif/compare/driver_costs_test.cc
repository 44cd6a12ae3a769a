#include "whatif/compare/driver_costs.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "whatif/compare/compare.h"
#include "whatif/sim/caching_allocator.h"
#include "whatif/sim/replay.h"

namespace loom::whatif {
namespace {

constexpr uint64_t k2MiB = uint64_t{2} << 20;
constexpr uint64_t k20MiB = uint64_t{20} << 20;
constexpr uint64_t k1GiB = uint64_t{1} << 30;

double Cost(const DriverCostTable& table, DriverCallKind kind, uint64_t bytes) {
  std::optional<double> cost = table.CostUs(kind, bytes);
  EXPECT_TRUE(cost.has_value()) << DriverCallName(kind);
  return cost.value_or(-1);
}

TEST(DriverCostsTest, TheEmbeddedTableIsTheH200s) {
  const DriverCostTable& h200 = H200DriverCosts();
  EXPECT_NE(h200.source.find("H200"), std::string::npos);
  EXPECT_EQ(h200.smallest_bytes(), k2MiB);
  // The medians of tests_summary.md (2026-11-26), at the measured sizes.
  EXPECT_DOUBLE_EQ(Cost(h200, DriverCallKind::kMemCreate, k2MiB), 8.3);
  EXPECT_DOUBLE_EQ(Cost(h200, DriverCallKind::kMemMap, k2MiB), 1.1);
  EXPECT_DOUBLE_EQ(Cost(h200, DriverCallKind::kSetAccess, k2MiB), 21.1);
  EXPECT_DOUBLE_EQ(Cost(h200, DriverCallKind::kMemUnmap, k2MiB), 14.9);
  EXPECT_DOUBLE_EQ(Cost(h200, DriverCallKind::kMemRelease, k2MiB), 10.5);
  EXPECT_DOUBLE_EQ(Cost(h200, DriverCallKind::kAddressReserve, k2MiB), 0.8);
  EXPECT_DOUBLE_EQ(Cost(h200, DriverCallKind::kAddressFree, k2MiB), 0.8);
  EXPECT_DOUBLE_EQ(Cost(h200, DriverCallKind::kMemRelease, k20MiB), 19.1);
  EXPECT_DOUBLE_EQ(Cost(h200, DriverCallKind::kMemCreate, k1GiB), 38.8);
  EXPECT_DOUBLE_EQ(Cost(h200, DriverCallKind::kMemRelease, k1GiB), 484.3);
  // cudaMalloc / cudaFree were not measured.
  EXPECT_FALSE(h200.CostUs(DriverCallKind::kMalloc, k2MiB).has_value());
  EXPECT_FALSE(h200.CostUs(DriverCallKind::kFree, k2MiB).has_value());
}

TEST(DriverCostsTest, LinearBetweenSizesClampedOutside) {
  const DriverCostTable& h200 = H200DriverCosts();
  // Halfway between 2 and 20 MiB.
  EXPECT_DOUBLE_EQ(Cost(h200, DriverCallKind::kMemRelease, 11 * kMiB),
                   (10.5 + 19.1) / 2);
  // 40 MiB: 20/1004 of the way from 20 MiB to 1 GiB.
  EXPECT_DOUBLE_EQ(Cost(h200, DriverCallKind::kSetAccess, 40 * kMiB),
                   21.6 + (85.3 - 21.6) * 20.0 / 1004.0);
  EXPECT_DOUBLE_EQ(Cost(h200, DriverCallKind::kMemCreate, kMiB), 8.3);
  EXPECT_DOUBLE_EQ(Cost(h200, DriverCallKind::kMemCreate, 64 * k1GiB), 38.8);
  // Unknown size: the granule's cost.
  EXPECT_DOUBLE_EQ(Cost(h200, DriverCallKind::kMemUnmap, 0), 14.9);
}

TEST(DriverCostsTest, PricesEachCallBySizeAndCountsWhatItCannotPrice) {
  DriverCalls calls;
  calls.Add(DriverCallKind::kMemCreate, 10, k20MiB);
  calls.Add(DriverCallKind::kMemMap, 10, k20MiB);
  calls.Add(DriverCallKind::kMemRelease, 2, k1GiB);
  calls.Add(DriverCallKind::kSetAccess, 3, /*bytes=*/0);
  calls.Add(DriverCallKind::kMalloc, 7, k2MiB);
  calls.mem_unmap = 4;  // counted without sizes: priced as unsized
  DriverTime t = PriceDriverCalls(calls, H200DriverCosts());
  EXPECT_DOUBLE_EQ(t.us, 10 * 8.4 + 10 * 1.1 + 2 * 484.3 + 3 * 21.1 + 4 * 14.9);
  EXPECT_EQ(t.priced_calls, 29u);
  EXPECT_EQ(t.unsized_calls, 7u);
  EXPECT_EQ(t.unpriced_calls, 7u);
  EXPECT_FALSE(t.complete());
  EXPECT_EQ(t.unpriced_kinds, std::vector<std::string>{"cudaMalloc"});
  EXPECT_EQ(FormatMicros(t.us), "1.2 ms");
  EXPECT_EQ(FormatMicros(812.4), "812 us");
  EXPECT_EQ(FormatMicros(3.051e6), "3.05 s");
}

TEST(DriverCostsTest, SinceSubtractsCountsAndSizes) {
  DriverCalls before, after;
  before.Add(DriverCallKind::kMemCreate, 2, k20MiB);
  after = before;
  after.Add(DriverCallKind::kMemCreate, 3, k20MiB);
  after.Add(DriverCallKind::kMemMap, 1, k2MiB);
  DriverCalls delta = after.Since(before);
  EXPECT_EQ(delta.mem_create, 3u);
  EXPECT_EQ(delta.mem_map, 1u);
  EXPECT_EQ(delta.total(), 4u);
  EXPECT_EQ((delta.sized.at({DriverCallKind::kMemCreate, k20MiB})), 3u);
}

// A known trace through expandable segments: two iterations of one 30 MiB
// request. The first maps two 20 MiB pages of a new large segment (two
// creates and maps of 20 MiB, one set-access over 40 MiB, one reservation
// of 9/8 of the device); the second reuses them.
TEST(DriverCostsTest, ExpandableSegmentsOnAKnownTrace) {
  plan::Trace trace;
  for (uint64_t i = 0; i < 2; ++i) {
    trace.events.push_back(plan::Event::IterationBegin(i));
    trace.events.push_back(plan::Event::Alloc(i + 1, 30 * kMiB));
    trace.events.push_back(plan::Event::Free(i + 1));
    trace.events.push_back(plan::Event::IterationEnd(i));
  }
  CachingConfig config;
  config.expandable_segments = true;
  CachingAllocator allocator(config, SimOptions{80 * k1GiB});
  StatusOr<ReplayResult> result = Replay(trace, allocator);
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  ASSERT_TRUE(result->has_steady);
  EXPECT_EQ(result->steady_driver_calls.total(), 0u);
  const DriverCalls& warm = result->warmup_driver_calls;
  EXPECT_EQ(warm.mem_create, 2u);
  EXPECT_EQ(warm.mem_map, 2u);
  EXPECT_EQ(warm.set_access, 1u);
  EXPECT_EQ(warm.address_reserve, 1u);
  EXPECT_EQ(warm.total(), result->driver_calls.total());
  const double expected =
      2 * 8.4 + 2 * 1.1 + (21.6 + (85.3 - 21.6) * 20.0 / 1004.0) + 6.1;
  EXPECT_DOUBLE_EQ(PriceDriverCalls(warm, H200DriverCosts()).us, expected);
  EXPECT_DOUBLE_EQ(
      PriceDriverCalls(result->steady_driver_calls, H200DriverCosts()).us, 0);
  // The same in the comparison's JSON.
  Comparison c;
  c.driver_costs = H200DriverCosts();
  c.rows.push_back(*result);
  const std::string json = FormatJson(c);
  EXPECT_NE(json.find("\"steady_us\": 0"), std::string::npos) << json;
  EXPECT_NE(json.find("\"complete\": true"), std::string::npos) << json;
  EXPECT_NE(FormatTable(c).find("warm-up 6 calls 48 us; steady 0 calls"),
            std::string::npos)
      << FormatTable(c);
}

TEST(DriverCostsTest, ReadsTheToolsJson) {
  // The H200's second 50-round run, as bench/gpu/driver_costs --json wrote
  // it (../shared/gpu_runs/2026-11-26/driver_costs.json).
  StatusOr<DriverCostTable> table = ReadDriverCosts(
      "bench/data/traces/gpu/h200_2026-11-26/driver_costs.json");
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  EXPECT_NE(table->source.find("(NVIDIA H200)"), std::string::npos);
  ASSERT_EQ(table->rows.size(), 3u);
  EXPECT_DOUBLE_EQ(Cost(*table, DriverCallKind::kMemCreate, k2MiB), 14.333);
  EXPECT_DOUBLE_EQ(Cost(*table, DriverCallKind::kMemRelease, k1GiB), 303.616);
  EXPECT_FALSE(table->CostUs(DriverCallKind::kMalloc, k2MiB).has_value());
}

TEST(DriverCostsTest, MalformedTablesAreRefusedWithTheReason) {
  const std::pair<std::string, std::string> cases[] = {
      {"", "unexpected end"},
      {"[1, 2]", "not a JSON object"},
      {"{\"sizes\": []}", "no \"sizes\" list"},
      {"{\"sizes\": [{\"cuMemMap\": {\"median_us\": 1}}]}",
       "sizes[0]: \"bytes\" is not a positive integer"},
      {"{\"sizes\": [{\"bytes\": 2.5}]}", "\"bytes\" is not a positive"},
      {"{\"sizes\": [{\"bytes\": 2, \"cuMemMap\": {\"median_us\": -1}}]}",
       "sizes[0].cuMemMap: \"median_us\" is not a non-negative number"},
      {"{\"sizes\": [{\"bytes\": 2, \"cuMemMap\": 3}]}", "sizes[0].cuMemMap"},
      {"{\"sizes\": [{\"bytes\": 2, \"cuMemMap\": {\"median_us\": 1}}, "
       "{\"bytes\": 2, \"cuMemMap\": {\"median_us\": 1}}]}",
       "two rows of 2 bytes"},
      {"{\"sizes\": [{\"bytes\": 2, \"cuFoo\": {\"median_us\": 1}}]}",
       "no call this tool prices"},
      {"{\"sizes\": [{\"bytes\": 2,}]}", "expected a key"},
      {"{\"sizes\": [{\"bytes\": 2}]} x", "text after the JSON value"},
      {"{\"sizes\": [{\"bytes\": 1e}]}", "malformed number '1e'"},
  };
  for (const auto& [json, reason] : cases) {
    StatusOr<DriverCostTable> table = ParseDriverCosts(json, "costs.json");
    ASSERT_FALSE(table.ok()) << json;
    EXPECT_EQ(table.status().code(), StatusCode::kInvalidArgument);
    const std::string& message = table.status().message();
    EXPECT_EQ(message.rfind("driver costs costs.json: ", 0), 0u) << message;
    EXPECT_NE(message.find(reason), std::string::npos)
        << json << " -> " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  StatusOr<DriverCostTable> missing = ReadDriverCosts("/nonexistent/x.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("cannot read"), std::string::npos);
}

}  // namespace
}  // namespace loom::whatif
