// Run-time allocator microbenchmarks, next to the caching-allocator
// simulator measured in the same run (the ratio is what counts; absolute
// times depend on the machine).
//
//   BM_LoomPlannedPair    a planned request and its free (matcher, safety
//                         check, static occupancy, stats)
//   BM_LoomDynamicPair    a request inside a dynamic module and its free
//                         (arena best fit over already-mapped granules; no
//                         driver call)
//   BM_CachingSimPair     PyTorch's caching allocator (simulator), same sizes
//   BM_ShadowReplayRealTrace  the plan referee's shadow (plan_referee.h,
//                         allocator_shadow.h): one event of the real GPT-2
//                         step (its requests and frees in order) served by
//                         loom's allocator without a plan on the fake
//                         driver; what watching a plan adds per request
//
// The fake driver is used: no driver call happens on these paths in steady
// state, which the benchmark checks.
#include <benchmark/benchmark.h>

#include <unordered_map>
#include <vector>

#include "vmm/allocator.h"
#include "vmm/allocator_shadow.h"
#include "vmm/fake_driver.h"
#include "vmm/plan_referee.h"
#include "whatif/loom/self_plan.h"
#include "whatif/sim/caching_allocator.h"
#include "whatif/workloads/load.h"

namespace loom {
namespace {

constexpr uint64_t kG = uint64_t{2} << 20;

// Sizes of a transformer-like step: many small and mid-size tensors.
const std::vector<uint64_t>& Sizes() {
  static const std::vector<uint64_t> sizes = {
      512,    4096, 65536,  262144,   1048576, 3145728,  1024,  8388608,
      131072, 2048, 524288, 16777216, 768,     33554432, 49152, 4194304};
  return sizes;
}

vmm::RuntimePlan MakePlan() {
  // Each request gets its own range: a valid plan for any order of frees.
  vmm::RuntimePlan plan;
  uint64_t offset = 0;
  int64_t t = 0;
  for (uint64_t size : Sizes()) {
    plan.iteration.push_back({size, static_cast<int64_t>(offset), t, t + 1});
    offset += (size + 511) / 512 * 512;
    ++t;
  }
  plan.region_bytes = (offset + kG - 1) / kG * kG;
  plan.period = t;
  return plan;
}

struct LoomSetup {
  LoomSetup() : driver(vmm::FakeDriverOptions{}) {
    vmm::AllocatorOptions options;
    allocator = std::move(vmm::Allocator::Create(driver, options)).value();
  }
  vmm::FakeDriver driver;
  std::unique_ptr<vmm::Allocator> allocator;
};

void BM_LoomPlannedPair(benchmark::State& state) {
  LoomSetup setup;
  vmm::Allocator& a = *setup.allocator;
  LOOM_CHECK(a.LoadPlan(MakePlan()).ok());
  const std::vector<uint64_t>& sizes = Sizes();
  // One round first: the region is backed as planned requests first reach
  // it (warm-up); the loop below is the steady state.
  a.IterationBegin(0);
  for (uint64_t size : sizes) (void)a.Free(*a.Allocate(size, 0));
  size_t i = 0;
  uint64_t creates_before = setup.driver.calls(vmm::DriverOp::kCreate);
  for (auto _ : state) {
    if (i == 0) a.IterationBegin(0);
    StatusOr<vmm::DevicePtr> p = a.Allocate(sizes[i], 0);
    benchmark::DoNotOptimize(p);
    (void)a.Free(*p);
    i = i + 1 == sizes.size() ? 0 : i + 1;
  }
  vmm::AllocatorStats s = a.stats();
  LOOM_CHECK(s.plan_misses == 0, "{} misses", s.plan_misses);
  LOOM_CHECK(setup.driver.calls(vmm::DriverOp::kCreate) == creates_before);
  state.counters["hit_rate"] =
      static_cast<double>(s.plan_hits) /
      std::max<uint64_t>(1, s.plan_hits + s.plan_misses);
}
BENCHMARK(BM_LoomPlannedPair);
// Fixed iteration counts, for counting instructions per pair under callgrind
// (the difference between the two runs divided by 100000).
BENCHMARK(BM_LoomPlannedPair)->Iterations(100000);
BENCHMARK(BM_LoomPlannedPair)->Iterations(200000);

// The requests of a real PyTorch training step (GPT-2 small, the demo's
// trace), planned by loom; each request is made and freed in the plan's
// order (a free right after its allocation is always safe to serve).
void BM_LoomPlannedPairRealTrace(benchmark::State& state) {
  static const auto* planned = [] {
    StatusOr<whatif::Workload> w =
        whatif::LoadWorkload("bench/data/traces/gpt2small_train_step.ltt");
    LOOM_CHECK(w.ok(), "{}", w.status().ToString());
    whatif::SelfPlanOptions options;
    options.time_limit_seconds = 2;
    StatusOr<whatif::SelfPlan> p =
        whatif::PlanTraceForRuntime(w->trace, options);
    LOOM_CHECK(p.ok(), "{}", p.status().ToString());
    return new vmm::RuntimePlan(std::move(p->runtime));
  }();
  LoomSetup setup;
  vmm::Allocator& a = *setup.allocator;
  LOOM_CHECK(a.LoadPlan(*planned).ok());
  const std::vector<vmm::PlannedRequest>& seq = planned->iteration;
  size_t i = 0;
  for (auto _ : state) {
    StatusOr<vmm::DevicePtr> p = a.Allocate(seq[i].size, 0);
    benchmark::DoNotOptimize(p);
    (void)a.Free(*p);
    i = i + 1 == seq.size() ? 0 : i + 1;
  }
  vmm::AllocatorStats s = a.stats();
  LOOM_CHECK(s.plan_misses == 0, "{} misses", s.plan_misses);
  state.counters["requests"] = static_cast<double>(seq.size());
}
BENCHMARK(BM_LoomPlannedPairRealTrace);

void BM_CachingSimPairRealTrace(benchmark::State& state) {
  static const auto* sizes = [] {
    StatusOr<whatif::Workload> w =
        whatif::LoadWorkload("bench/data/traces/gpt2small_train_step.ltt");
    LOOM_CHECK(w.ok(), "{}", w.status().ToString());
    auto* out = new std::vector<uint64_t>;
    for (const plan::Event& e : w->trace.events) {
      if (e.kind == plan::EventKind::kAlloc) out->push_back(e.size);
    }
    return out;
  }();
  whatif::CachingConfig config;
  whatif::SimOptions options;
  whatif::CachingAllocator sim(config, options);
  for (uint64_t size : *sizes) (void)sim.Free(*sim.Malloc(size, 0));
  size_t i = 0;
  for (auto _ : state) {
    StatusOr<uint64_t> p = sim.Malloc((*sizes)[i], 0);
    benchmark::DoNotOptimize(p);
    (void)sim.Free(*p);
    i = i + 1 == sizes->size() ? 0 : i + 1;
  }
}
BENCHMARK(BM_CachingSimPairRealTrace);

void BM_ShadowReplayRealTrace(benchmark::State& state) {
  static const auto* events = [] {
    StatusOr<whatif::Workload> w =
        whatif::LoadWorkload("bench/data/traces/gpt2small_train_step.ltt");
    LOOM_CHECK(w.ok(), "{}", w.status().ToString());
    // (request id, size); a free has size 0.
    auto* out = new std::vector<std::pair<uint64_t, uint64_t>>;
    for (const plan::Event& e : w->trace.events) {
      if (e.kind == plan::EventKind::kAlloc) out->emplace_back(e.id, e.size);
      if (e.kind == plan::EventKind::kFree) out->emplace_back(e.id, 0);
    }
    return out;
  }();
  vmm::AllocatorShadow shadow(vmm::AllocatorOptions{}, 2 << 20,
                              uint64_t{80} << 30);
  shadow.Restart(2);  // stitching, as in a run's third iteration
  std::unordered_map<uint64_t, uint64_t> live;
  live.reserve(events->size());
  size_t i = 0;
  for (auto _ : state) {
    const auto [id, size] = (*events)[i];
    if (size != 0) {
      live[id] = shadow.Allocate(size, 0);
    } else if (auto it = live.find(id); it != live.end()) {
      shadow.Free(it->second);
      live.erase(it);
    }
    if (++i == events->size()) {
      // Requests the step never frees go before the next round.
      for (const auto& [rid, at] : live) shadow.Free(at);
      live.clear();
      i = 0;
    }
  }
  state.counters["held_MiB"] =
      static_cast<double>(shadow.held_high_water() >> 20);
}
BENCHMARK(BM_ShadowReplayRealTrace);

void BM_LoomDynamicPair(benchmark::State& state) {
  LoomSetup setup;
  vmm::Allocator& a = *setup.allocator;
  a.ModuleEnter("experts", /*dynamic=*/true);
  const std::vector<uint64_t>& sizes = Sizes();
  // Warm up: map the granules once.
  for (uint64_t size : sizes) (void)a.Free(*a.Allocate(size, 0));
  uint64_t maps_before = setup.driver.calls(vmm::DriverOp::kMap);
  size_t i = 0;
  for (auto _ : state) {
    StatusOr<vmm::DevicePtr> p = a.Allocate(sizes[i], 0);
    benchmark::DoNotOptimize(p);
    (void)a.Free(*p);
    i = i + 1 == sizes.size() ? 0 : i + 1;
  }
  LOOM_CHECK(setup.driver.calls(vmm::DriverOp::kMap) == maps_before,
             "driver calls in steady state");
  a.ModuleExit("experts");
}
BENCHMARK(BM_LoomDynamicPair);
BENCHMARK(BM_LoomDynamicPair)->Iterations(100000);
BENCHMARK(BM_LoomDynamicPair)->Iterations(200000);

void BM_CachingSimPair(benchmark::State& state) {
  whatif::CachingConfig config;
  whatif::SimOptions options;
  whatif::CachingAllocator sim(config, options);
  const std::vector<uint64_t>& sizes = Sizes();
  for (uint64_t size : sizes) (void)sim.Free(*sim.Malloc(size, 0));
  size_t i = 0;
  for (auto _ : state) {
    StatusOr<uint64_t> p = sim.Malloc(sizes[i], 0);
    benchmark::DoNotOptimize(p);
    (void)sim.Free(*p);
    i = i + 1 == sizes.size() ? 0 : i + 1;
  }
}
BENCHMARK(BM_CachingSimPair);
BENCHMARK(BM_CachingSimPair)->Iterations(100000);
BENCHMARK(BM_CachingSimPair)->Iterations(200000);

}  // namespace
}  // namespace loom

BENCHMARK_MAIN();
