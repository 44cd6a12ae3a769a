// The offline half of the C ABI (trace handles, fingerprint, planning), as a
// C caller sees it. The Python package's use of it is tested from Python.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "torch_plugin/loom_c_api.h"

namespace {

using Record = std::vector<unsigned long long>;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

Record Alloc(unsigned long long id, unsigned long long size,
             unsigned long long stream = 0) {
  return {1, 0, 0, 0, id, size, stream};
}
Record Free(unsigned long long id) { return {2, 0, 0, 0, id, 0, 0}; }
Record Marker(unsigned long long kind, unsigned long long id) {
  return {kind, 0, 0, 0, id, 0, 0};
}

// Three marked iterations of two requests, after one set-up request.
std::vector<unsigned long long> Training(unsigned long long stream) {
  std::vector<Record> records = {Alloc(1, 4096, stream)};
  unsigned long long id = 10;
  for (unsigned long long i = 0; i < 3; ++i) {
    records.push_back(Marker(3, i));
    records.push_back(Alloc(id, 1 << 20, stream));
    records.push_back(Alloc(id + 1, 512, stream));
    records.push_back(Free(id + 1));
    records.push_back(Free(id));
    records.push_back(Marker(4, i));
    id += 2;
  }
  std::vector<unsigned long long> flat;
  for (const Record& r : records) flat.insert(flat.end(), r.begin(), r.end());
  return flat;
}

TEST(OfflineApiTest, BuiltTraceRoundTripsThroughBothForms) {
  loom_trace* trace = loom_trace_new(0, 2 << 20, "offline_api_test");
  ASSERT_NE(trace, nullptr) << loom_last_error();
  EXPECT_EQ(loom_trace_intern_name(trace, "forward"), 0);
  EXPECT_EQ(loom_trace_intern_name(trace, "moe \"x\""), 1);
  EXPECT_EQ(loom_trace_intern_name(trace, "forward"), 0);
  const std::vector<unsigned long long> flat = Training(7);
  const long long count = flat.size() / LOOM_TRACE_FIELDS;
  ASSERT_EQ(loom_trace_add_events(trace, flat.data(), count), 0)
      << loom_last_error();
  for (const char* name : {"built.ltt", "built.ltb"}) {
    const std::string path = TempPath(name);
    ASSERT_EQ(loom_trace_write(trace, path.c_str()), 0) << loom_last_error();
    loom_trace* read = nullptr;
    ASSERT_EQ(loom_trace_read(path.c_str(), &read), 0) << loom_last_error();
    int device = -5;
    unsigned long long granularity = 0;
    ASSERT_EQ(loom_trace_header(read, &device, &granularity), 0);
    EXPECT_EQ(device, 0);
    EXPECT_EQ(granularity, 2u << 20);
    EXPECT_STREQ(loom_trace_provenance(read), "offline_api_test");
    ASSERT_EQ(loom_trace_event_count(read), count);
    std::vector<unsigned long long> back(flat.size());
    ASSERT_EQ(loom_trace_get_events(read, 0, count, back.data()), 0);
    EXPECT_EQ(back, flat) << name;
    EXPECT_EQ(loom_trace_get_events(read, 1, count, back.data()),
              5 /* OUT_OF_RANGE */);
    loom_trace_free(read);
  }
  loom_trace_free(trace);
}

TEST(OfflineApiTest, BadEventsAreRejectedAllOrNothing) {
  loom_trace* trace = loom_trace_new(0, 0, "");
  ASSERT_NE(trace, nullptr);
  std::vector<unsigned long long> flat = Training(0);
  // Free of a request that is not live, as the 4th event of the batch.
  const std::vector<unsigned long long> bad = {2, 0, 0, 0, 999, 0, 0};
  flat.insert(flat.begin() + 3 * LOOM_TRACE_FIELDS, bad.begin(), bad.end());
  const long long count = flat.size() / LOOM_TRACE_FIELDS;
  EXPECT_NE(loom_trace_add_events(trace, flat.data(), count), 0);
  EXPECT_NE(std::string(loom_last_error()).find("event 3"), std::string::npos)
      << loom_last_error();
  EXPECT_EQ(loom_trace_event_count(trace), 0);
  // Unknown kinds and a size of zero.
  const std::vector<unsigned long long> kind = {9, 0, 0, 0, 1, 1, 0};
  EXPECT_NE(loom_trace_add_events(trace, kind.data(), 1), 0);
  const std::vector<unsigned long long> empty = {1, 0, 0, 0, 1, 0, 0};
  EXPECT_NE(loom_trace_add_events(trace, empty.data(), 1), 0);
  EXPECT_EQ(loom_trace_event_count(trace), 0);
  loom_trace_free(trace);
  // Bad headers and files.
  EXPECT_EQ(loom_trace_new(-2, 0, ""), nullptr);
  loom_trace* none = nullptr;
  EXPECT_NE(loom_trace_read(TempPath("missing.ltb").c_str(), &none), 0);
  EXPECT_EQ(none, nullptr);
}

TEST(OfflineApiTest, FingerprintAndPlanOfAWrittenTrace) {
  loom_trace* trace = loom_trace_new(0, 0, "");
  ASSERT_NE(trace, nullptr);
  const std::vector<unsigned long long> flat = Training(0x7f00);
  ASSERT_EQ(loom_trace_add_events(trace, flat.data(),
                                  flat.size() / LOOM_TRACE_FIELDS),
            0);
  const std::string path = TempPath("plan_me.ltb");
  ASSERT_EQ(loom_trace_write(trace, path.c_str()), 0);
  loom_trace_free(trace);

  ASSERT_EQ(loom_fingerprint_trace(path.c_str()), 0) << loom_last_error();
  const std::string fingerprint = loom_last_result();
  EXPECT_NE(fingerprint.find("\"has_steady\":true"), std::string::npos);
  EXPECT_NE(fingerprint.find("\"steady_allocs\":2"), std::string::npos);

  const std::string plan = TempPath("plan_me.lplan");
  ASSERT_EQ(loom_plan_trace(path.c_str(), plan.c_str(),
                            "time_limit=1;persistent=0"),
            0)
      << loom_last_error();
  const std::string report = loom_last_result();
  EXPECT_NE(report.find("\"valid\":true"), std::string::npos) << report;
  EXPECT_NE(report.find("\"requests\":"), std::string::npos) << report;
  // Bad options and inputs fail with a message and write nothing.
  const std::string other = TempPath("never.lplan");
  EXPECT_NE(loom_plan_trace(path.c_str(), other.c_str(), "colour=red"), 0);
  EXPECT_NE(std::string(loom_last_error()).find("colour"), std::string::npos);
  EXPECT_NE(loom_plan_trace(path.c_str(), other.c_str(), "capacity=1024"), 0);
  EXPECT_NE(std::string(loom_last_error()).find("capacity"),
            std::string::npos);
  EXPECT_NE(loom_plan_trace(nullptr, other.c_str(), nullptr), 0);
  EXPECT_NE(loom_fingerprint_trace(plan.c_str()), 0);  // a plan, not a trace
  FILE* f = std::fopen(other.c_str(), "rb");
  EXPECT_EQ(f, nullptr);
  if (f != nullptr) std::fclose(f);
}

}  // namespace
