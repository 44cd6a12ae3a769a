#include "plan/analysis/analysis.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "plan/trace/synthetic_trace.h"
#include "plan/trace/trace_io.h"
#include "plan/analysis/workload.h"

namespace loom::plan {
namespace {

ClassTotals Totals(const WorkloadAnalysis& r, LifetimeClass c) {
  return r.totals[static_cast<size_t>(c)];
}

// Hand-checked: every class, with markers. Times in comments.
Trace MarkedTrace() {
  Trace t;
  t.AddAlloc(1, 1000);         // 0  head weight, never freed: persistent
  t.AddAlloc(2, 100);          // 1  head, freed in iteration 0: cross_iteration
  t.AddIterationBegin(0);      // 2
  t.AddPhase(kPhaseForward);   // 3
  t.AddAlloc(3, 200);          // 4  forward -> backward: scoped
  t.AddAlloc(4, 50);           // 5  forward temp
  t.AddFree(4);                // 6  transient
  t.AddFree(2);                // 7
  t.AddPhase(kPhaseBackward);  // 8
  t.AddAlloc(5, 300);          // 9  freed in iteration 1: cross
  t.AddFree(3);                // 10
  t.AddModuleEnter("moe", true);  // 11
  t.AddAlloc(6, 64);              // 12 dynamic module: dynamic
  t.AddFree(6);                   // 13
  t.AddModuleExit("moe");         // 14
  t.AddIterationEnd(0);           // 15
  t.AddIterationBegin(1);         // 16 (never ended: incomplete)
  t.AddPhase(kPhaseForward);      // 17
  t.AddFree(5);                   // 18
  t.AddAlloc(7, 400);             // 19 never freed: persistent
  return t;
}

TEST(WorkloadTest, RecordsCarryIterationPhaseAndModule) {
  Trace trace = MarkedTrace();
  ASSERT_TRUE(ValidateTrace(trace).ok());
  Workload w = BuildWorkload(trace);
  EXPECT_EQ(w.events, 20u);
  EXPECT_EQ(w.iteration_source, IterationSource::kMarkers);
  ASSERT_EQ(w.iterations.size(), 2u);
  EXPECT_EQ(w.iterations[0].begin, 2);
  EXPECT_EQ(w.iterations[0].end, 16);
  EXPECT_TRUE(w.iterations[0].complete);
  EXPECT_EQ(w.iterations[1].begin, 16);
  EXPECT_EQ(w.iterations[1].end, 20);
  EXPECT_FALSE(w.iterations[1].complete);
  EXPECT_FALSE(w.phases_inferred);
  EXPECT_EQ(w.phase_names, (std::vector<std::string>{"forward", "backward"}));
  ASSERT_EQ(w.allocations.size(), 7u);
  const Allocation& a2 = w.allocations[1];
  EXPECT_EQ(a2.request_id, 2u);
  EXPECT_EQ(a2.alloc_iteration, kNoIteration);
  EXPECT_EQ(a2.free_iteration, 0);
  EXPECT_EQ(a2.alloc_phase, kNone);
  EXPECT_EQ(a2.free_phase, 0);
  const Allocation& a5 = w.allocations[4];
  EXPECT_EQ(a5.alloc_time, 9);
  EXPECT_EQ(a5.free_time, 18);
  EXPECT_EQ(a5.alloc_phase, 1);
  EXPECT_EQ(a5.free_phase, 0);
  EXPECT_EQ(a5.free_iteration, 1);
  const Allocation& a6 = w.allocations[5];
  EXPECT_TRUE(a6.dynamic);
  EXPECT_EQ(a6.alloc_module, 2);  // names: forward, backward, moe
  EXPECT_EQ(a6.free_module, 2);
  EXPECT_EQ(w.allocations[6].free_time, kNever);
  EXPECT_EQ(w.events_by_kind[static_cast<size_t>(EventKind::kAlloc)], 7u);
  EXPECT_EQ(w.events_by_kind[static_cast<size_t>(EventKind::kFree)], 5u);
}

TEST(AnalysisTest, ClassesAndPeaksOfAHandMadeTrace) {
  Workload w = BuildWorkload(MarkedTrace());
  WorkloadAnalysis r = AnalyzeWorkload(w);
  EXPECT_EQ(r.classes,
            (std::vector<LifetimeClass>{
                LifetimeClass::kPersistent, LifetimeClass::kCrossIteration,
                LifetimeClass::kScoped, LifetimeClass::kTransient,
                LifetimeClass::kCrossIteration, LifetimeClass::kDynamic,
                LifetimeClass::kPersistent}));
  EXPECT_EQ(Totals(r, LifetimeClass::kPersistent).bytes, 1400u);
  EXPECT_EQ(Totals(r, LifetimeClass::kCrossIteration).count, 2u);
  EXPECT_EQ(Totals(r, LifetimeClass::kCrossIteration).bytes, 400u);
  EXPECT_EQ(r.allocs, 7u);
  EXPECT_EQ(r.frees, 5u);
  EXPECT_EQ(r.never_freed, 2u);
  EXPECT_EQ(r.distinct_sizes, 7u);
  // Live bytes: 1000 1100 . . 1300 1350 1300 1200 . 1500 (t=9) ...
  EXPECT_EQ(r.peak_live_bytes, 1500u);
  EXPECT_EQ(r.peak_time, 9);
  // Rounded to 512: 1024+512+512+512 at t=5.
  EXPECT_EQ(r.peak_live_bytes_512, 2560u);
  // One 2 MiB granule each: four live at t=5.
  EXPECT_EQ(r.peak_live_bytes_2mib, 4u << 21);
  // Iteration 1 is incomplete: no pair to align, steady state = iteration 0.
  EXPECT_EQ(r.steady_state, 0);
  EXPECT_FALSE(r.regularity.has_value());
  EXPECT_EQ(r.iterations[0].allocs, 4u);
  EXPECT_EQ(r.iterations[0].peak_live_bytes, 1500u);
}

TEST(AnalysisTest, AlignmentMarksTheExtraRequestDynamic) {
  Trace t;
  uint64_t id = 1;
  for (int k = 0; k < 3; ++k) {
    t.AddIterationBegin(k);
    t.AddPhase(kPhaseForward);
    uint64_t a = id++, b = id++;
    t.AddAlloc(a, 8);
    t.AddAlloc(b, 16);
    if (k == 1) {  // one extra request in iteration 1
      t.AddAlloc(99, 24);
      t.AddFree(99);
    }
    t.AddFree(b);
    t.AddPhase(kPhaseBackward);
    t.AddFree(a);
    t.AddIterationEnd(k);
  }
  Workload w = BuildWorkload(t);
  WorkloadAnalysis r = AnalyzeWorkload(w);
  ASSERT_EQ(r.iterations.size(), 3u);
  EXPECT_FALSE(r.iterations[0].matched_previous.has_value());
  EXPECT_EQ(*r.iterations[1].matched_previous, 2u);  // of 3
  EXPECT_EQ(*r.iterations[2].matched_previous, 2u);  // of 2
  EXPECT_EQ(r.steady_state, 2);
  EXPECT_DOUBLE_EQ(*r.regularity, 1.0);
  EXPECT_EQ(Totals(r, LifetimeClass::kDynamic).count, 1u);
  EXPECT_EQ(Totals(r, LifetimeClass::kDynamic).bytes, 24u);
  EXPECT_EQ(r.classes[4], LifetimeClass::kDynamic);           // request 99
  EXPECT_EQ(Totals(r, LifetimeClass::kScoped).count, 3u);     // the 8s
  EXPECT_EQ(Totals(r, LifetimeClass::kTransient).count, 3u);  // the 16s
}

TEST(AnalysisTest, PhasesAreInferredFromThePeakWithoutMarkers) {
  Trace t;
  t.AddIterationBegin(0);  // 0
  t.AddAlloc(1, 100);      // 1  live 100
  t.AddAlloc(2, 50);       // 2  150
  t.AddFree(2);            // 3  100
  t.AddAlloc(3, 200);      // 4  300: the peak
  t.AddFree(3);            // 5
  t.AddFree(1);            // 6
  t.AddIterationEnd(0);    // 7
  Workload w = BuildWorkload(t);
  EXPECT_TRUE(w.phases_inferred);
  WorkloadAnalysis r = AnalyzeWorkload(w);
  EXPECT_EQ(r.classes, (std::vector<LifetimeClass>{LifetimeClass::kScoped,
                                                   LifetimeClass::kTransient,
                                                   LifetimeClass::kScoped}));
  EXPECT_NE(FormatAnalysisText(w, r).find("inferred"), std::string::npos);
}

// A marker-free periodic trace: a head of 5 weights, then 6 iterations of
// forward (per layer: temp, free, kept activation), backward (free the
// activation, a gradient temp) and an optimizer temp; iteration 3 has one
// extra request. 26 alloc/free events per regular iteration.
Trace PeriodicTrace() {
  Trace t;
  uint64_t id = 1;
  for (uint64_t size : {1000, 2000, 3000, 5000, 7000}) t.AddAlloc(id++, size);
  for (int k = 0; k < 6; ++k) {
    std::vector<uint64_t> acts;
    for (int layer = 0; layer < 4; ++layer) {
      uint64_t tmp = id++;
      t.AddAlloc(tmp, 512);
      t.AddFree(tmp);
      acts.push_back(id);
      t.AddAlloc(id++, 4096);
      if (k == 3 && layer == 1) {
        t.AddAlloc(id, 777);
        t.AddFree(id++);
      }
    }
    for (int layer = 3; layer >= 0; --layer) {
      t.AddFree(acts[layer]);
      t.AddAlloc(id, 256);
      t.AddFree(id++);
    }
    t.AddAlloc(id, 1024);
    t.AddFree(id++);
  }
  return t;
}

TEST(AnalysisTest, DetectsIterationsOfAMarkerFreePeriodicTrace) {
  Workload w = BuildWorkload(PeriodicTrace());
  EXPECT_EQ(w.events, 5u + 6 * 26 + 2);
  ASSERT_EQ(w.iteration_source, IterationSource::kPeriod);
  EXPECT_EQ(w.period.period, 26u);
  EXPECT_EQ(w.period.head, 5u);
  ASSERT_EQ(w.iterations.size(), 6u);
  std::vector<int64_t> begins;
  for (const Iteration& it : w.iterations) begins.push_back(it.begin);
  // Iteration 3 is 2 events longer; the boundary after it follows.
  EXPECT_EQ(begins, (std::vector<int64_t>{5, 31, 57, 83, 111, 137}));
  EXPECT_EQ(w.iterations.back().end, 163);
  EXPECT_TRUE(w.iterations.back().complete);
  EXPECT_TRUE(w.phases_inferred);

  WorkloadAnalysis r = AnalyzeWorkload(w);
  EXPECT_EQ(*r.iterations[3].matched_previous, 13u);  // of 14
  EXPECT_EQ(r.iterations[3].allocs, 14u);
  EXPECT_EQ(*r.iterations[4].matched_previous, 13u);  // of 13
  EXPECT_EQ(r.steady_state, 5);  // latest of the perfectly regular ones
  EXPECT_DOUBLE_EQ(*r.regularity, 1.0);
  EXPECT_EQ(Totals(r, LifetimeClass::kPersistent).count, 5u);
  EXPECT_EQ(Totals(r, LifetimeClass::kDynamic).count, 1u);
  EXPECT_EQ(Totals(r, LifetimeClass::kDynamic).bytes, 777u);
  EXPECT_EQ(Totals(r, LifetimeClass::kScoped).count, 24u);     // activations
  EXPECT_EQ(Totals(r, LifetimeClass::kTransient).count, 54u);  // temps
  EXPECT_EQ(Totals(r, LifetimeClass::kCrossIteration).count, 0u);
  EXPECT_EQ(r.peak_live_bytes, 18000u + 4 * 4096);
}

TEST(AnalysisTest, ATraceWithoutRepetitionIsOneIteration) {
  Trace t;
  for (uint64_t i = 1; i <= 30; ++i) {
    t.AddAlloc(i, i * 512);
    if (i % 3 == 0) t.AddFree(i - 1);
  }
  Workload w = BuildWorkload(t);
  EXPECT_EQ(w.iteration_source, IterationSource::kWholeTrace);
  ASSERT_EQ(w.iterations.size(), 1u);
  EXPECT_EQ(w.iterations[0].begin, 0);
  EXPECT_EQ(w.iterations[0].end, static_cast<int64_t>(t.events.size()));
  for (const Allocation& a : w.allocations) EXPECT_EQ(a.alloc_iteration, 0);
  WorkloadAnalysis r = AnalyzeWorkload(w);
  EXPECT_EQ(r.steady_state, 0);
  EXPECT_EQ(Totals(r, LifetimeClass::kPersistent).count, 20u);  // never freed
}

TEST(AnalysisTest, InstanceBecomesATraceWithFreesFirst) {
  Instance instance;
  instance.buffers = {{0, 0, 3, 4, 1}, {1, 3, 9, 4, 1}, {2, 0, 9, 4, 1}};
  Trace t = TraceFromInstance(instance);
  Trace expected;
  expected.header.provenance = "MiniMalloc CSV instance";
  expected.AddAlloc(0, 4);
  expected.AddAlloc(2, 4);
  expected.AddFree(0);
  expected.AddAlloc(1, 4);
  expected.AddFree(1);
  expected.AddFree(2);
  EXPECT_EQ(t, expected);
  WorkloadAnalysis r = AnalyzeWorkload(BuildWorkload(t));
  EXPECT_EQ(r.peak_live_bytes, 8u);
}

TEST(AnalysisTest, StreamingLoadEqualsInMemoryBuildAndJsonHasTheKeys) {
  SyntheticTraceOptions options;
  options.events = 5000;
  Trace trace = MakeSyntheticTrace(options);
  StatusOr<std::string> data = SerializeTrace(trace, TraceFormat::kBinary);
  ASSERT_TRUE(data.ok());
  StatusOr<std::unique_ptr<TraceReader>> reader =
      OpenTraceReader(NewMemorySource(*data, "s.ltb"));
  ASSERT_TRUE(reader.ok());
  StatusOr<Workload> streamed = LoadWorkload(**reader);
  ASSERT_TRUE(streamed.ok());
  Workload built = BuildWorkload(trace);
  ASSERT_EQ(streamed->allocations.size(), built.allocations.size());
  WorkloadAnalysis a = AnalyzeWorkload(*streamed);
  WorkloadAnalysis b = AnalyzeWorkload(built);
  EXPECT_EQ(a.classes, b.classes);
  EXPECT_EQ(streamed->iteration_source, IterationSource::kMarkers);
  // The MoE token buffers are dynamic; the weights persistent.
  EXPECT_GT(Totals(a, LifetimeClass::kDynamic).count, 0u);
  EXPECT_GE(Totals(a, LifetimeClass::kPersistent).count,
            static_cast<uint64_t>(options.head_weights));
  std::string json = FormatAnalysisJson(*streamed, a);
  for (const char* key :
       {"\"events\": 5000", "\"allocs\"", "\"frees\"", "\"peak_live_bytes\"",
        "\"iterations\"", "\"classes\"", "\"persistent\"", "\"scoped\"",
        "\"transient\"", "\"dynamic\"", "\"cross_iteration\""}) {
    EXPECT_NE(json.find(key), std::string::npos) << key;
  }
}

TEST(AnalysisTest, MarkerFreeMoeTraceFindsTheMarkedIterations) {
  // MoE token buffers change size every iteration (about a tenth of the
  // alloc/free events), yet the period is found.
  SyntheticTraceOptions options;
  options.events = 20000;
  options.layers = 12;
  options.moe_every = 2;
  Trace marked = MakeSyntheticTrace(options);
  options.iteration_markers = false;
  Trace unmarked = MakeSyntheticTrace(options);
  Workload with = BuildWorkload(marked);
  Workload without = BuildWorkload(unmarked);
  ASSERT_EQ(without.iteration_source, IterationSource::kPeriod);
  // The marked iterations: alloc/free events per iteration.
  uint64_t tokens = 0;
  for (int64_t t = with.iterations[1].begin; t < with.iterations[1].end; ++t) {
    EventKind kind = marked.events[t].kind;
    tokens += kind == EventKind::kAlloc || kind == EventKind::kFree;
  }
  EXPECT_EQ(without.period.period, tokens);
  EXPECT_EQ(without.period.head, static_cast<size_t>(options.head_weights));
  // Every boundary falls on a real iteration start (no drift), and the
  // iterations cover the alloc/free events after the head.
  uint64_t all_tokens = without.events_by_kind[1] + without.events_by_kind[2];
  EXPECT_EQ(without.iterations.size(),
            (all_tokens - without.period.head + tokens - 1) / tokens);
  for (size_t k = 0; k < without.period.starts.size(); ++k) {
    EXPECT_EQ(without.period.starts[k], without.period.head + k * tokens);
  }
}

TEST(AnalysisTest, LayersOfOneTrainingStepAreNotIterations) {
  // One step: 8 identical layers forward (each keeps an activation), then
  // backward frees them. The layer pattern repeats, but a layer does not end
  // where it started (memory grows, then shrinks): one iteration.
  Trace t;
  uint64_t id = 1;
  t.AddAlloc(id++, 100000);  // weights
  std::vector<uint64_t> acts;
  for (int layer = 0; layer < 8; ++layer) {
    t.AddAlloc(id, 512);
    t.AddFree(id++);
    acts.push_back(id);
    t.AddAlloc(id++, 4096);
    t.AddAlloc(id, 1024);
    t.AddFree(id++);
  }
  for (int layer = 7; layer >= 0; --layer) {
    t.AddAlloc(id, 2048);
    t.AddFree(id++);
    t.AddFree(acts[layer]);
  }
  Workload w = BuildWorkload(t);
  EXPECT_EQ(w.iteration_source, IterationSource::kWholeTrace);
  EXPECT_EQ(w.iterations.size(), 1u);
  // Without the balance test the layer period would be taken.
  std::vector<uint64_t> tokens;
  std::unordered_map<uint64_t, uint64_t> sizes;
  for (const Event& e : t.events) {
    if (e.kind == EventKind::kAlloc) sizes[e.id] = e.size;
    tokens.push_back(AllocationToken(e.kind == EventKind::kAlloc, sizes[e.id]));
  }
  PeriodResult unbalanced = DetectPeriod(tokens);
  EXPECT_TRUE(unbalanced.found);
  EXPECT_EQ(unbalanced.period, 5u);
}

std::string WriteTemp(const std::string& name, const std::string& content) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

TEST(WorkloadTest, LoadWorkloadFileDetectsCsvAndTraces) {
  std::string csv =
      WriteTemp("w.csv", "id,lower,upper,size\nb1,0,3,4\nb2,1,2,8\n");
  StatusOr<Workload> from_csv = LoadWorkloadFile(csv);
  ASSERT_TRUE(from_csv.ok()) << from_csv.status().ToString();
  EXPECT_EQ(from_csv->allocations.size(), 2u);
  EXPECT_EQ(AnalyzeWorkload(*from_csv).peak_live_bytes, 12u);

  std::string text = WriteTemp(
      "w.ltt",
      "# a comment, with a comma\nloom-trace 1\ndevice 0\ngranularity 0\n"
      "provenance \"\"\nevents\na 1 8\nend 1\n");
  StatusOr<Workload> from_text = LoadWorkloadFile(text);
  ASSERT_TRUE(from_text.ok()) << from_text.status().ToString();
  EXPECT_EQ(from_text->allocations.size(), 1u);

  StatusOr<std::string> binary =
      SerializeTrace(MarkedTrace(), TraceFormat::kBinary);
  ASSERT_TRUE(binary.ok());
  StatusOr<Workload> from_binary =
      LoadWorkloadFile(WriteTemp("w.ltb", *binary));
  ASSERT_TRUE(from_binary.ok());
  EXPECT_EQ(from_binary->allocations.size(), 7u);

  std::string bad = WriteTemp("bad.csv", "id,lower,upper,size\nb1,5,3,4\n");
  StatusOr<Workload> from_bad = LoadWorkloadFile(bad);
  EXPECT_FALSE(from_bad.ok());
  EXPECT_TRUE(from_bad.status().message().starts_with(bad))
      << from_bad.status().message();
}

}  // namespace
}  // namespace loom::plan
