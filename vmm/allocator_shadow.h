// AllocatorShadow: loom's own allocator without a plan, run on the side as
// the plan referee's shadow (plan_referee.h): what serving every request
// dynamically would hold.
//
// It is the real dynamic space (the same Allocator, no plan loaded) on a
// bookkeeping-only driver (FakeDriver: no memory, no device), with the
// rules of the allocator it shadows: the device's granularity and memory,
// its cap, the largest handle, stitching and its thresholds. So the referee
// compares the plan with what the run would really hold without it, stitching
// included, not with a model of it (a best fit over addresses only, which
// never reuses an idle granule at another place: it said 38.50 GB where
// loom without a plan holds 37.92 GB on the H200's perturbed llama1b trace,
// bench/results/misses.md, fifteenth session). Its events complete at once
// (a free on one stream is reusable by another immediately). It sees no
// module markers: a dynamic module's request gets the new chunks of any
// other there (LendingPolicy::kMaxNewChunkBytes, not the dynamic modules'
// smaller ones), so on MoE runs it may hold a little more than the
// dynamic space would.
//
// Invariants: everything it serves is freed before its allocator goes (no
// leak report); handles are the shadow allocator's addresses. Not
// thread-safe: the allocator it shadows serialises access.
#ifndef LOOM_VMM_ALLOCATOR_SHADOW_H_
#define LOOM_VMM_ALLOCATOR_SHADOW_H_

#include <cstdint>
#include <memory>
#include <unordered_set>

#include "vmm/allocator_options.h"
#include "vmm/fake_driver.h"
#include "vmm/plan_referee.h"

namespace loom::vmm {

class Allocator;

class AllocatorShadow final : public DynamicShadow {
 public:
  // `options`: the shadowed allocator's (every rule kept; its device
  // number, peers, recording and log dropped); `granularity` and
  // `device_bytes`: its device's.
  AllocatorShadow(const AllocatorOptions& options, uint64_t granularity,
                  uint64_t device_bytes);
  ~AllocatorShadow() override;

  void Restart(uint64_t iterations) override;
  void Stop() override;
  uint64_t Allocate(uint64_t size, Stream stream) override;
  void Free(uint64_t handle) override;
  void IterationBegin() override;
  uint64_t held_high_water() const override;
  bool exhausted() const override { return exhausted_; }

  // Allocations it serves now (for tests).
  size_t live() const { return live_.size(); }

 private:
  AllocatorOptions options_;
  const uint64_t granularity_;
  const uint64_t device_bytes_;
  std::unique_ptr<FakeDriver> driver_;
  std::unique_ptr<Allocator> allocator_;  // null while stopped
  std::unordered_set<uint64_t> live_;
  bool exhausted_ = false;
};

}  // namespace loom::vmm

#endif  // LOOM_VMM_ALLOCATOR_SHADOW_H_
