#include "whatif/sim/device.h"

#include <iterator>

#include "base/check.h"

namespace loom::whatif {
namespace {

// First usable address: 16 TiB, like the high addresses CUDA hands out.
constexpr uint64_t kAddressBase = uint64_t{1} << 44;
constexpr uint64_t kAddressLimit = uint64_t{1} << 62;

// Rounds up to the address alignment; nullopt on overflow.
std::optional<uint64_t> RoundUp(uint64_t size) {
  constexpr uint64_t kAlign = SimDevice::kAddressAlignment;
  if (size == 0) return kAlign;
  if (size > kAddressLimit) return std::nullopt;
  return (size + kAlign - 1) / kAlign * kAlign;
}

}  // namespace

StatusOr<AddressOrder> ParseAddressOrder(std::string_view text) {
  if (text == "descending") return AddressOrder::kDescending;
  if (text == "ascending") return AddressOrder::kAscending;
  return InvalidArgumentError(
      "address order '{}' is not descending or ascending", text);
}

std::string_view AddressOrderName(AddressOrder order) {
  return order == AddressOrder::kDescending ? "descending" : "ascending";
}

SimDevice::SimDevice(uint64_t capacity, AddressOrder order)
    : capacity_(capacity == 0 ? kUnlimitedCapacity : capacity), order_(order) {
  free_ranges_[kAddressBase] = kAddressLimit;
}

std::optional<uint64_t> SimDevice::TakeAddress(uint64_t size) {
  std::optional<uint64_t> rounded = RoundUp(size);
  if (!rounded) return std::nullopt;
  if (order_ == AddressOrder::kDescending) {
    for (auto it = free_ranges_.rbegin(); it != free_ranges_.rend(); ++it) {
      const uint64_t start = it->first;
      const uint64_t end = it->second;
      if (end - start < *rounded) continue;
      const uint64_t taken = end - *rounded;
      if (taken == start) {
        free_ranges_.erase(std::next(it).base());
      } else {
        it->second = taken;
      }
      taken_[taken] = *rounded;
      return taken;
    }
    return std::nullopt;
  }
  for (auto it = free_ranges_.begin(); it != free_ranges_.end(); ++it) {
    uint64_t start = it->first;
    uint64_t end = it->second;
    if (end - start < *rounded) continue;
    free_ranges_.erase(it);
    if (end - start > *rounded) free_ranges_[start + *rounded] = end;
    taken_[start] = *rounded;
    return start;
  }
  return std::nullopt;
}

void SimDevice::ReturnAddress(uint64_t address, uint64_t size) {
  auto taken = taken_.find(address);
  LOOM_CHECK(taken != taken_.end(), "address {:#x} was not handed out",
             address);
  std::optional<uint64_t> rounded = RoundUp(size);
  LOOM_CHECK(rounded && *rounded == taken->second,
             "address {:#x}: returned size {} does not match {}", address, size,
             taken->second);
  taken_.erase(taken);
  uint64_t start = address;
  uint64_t end = address + *rounded;
  // Coalesce with the free neighbours.
  auto next = free_ranges_.lower_bound(start);
  if (next != free_ranges_.end() && next->first == end) {
    end = next->second;
    next = free_ranges_.erase(next);
  }
  if (next != free_ranges_.begin()) {
    auto prev = std::prev(next);
    if (prev->second == start) {
      start = prev->first;
      free_ranges_.erase(prev);
    }
  }
  free_ranges_[start] = end;
}

std::optional<uint64_t> SimDevice::Malloc(uint64_t size) {
  calls_.Add(DriverCallKind::kMalloc, 1, size);
  if (size > physical_free()) return std::nullopt;
  std::optional<uint64_t> address = TakeAddress(size);
  if (!address) return std::nullopt;
  physical_used_ += size;
  return address;
}

void SimDevice::Free(uint64_t address, uint64_t size) {
  calls_.Add(DriverCallKind::kFree, 1, size);
  LOOM_CHECK_LE(size, physical_used_);
  ReturnAddress(address, size);
  physical_used_ -= size;
}

bool SimDevice::CreateHandle(uint64_t size) {
  calls_.Add(DriverCallKind::kMemCreate, 1, size);
  if (size > physical_free()) return false;
  physical_used_ += size;
  return true;
}

void SimDevice::ReleaseHandle(uint64_t size) {
  calls_.Add(DriverCallKind::kMemRelease, 1, size);
  LOOM_CHECK_LE(size, physical_used_);
  physical_used_ -= size;
}

std::optional<uint64_t> SimDevice::ReserveAddress(uint64_t size) {
  calls_.Add(DriverCallKind::kAddressReserve, 1, size);
  return TakeAddress(size);
}

void SimDevice::FreeAddress(uint64_t address, uint64_t size) {
  calls_.Add(DriverCallKind::kAddressFree, 1, size);
  ReturnAddress(address, size);
}

}  // namespace loom::whatif
