#include "whatif/sim/stats.h"

#include <algorithm>

#include "base/check.h"

namespace loom::whatif {

void Stat::Increase(uint64_t amount) {
  current += static_cast<int64_t>(amount);
  peak = std::max(peak, current);
  allocated += static_cast<int64_t>(amount);
}

void Stat::Decrease(uint64_t amount) {
  LOOM_CHECK(static_cast<int64_t>(amount) <= current,
             "stat would go negative: {} - {}", current, amount);
  current -= static_cast<int64_t>(amount);
  freed += static_cast<int64_t>(amount);
}

void StatArray::Increase(bool small_pool, uint64_t amount) {
  (*this)[StatType::kAll].Increase(amount);
  (*this)[small_pool ? StatType::kSmallPool : StatType::kLargePool].Increase(
      amount);
}

void StatArray::Decrease(bool small_pool, uint64_t amount) {
  (*this)[StatType::kAll].Decrease(amount);
  (*this)[small_pool ? StatType::kSmallPool : StatType::kLargePool].Decrease(
      amount);
}

void StatArray::ResetPeak() {
  for (Stat& stat : entries) stat.ResetPeak();
}

std::vector<std::pair<std::string, int64_t>> MemoryStats::Flatten() const {
  std::vector<std::pair<std::string, int64_t>> out;
  static constexpr const char* kPools[] = {"all", "small_pool", "large_pool"};
  auto add_stat = [&out](const std::string& prefix, const Stat& stat) {
    out.emplace_back(prefix + ".current", stat.current);
    out.emplace_back(prefix + ".peak", stat.peak);
    out.emplace_back(prefix + ".allocated", stat.allocated);
    out.emplace_back(prefix + ".freed", stat.freed);
  };
  auto add_array = [&](const char* name, const StatArray& array) {
    for (int i = 0; i < 3; ++i) {
      add_stat(std::string(name) + "." + kPools[i], array.entries[i]);
    }
  };
  // Same order as THCPModule_memoryStats builds the dictionary.
  out.emplace_back("num_alloc_retries", num_alloc_retries);
  out.emplace_back("num_ooms", num_ooms);
  out.emplace_back("max_split_size",
                   max_split_size == kNoMaxSplitSize
                       ? -1
                       : static_cast<int64_t>(max_split_size));
  out.emplace_back("num_sync_all_streams", num_sync_all_streams);
  out.emplace_back("num_device_alloc", num_device_alloc);
  out.emplace_back("num_device_free", num_device_free);
  add_array("allocation", allocation);
  add_array("segment", segment);
  add_array("active", active);
  add_array("inactive_split", inactive_split);
  add_array("allocated_bytes", allocated_bytes);
  add_array("reserved_bytes", reserved_bytes);
  add_array("active_bytes", active_bytes);
  add_array("inactive_split_bytes", inactive_split_bytes);
  add_array("requested_bytes", requested_bytes);
  add_stat("oversize_allocations", oversize_allocations);
  add_stat("oversize_segments", oversize_segments);
  std::sort(out.begin(), out.end());  // memory_stats() returns sorted keys
  return out;
}

void MemoryStats::ResetPeaks() {
  for (StatArray* array : {&allocation, &segment, &active, &inactive_split,
                           &allocated_bytes, &reserved_bytes, &active_bytes,
                           &inactive_split_bytes, &requested_bytes}) {
    array->ResetPeak();
  }
  oversize_allocations.ResetPeak();
  oversize_segments.ResetPeak();
}

namespace {

// The count field of each kind, in kAllDriverCallKinds' order.
constexpr std::array<uint64_t DriverCalls::*, kDriverCallKinds> kCountFields = {
    &DriverCalls::malloc,      &DriverCalls::free,
    &DriverCalls::mem_create,  &DriverCalls::mem_release,
    &DriverCalls::mem_map,     &DriverCalls::mem_unmap,
    &DriverCalls::set_access,  &DriverCalls::address_reserve,
    &DriverCalls::address_free};

constexpr std::array<std::string_view, kDriverCallKinds> kCallNames = {
    "cudaMalloc",      "cudaFree",   "cuMemCreate",    "cuMemRelease",
    "cuMemMap",        "cuMemUnmap", "cuMemSetAccess", "cuMemAddressReserve",
    "cuMemAddressFree"};

}  // namespace

std::string_view DriverCallName(DriverCallKind kind) {
  return kCallNames[static_cast<size_t>(kind)];
}

void DriverCalls::Add(DriverCallKind kind, uint64_t calls, uint64_t bytes) {
  if (calls == 0) return;
  this->*kCountFields[static_cast<size_t>(kind)] += calls;
  sized[{kind, bytes}] += calls;
}

uint64_t DriverCalls::count(DriverCallKind kind) const {
  return this->*kCountFields[static_cast<size_t>(kind)];
}

uint64_t DriverCalls::total() const {
  return malloc + free + mem_create + mem_release + mem_map + mem_unmap +
         set_access + address_reserve + address_free;
}

std::vector<std::pair<std::string, uint64_t>> DriverCalls::Named() const {
  std::vector<std::pair<std::string, uint64_t>> out;
  for (DriverCallKind kind : kAllDriverCallKinds) {
    out.emplace_back(std::string(DriverCallName(kind)), count(kind));
  }
  out.emplace_back("synchronize", synchronize);
  return out;
}

DriverCalls DriverCalls::Since(const DriverCalls& earlier) const {
  DriverCalls out;
  for (size_t i = 0; i < kDriverCallKinds; ++i) {
    LOOM_CHECK_GE(this->*kCountFields[i], earlier.*kCountFields[i]);
    out.*kCountFields[i] = this->*kCountFields[i] - earlier.*kCountFields[i];
  }
  LOOM_CHECK_GE(synchronize, earlier.synchronize);
  out.synchronize = synchronize - earlier.synchronize;
  for (const auto& [key, calls] : sized) {
    auto it = earlier.sized.find(key);
    const uint64_t before = it == earlier.sized.end() ? 0 : it->second;
    LOOM_CHECK_GE(calls, before);
    if (calls > before) out.sized[key] = calls - before;
  }
  return out;
}

}  // namespace loom::whatif
