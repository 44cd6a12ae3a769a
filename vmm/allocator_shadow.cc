#include "vmm/allocator_shadow.h"

#include <algorithm>

#include "base/check.h"
#include "vmm/allocator.h"

namespace loom::vmm {

AllocatorShadow::AllocatorShadow(const AllocatorOptions& options,
                                 uint64_t granularity, uint64_t device_bytes)
    : options_(options),
      granularity_(granularity),
      device_bytes_(device_bytes) {
  // The rules of the dynamic space and its memory, every one of them;
  // nothing of the shadowed allocator's surroundings (its device number,
  // peers, recording, log).
  options_.device = 0;
  options_.peer_devices.clear();
  options_.record_capacity = 0;
  options_.log_plan_loss = false;
}

AllocatorShadow::~AllocatorShadow() { Stop(); }

void AllocatorShadow::Stop() {
  if (allocator_ != nullptr) {
    for (uint64_t ptr : live_) {
      Status freed = allocator_->Free(ptr);
      LOOM_CHECK(freed.ok(), "shadow free: {}", freed.ToString());
    }
  }
  live_.clear();
  allocator_.reset();
  driver_.reset();
  exhausted_ = false;
}

void AllocatorShadow::Restart(uint64_t iterations) {
  Stop();
  FakeDriverOptions fake;
  fake.granularity = granularity_;
  fake.capacity_per_device = device_bytes_;
  driver_ = std::make_unique<FakeDriver>(fake);
  StatusOr<std::unique_ptr<Allocator>> made =
      Allocator::Create(*driver_, options_);
  if (!made.ok()) {
    // No shadow to judge by (the options the shadowed allocator was made
    // with are refused here): the plan is never judged to lose.
    exhausted_ = true;
    driver_.reset();
    return;
  }
  allocator_ = std::move(*made);
  // The dynamic space's rules depend on the iteration count only through
  // when stitching starts (lending_policy.h).
  const uint64_t markers = std::min(iterations, kStitchFromIteration);
  for (uint64_t i = 0; i < markers; ++i) allocator_->IterationBegin(i);
}

uint64_t AllocatorShadow::Allocate(uint64_t size, Stream stream) {
  if (allocator_ == nullptr) return kNoShadow;
  StatusOr<DevicePtr> ptr = allocator_->Allocate(size, stream);
  if (!ptr.ok()) {
    exhausted_ = true;
    return kNoShadow;
  }
  live_.insert(*ptr);
  return *ptr;
}

void AllocatorShadow::Free(uint64_t handle) {
  LOOM_CHECK(allocator_ != nullptr && live_.erase(handle) == 1,
             "shadow free of {:#x}: not live", handle);
  Status freed = allocator_->Free(handle);
  LOOM_CHECK(freed.ok(), "shadow free: {}", freed.ToString());
}

void AllocatorShadow::IterationBegin() {
  if (allocator_ != nullptr) allocator_->IterationBegin(0);
}

uint64_t AllocatorShadow::held_high_water() const {
  return allocator_ != nullptr ? allocator_->held_high_water() : 0;
}

}  // namespace loom::vmm
