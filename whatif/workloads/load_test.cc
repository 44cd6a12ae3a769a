#include "whatif/workloads/load.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "plan/solver/instance.h"
#include "plan/trace/trace_io.h"
#include "plan/analysis/workload.h"

namespace loom::whatif {
namespace {

std::string WriteTemp(const std::string& name, const std::string& text) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path = std::string(dir ? dir : "/tmp") + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// Live requested bytes after each event, replaying by request id.
std::vector<uint64_t> LiveBytes(const plan::Trace& trace) {
  std::vector<uint64_t> out;
  std::map<uint64_t, uint64_t> live;
  uint64_t bytes = 0;
  for (const plan::Event& e : trace.events) {
    if (e.kind == plan::EventKind::kAlloc) {
      live[e.id] = e.size;
      bytes += e.size;
    } else if (e.kind == plan::EventKind::kFree) {
      bytes -= live[e.id];
      live.erase(e.id);
    }
    out.push_back(bytes);
  }
  return out;
}

TEST(LoadTest, CsvBecomesAllocFreeTraceWithFreesFirst) {
  // MiniMalloc's example input.12.csv.
  std::string path = WriteTemp("input.12.csv",
                               "id,lower,upper,size\n"
                               "b1,0,3,4\nb2,3,9,4\nb3,0,9,4\n"
                               "b4,9,21,4\nb5,0,21,4\n");
  auto workload = LoadWorkload(path);
  ASSERT_TRUE(workload.ok()) << workload.status().ToString();
  const plan::Trace& trace = workload->trace;
  ASSERT_TRUE(plan::ValidateTrace(trace).ok());
  // t=0: alloc b1 b3 b5; t=3: free b1, alloc b2; t=9: free b2 b3, alloc b4;
  // t=21: free b4 b5.
  std::vector<plan::Event> expected = {
      plan::Event::Alloc(0, 4), plan::Event::Alloc(2, 4),
      plan::Event::Alloc(4, 4), plan::Event::Free(0),
      plan::Event::Alloc(1, 4), plan::Event::Free(1),
      plan::Event::Free(2),     plan::Event::Alloc(3, 4),
      plan::Event::Free(3),     plan::Event::Free(4),
  };
  EXPECT_EQ(trace.events, expected);
  auto live = LiveBytes(trace);
  EXPECT_EQ(*std::max_element(live.begin(), live.end()), 12u);
  EXPECT_NE(trace.header.provenance.find("input.12.csv"), std::string::npos);
}

TEST(LoadTest, PeakOfTheTraceIsTheInstanceLowerBound) {
  plan::Instance instance;
  instance.buffers = {{0, 0, 10, 100, 1},
                      {1, 5, 15, 50, 1},
                      {2, 10, 20, 70, 1},
                      {3, 15, 16, 7, 1}};
  plan::Trace trace = plan::TraceFromInstance(instance);
  auto live = LiveBytes(trace);
  // At t=10 buffer 0 ends before buffer 2 starts: 50 + 70 = 120 < 150.
  EXPECT_EQ(*std::max_element(live.begin(), live.end()),
            plan::LowerBound(instance));
  EXPECT_EQ(plan::LowerBound(instance), 150u);
}

TEST(LoadTest, ReadsLoomTraceFiles) {
  plan::Trace trace;
  trace.AddIterationBegin(0);
  trace.AddAlloc(1, 4096);
  trace.AddFree(1);
  trace.AddIterationEnd(0);
  std::string path = WriteTemp(
      "small.ltt", *plan::SerializeTrace(trace, plan::TraceFormat::kText));
  auto workload = LoadWorkload(path);
  ASSERT_TRUE(workload.ok()) << workload.status().ToString();
  EXPECT_EQ(workload->trace.events, trace.events);
}

TEST(LoadTest, BuiltinWorkloadsWithOptions) {
  auto moe = LoadWorkload("builtin:moe:layers=2,iterations=2,seq_len=256");
  ASSERT_TRUE(moe.ok()) << moe.status().ToString();
  EXPECT_TRUE(plan::ValidateTrace(moe->trace).ok());
  EXPECT_EQ(moe->name, "builtin:moe:layers=2,iterations=2,seq_len=256");
  EXPECT_NE(moe->trace.header.provenance.find("2 layers"), std::string::npos);
  auto comm = LoadWorkload("builtin:moe_comm:layers=1,iterations=1");
  ASSERT_TRUE(comm.ok());
  bool second_stream = false;
  for (const plan::Event& e : comm->trace.events)
    second_stream |= e.stream == 1;
  EXPECT_TRUE(second_stream);
  EXPECT_EQ(
      BuiltinWorkloadNames(),
      (std::vector<std::string>{"moe", "dense", "moe_comm", "moe_dropless",
                                "moe_capacity", "varlen", "eval"}));
  // Every listed name loads, with options, into a valid trace.
  for (const std::string& name : BuiltinWorkloadNames()) {
    std::string spec = "builtin:" + name + ":layers=1,seq_len=64,hidden=64";
    if (name == "varlen") spec += ",seq_lens=32:64";
    auto workload = LoadWorkload(spec);
    ASSERT_TRUE(workload.ok()) << spec << ": " << workload.status().ToString();
    EXPECT_TRUE(plan::ValidateTrace(workload->trace).ok()) << spec;
    EXPECT_NE(workload->trace.header.provenance.find("workload " + name + ":"),
              std::string::npos)
        << workload->trace.header.provenance;
  }
}

TEST(LoadTest, ErrorsNameTheProblem) {
  struct Case {
    std::string spec;
    StatusCode code;
    std::string fragment;
  };
  const Case cases[] = {
      {"builtin:gpt5", StatusCode::kInvalidArgument, "unknown builtin"},
      {"builtin:moe:layers", StatusCode::kInvalidArgument, "key=value"},
      {"builtin:moe:layers=0", StatusCode::kInvalidArgument, "layers"},
      {"builtin:moe:depth=3", StatusCode::kInvalidArgument, "'depth'"},
      {"builtin:dense:capacity_factor=1.25", StatusCode::kInvalidArgument,
       "needs experts"},
      {"builtin:varlen:seq_lens=1024:x", StatusCode::kInvalidArgument,
       "seq_lens=1024:x"},
      {"builtin:eval:eval_every=-1", StatusCode::kInvalidArgument,
       "eval_every"},
      {"/nonexistent/x.csv", StatusCode::kNotFound, "x.csv"},
      {"/nonexistent/trace.ltt", StatusCode::kNotFound, "trace.ltt"},
  };
  for (const Case& c : cases) {
    auto workload = LoadWorkload(c.spec);
    ASSERT_FALSE(workload.ok()) << c.spec;
    EXPECT_EQ(workload.status().code(), c.code)
        << c.spec << ": " << workload.status().ToString();
    EXPECT_NE(workload.status().message().find(c.fragment), std::string::npos)
        << c.spec << ": " << workload.status().message();
  }
  std::string garbage = WriteTemp("garbage.ltt", "not a trace\n");
  auto not_trace = LoadWorkload(garbage);
  ASSERT_FALSE(not_trace.ok());
  EXPECT_NE(not_trace.status().message().find("garbage.ltt"), std::string::npos)
      << not_trace.status().message();
  std::string bad = WriteTemp("bad.csv", "id,lower,upper,size\n1,5,2,4\n");
  auto workload = LoadWorkload(bad);
  ASSERT_FALSE(workload.ok());
  EXPECT_NE(workload.status().message().find("bad.csv"), std::string::npos)
      << workload.status().message();
}

}  // namespace
}  // namespace loom::whatif
