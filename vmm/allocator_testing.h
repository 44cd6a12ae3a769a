// Test helpers for the allocator's tests: a host driver (real memory) and
// allocations stamped with a byte of their own, checked before they are
// freed (data damaged by a byte handed out twice shows there). Test-only.
#ifndef LOOM_VMM_ALLOCATOR_TESTING_H_
#define LOOM_VMM_ALLOCATOR_TESTING_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "vmm/allocator.h"
#include "vmm/host_driver.h"

namespace loom::vmm::test_support {

// A host driver of `granularity`-byte pages and `capacity` bytes per device.
inline std::unique_ptr<HostDriver> HostForTest(uint64_t granularity,
                                               uint64_t capacity) {
  HostDriverOptions options;
  options.granularity = granularity;
  options.capacity_per_device = capacity;
  return std::move(HostDriver::Open(options)).value();
}

// Writes `tag` over [ptr, ptr + size).
inline void Stamp(Driver& d, DevicePtr ptr, uint64_t size, uint8_t tag) {
  ASSERT_TRUE(d.Memset(ptr, tag, size).ok());
}

// Checks that [ptr, ptr + size) still holds `tag`.
inline void ExpectStamp(Driver& d, DevicePtr ptr, uint64_t size, uint8_t tag) {
  std::vector<uint8_t> back(size);
  ASSERT_TRUE(d.CopyToHost(back.data(), ptr, size).ok());
  for (uint64_t i = 0; i < size; ++i) {
    ASSERT_EQ(back[i], tag) << "byte " << i << " of the allocation at " << ptr;
  }
}

// Runs iteration `number` of a stack of `n` requests of `unit` bytes on
// stream 0 (allocated in order, freed in reverse: a forward and backward),
// each stamped with a byte of its own and checked at its free.
inline void RunStack(Allocator& a, Driver& d, uint64_t unit, int n,
                     uint64_t number) {
  a.IterationBegin(number);
  std::vector<DevicePtr> live;
  for (int i = 0; i < n; ++i) {
    StatusOr<DevicePtr> p = a.Allocate(unit, 0);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    ASSERT_NO_FATAL_FAILURE(Stamp(d, *p, unit, static_cast<uint8_t>(i + 1)));
    live.push_back(*p);
  }
  a.CheckInvariants();
  for (int i = n - 1; i >= 0; --i) {
    ASSERT_NO_FATAL_FAILURE(
        ExpectStamp(d, live[i], unit, static_cast<uint8_t>(i + 1)));
    ASSERT_TRUE(a.Free(live[i]).ok());
  }
  a.IterationEnd(number);
}

// Live allocations on stream 0, each stamped with a byte of its own: every
// free checks its stamp first.
class StampedAllocations {
 public:
  StampedAllocations(Allocator& a, Driver& d) : a_(a), d_(d) {}
  void Allocate(uint64_t size) {
    StatusOr<DevicePtr> p = a_.Allocate(size, 0);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    ++stamp_;
    ASSERT_NO_FATAL_FAILURE(Stamp(d_, *p, size, stamp_));
    live_[*p] = {size, stamp_};
  }
  // Frees the index-th live allocation (by address).
  void Free(size_t index) {
    auto at = live_.begin();
    std::advance(at, index);
    ASSERT_NO_FATAL_FAILURE(
        ExpectStamp(d_, at->first, at->second.first, at->second.second));
    ASSERT_TRUE(a_.Free(at->first).ok());
    live_.erase(at);
  }
  void FreeAll() {
    while (!live_.empty()) ASSERT_NO_FATAL_FAILURE(Free(0));
  }
  size_t size() const { return live_.size(); }

 private:
  Allocator& a_;
  Driver& d_;
  std::map<DevicePtr, std::pair<uint64_t, uint8_t>> live_;
  uint8_t stamp_ = 0;
};

}  // namespace loom::vmm::test_support

#endif  // LOOM_VMM_ALLOCATOR_TESTING_H_
