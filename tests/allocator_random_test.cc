// Seeded randomized operation sequences against the run-time allocator, with
// every invariant checked after every step.
//
// Each seed builds a steady "training iteration" (nested lifetimes, repeated
// sizes), plans it with a small independent first-fit planner, and replays it
// for several iterations with perturbations: dropped, added and resized
// requests, frees delayed past their planned end, dynamic-module requests,
// record_stream on other streams, empty_cache, and injected driver failures.
// On the host backend every allocation is filled with a tag and checked at
// free (real aliasing: two allocations sharing a physical byte would corrupt
// each other); CheckInvariants verifies that no physical byte belongs to two
// live allocations. Seeds that once failed are kept in kRegressionSeeds.
#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <random>
#include <vector>

#include "vmm/allocator.h"
#include "vmm/fake_driver.h"
#include "vmm/host_driver.h"

namespace loom::vmm {
namespace {

constexpr uint64_t kG = 64 << 10;

struct Buf {
  uint64_t size;
  int64_t start;
  int64_t end;
  int64_t offset = kUnplanned;
};

// A training-like iteration: forward allocations freed in reverse order in
// backward, transient buffers in between, a few buffers that cross the
// iteration boundary.
std::vector<Buf> MakeIteration(std::mt19937_64& rng) {
  std::vector<uint64_t> sizes = {512, 4096, 40000, kG, kG + 4096, 3 * kG / 2};
  std::uniform_int_distribution<int> pick(0,
                                          static_cast<int>(sizes.size()) - 1);
  int layers = 3 + static_cast<int>(rng() % 4);
  std::vector<Buf> bufs;
  int64_t t = 0;
  std::vector<size_t> stack;
  for (int l = 0; l < layers; ++l) {
    bufs.push_back({sizes[pick(rng)], t++, 0});
    stack.push_back(bufs.size() - 1);
    bufs.push_back({sizes[pick(rng)], t, t + 1});  // transient
    t += 2;
  }
  while (!stack.empty()) {
    bufs[stack.back()].end = t;
    stack.pop_back();
    bufs.push_back({sizes[pick(rng)], t, t + 1});
    t += 2;
  }
  return bufs;
}

// First-fit over lifetimes, independent of loom's planner.
uint64_t PlaceFirstFit(std::vector<Buf>& bufs) {
  uint64_t peak = 0;
  for (size_t i = 0; i < bufs.size(); ++i) {
    std::vector<std::pair<uint64_t, uint64_t>> taken;
    for (size_t j = 0; j < i; ++j) {
      if (bufs[j].start < bufs[i].end && bufs[i].start < bufs[j].end) {
        taken.emplace_back(bufs[j].offset, bufs[j].offset + bufs[j].size);
      }
    }
    std::sort(taken.begin(), taken.end());
    uint64_t at = 0;
    for (const auto& [lo, hi] : taken) {
      if (at + bufs[i].size <= lo) break;
      at = std::max(at, (hi + 511) / 512 * 512);
    }
    bufs[i].offset = static_cast<int64_t>(at);
    peak = std::max(peak, at + bufs[i].size);
  }
  return peak;
}

RuntimePlan ToPlan(const std::vector<Buf>& bufs, uint64_t peak) {
  RuntimePlan plan;
  plan.region_bytes = (peak + kG - 1) / kG * kG;
  std::vector<Buf> by_start = bufs;
  std::stable_sort(
      by_start.begin(), by_start.end(),
      [](const Buf& a, const Buf& b) { return a.start < b.start; });
  for (const Buf& b : by_start) {
    plan.iteration.push_back({b.size, b.offset, b.start, b.end});
    plan.period = std::max(plan.period, b.end);
  }
  // The "experts" module is planned to run in the middle of the iteration:
  // its window lends the granules idle then.
  DynamicWindow window{"experts", plan.period / 2, plan.period / 2 + 1, {}};
  for (uint32_t k = 0; k < plan.region_bytes / kG; ++k) {
    bool idle = true;
    for (const Buf& b : bufs) {
      bool live = b.start <= window.start && window.start < b.end;
      uint64_t lo = b.offset, hi = b.offset + b.size;
      if (live && lo < (k + 1) * kG && k * kG < hi) idle = false;
    }
    if (idle) window.idle_granules.push_back(k);
  }
  // Slots for its three requests (dynamic requests with a home), anywhere
  // in the region, overlapping planned buffers or not: the run time's
  // safety check, not the layout, must keep every byte single-owner. A
  // generator of their own, so the seeds' programs stay what they were.
  std::mt19937_64 slots(peak * 31 + bufs.size());
  for (int e = 0; e < 3; ++e) {
    const uint64_t size = 4096 + slots() % (3 * kG);
    PlannedRequest slot{size, kUnplanned, window.start,
                        window.end + static_cast<int64_t>(slots() % 8)};
    if (size <= plan.region_bytes) {
      slot.offset = static_cast<int64_t>(
          slots() % (plan.region_bytes - size + 1) / 512 * 512);
    }
    window.steady.requests.push_back(slot);
    window.steady.calls.push_back(1);
  }
  plan.windows.push_back(window);
  return plan;
}

// Summed over every run, to show the runs exercise each path.
struct Totals {
  uint64_t hits = 0, misses = 0, dynamic = 0, dynamic_hits = 0, ooms = 0,
           stitched = 0;
};
Totals totals;

struct Live {
  DevicePtr ptr;
  uint64_t size;
  uint8_t tag;
};

class RandomRun {
 public:
  // `stitch_early_bytes`: AllocatorOptions::stitch_early_bytes (the
  // default is more than any request here).
  RandomRun(uint64_t seed, bool host,
            uint64_t stitch_early_bytes = kStitchEarlyBytes)
      : rng_(seed), host_(host) {
    if (host) {
      HostDriverOptions o;
      o.granularity = kG;
      o.capacity_per_device = 20 * kG;
      driver_ = std::move(HostDriver::Open(o)).value();
    } else {
      FakeDriverOptions o;
      o.granularity = kG;
      o.capacity_per_device = 20 * kG;
      auto fake = std::make_unique<FakeDriver>(o);
      fake->set_events_complete_immediately(false);
      fake_ = fake.get();
      driver_ = std::move(fake);
    }
    AllocatorOptions options;
    options.arena_va_bytes = 2048 * kG;
    options.record_capacity = 4096;
    options.stitch_early_bytes = stitch_early_bytes;
    allocator_ = std::move(Allocator::Create(*driver_, options)).value();
  }

  void Run(int iterations) {
    std::vector<Buf> bufs = MakeIteration(rng_);
    uint64_t peak = PlaceFirstFit(bufs);
    // Record mode for the first iteration, then the plan (like `auto`).
    bool planned = false;
    for (int it = 0; it < iterations; ++it) {
      if (!planned && (it == 1 || rng_() % 4 == 0)) {
        Status loaded = allocator_->LoadPlan(ToPlan(bufs, peak));
        ASSERT_TRUE(loaded.ok()) << loaded.ToString();
        planned = true;
      }
      RunIteration(bufs, it);
      if (::testing::Test::HasFatalFailure()) return;
    }
    for (auto& [id, live] : carried_) ASSERT_NO_FATAL_FAILURE(Free(live));
    carried_.clear();
    if (fake_ != nullptr) fake_->CompleteEvents();
    ASSERT_TRUE(allocator_->EmptyCache().ok());
    allocator_->CheckInvariants();
    AllocatorStats s = allocator_->stats();
    EXPECT_EQ(s.allocated_bytes.current, 0u);
    totals.hits += s.plan_hits;
    totals.misses += s.plan_misses;
    totals.dynamic += s.dynamic_requests;
    totals.dynamic_hits += s.dynamic_hits;
    totals.ooms += s.num_ooms;
    totals.stitched += s.stitched_pages;
  }

 private:
  bool Chance(int percent) { return static_cast<int>(rng_() % 100) < percent; }

  void Check() {
    allocator_->CheckInvariants();
    if (!host_ || live_.empty()) return;
    // Spot-check one live allocation's data.
    auto it = live_.begin();
    std::advance(it, rng_() % live_.size());
    ASSERT_NO_FATAL_FAILURE(Verify(it->second));
  }

  void Verify(const Live& l) {
    if (!host_) return;
    const uint8_t* p = reinterpret_cast<const uint8_t*>(l.ptr);
    for (uint64_t i = 0; i < l.size; i += 61) {
      ASSERT_EQ(p[i], l.tag)
          << "allocation at " << l.ptr << " corrupted at byte " << i;
    }
    ASSERT_EQ(p[l.size - 1], l.tag);
  }

  std::optional<Live> Alloc(uint64_t size, Stream stream) {
    if (Chance(3)) {
      // A driver failure (any backend: on the host one, memory handed out
      // without access would fault at the memset below). Sometimes the
      // unmap that undoes what the request mapped fails too.
      static constexpr DriverOp kOps[] = {DriverOp::kCreate, DriverOp::kMap,
                                          DriverOp::kSetAccess,
                                          DriverOp::kUnmap};
      driver_->InjectFailure(kOps[rng_() % std::size(kOps)], 1,
                             InternalError("injected"));
      if (Chance(30)) {
        driver_->InjectFailure(DriverOp::kUnmap, 1, InternalError("injected"));
      }
    }
    StatusOr<DevicePtr> p = allocator_->Allocate(size, stream);
    driver_->ClearFailures();
    if (!p.ok()) {
      EXPECT_TRUE(p.status().code() == StatusCode::kOutOfMemory ||
                  p.status().code() == StatusCode::kInternal)
          << p.status().ToString();
      return std::nullopt;
    }
    Live l{*p, size, static_cast<uint8_t>(1 + rng_() % 254)};
    if (host_) std::memset(reinterpret_cast<void*>(l.ptr), l.tag, size);
    if (Chance(5))
      EXPECT_TRUE(allocator_->RecordStream(l.ptr, 0x5000 + rng_() % 3).ok());
    return l;
  }

  void Free(const Live& l) {
    ASSERT_NO_FATAL_FAILURE(Verify(l));
    ASSERT_TRUE(allocator_->Free(l.ptr).ok());
  }

  void RunIteration(const std::vector<Buf>& bufs, int number) {
    allocator_->IterationBegin(number);
    int64_t horizon = 0;
    for (const Buf& b : bufs) horizon = std::max(horizon, b.end);
    live_.clear();
    for (int64_t t = 0; t <= horizon; ++t) {
      for (size_t i = 0; i < bufs.size(); ++i) {
        if (bufs[i].end != t || !live_.contains(i)) continue;
        if (Chance(8)) {  // delay the free into the next iteration
          carried_.emplace(next_carry_++, live_[i]);
        } else {
          ASSERT_NO_FATAL_FAILURE(Free(live_[i]));
        }
        live_.erase(i);
        ASSERT_NO_FATAL_FAILURE(Check());
      }
      if (!carried_.empty() && Chance(15)) {
        ASSERT_NO_FATAL_FAILURE(Free(carried_.begin()->second));
        carried_.erase(carried_.begin());
      }
      for (size_t i = 0; i < bufs.size(); ++i) {
        if (bufs[i].start != t || Chance(5)) continue;  // dropped request
        uint64_t size = bufs[i].size;
        if (Chance(5)) size += 512 * (1 + rng_() % 8);  // resized
        Stream stream = Chance(10) ? 0x5000 : 0;
        std::optional<Live> l = Alloc(size, stream);
        if (l) live_[i] = *l;
        ASSERT_NO_FATAL_FAILURE(Check());
        if (Chance(5)) {  // an extra request, freed soon
          std::optional<Live> extra = Alloc(1 + rng_() % (2 * kG), 0);
          if (extra) carried_.emplace(next_carry_++, *extra);
        }
      }
      if (Chance(4)) {  // a dynamic module with sizes that change every time
        allocator_->ModuleEnter("experts", true);
        std::vector<Live> tokens;
        for (int e = 0; e < 3; ++e) {
          std::optional<Live> l = Alloc(4096 + rng_() % (3 * kG), 0);
          if (l) tokens.push_back(*l);
          ASSERT_NO_FATAL_FAILURE(Check());
        }
        allocator_->ModuleExit("experts");
        // Some token buffers outlive the module (like MoE activations kept
        // for backward), so lent pages meet their planned owners.
        for (const Live& l : tokens) {
          if (Chance(50)) {
            carried_.emplace(next_carry_++, l);
          } else {
            ASSERT_NO_FATAL_FAILURE(Free(l));
          }
        }
      }
      if (fake_ != nullptr && Chance(20)) fake_->CompleteEvents();
      if (Chance(1))
        ASSERT_TRUE(allocator_->EmptyCache().ok() || fake_ != nullptr);
      ASSERT_NO_FATAL_FAILURE(Check());
    }
    for (auto& [i, l] : live_) carried_.emplace(next_carry_++, l);
    live_.clear();
    allocator_->IterationEnd(number);
  }

  std::mt19937_64 rng_;
  bool host_;
  std::unique_ptr<Driver> driver_;
  FakeDriver* fake_ = nullptr;
  std::unique_ptr<Allocator> allocator_;
  std::map<size_t, Live> live_;
  std::map<uint64_t, Live> carried_;
  uint64_t next_carry_ = 0;
};

// Seeds that once broke an invariant (keep them; add new ones here).
constexpr uint64_t kRegressionSeeds[] = {1, 2, 3};

TEST(AllocatorRandomTest, HostBackendSeeds) {
  totals = {};
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    RandomRun run(seed, /*host=*/true);
    ASSERT_NO_FATAL_FAILURE(run.Run(6));
  }
  // The runs must have exercised hits, misses and the dynamic path.
  EXPECT_GT(totals.hits, 1000u);
  EXPECT_GT(totals.misses, 50u);
  EXPECT_GT(totals.dynamic, 100u);
  EXPECT_GT(totals.dynamic_hits, 20u);
}

TEST(AllocatorRandomTest, FakeBackendWithStreamsAndFailures) {
  totals = {};
  for (uint64_t seed = 1000; seed <= 1040; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    RandomRun run(seed, /*host=*/false);
    ASSERT_NO_FATAL_FAILURE(run.Run(6));
  }
  EXPECT_GT(totals.hits, 1000u);
  EXPECT_GT(totals.misses, 50u);
  EXPECT_GT(totals.dynamic_hits, 20u);
}

// Stitching from the first request (a large request's rule, driven here by
// every request of a granule or more): idle chunks mapped at a second
// place while the plan serves, is suspended or has lost, on both backends
// (real aliasing; streams and injected failures), data and invariants
// checked after every step.
TEST(AllocatorRandomTest, StitchingFromTheFirstRequest) {
  // The first iteration alone: only the early rule stitches there.
  uint64_t first_iteration[2] = {0, 0};  // default threshold, one granule
  for (int low = 0; low < 2; ++low) {
    totals = {};
    for (uint64_t seed = 2000; seed < 2200; ++seed) {
      SCOPED_TRACE(testing::Message() << "seed " << seed);
      for (bool host : {true, false}) {
        RandomRun run(seed, host, low ? kG : kStitchEarlyBytes);
        ASSERT_NO_FATAL_FAILURE(run.Run(1));
      }
    }
    first_iteration[low] = totals.stitched;
  }
  EXPECT_EQ(first_iteration[0], 0u);
  EXPECT_GT(first_iteration[1], 0u);
  // Whole runs with the rule on.
  totals = {};
  for (uint64_t seed = 2000; seed < 2040; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    for (bool host : {true, false}) {
      RandomRun run(seed, host, /*stitch_early_bytes=*/kG);
      ASSERT_NO_FATAL_FAILURE(run.Run(6));
    }
  }
  EXPECT_GT(totals.hits, 1000u);
  EXPECT_GT(totals.stitched, 20u);
}

TEST(AllocatorRandomTest, RegressionSeeds) {
  for (uint64_t seed : kRegressionSeeds) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    for (bool host : {true, false}) {
      RandomRun run(seed, host);
      ASSERT_NO_FATAL_FAILURE(run.Run(8));
    }
  }
}

}  // namespace
}  // namespace loom::vmm
