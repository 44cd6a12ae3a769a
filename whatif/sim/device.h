// SimDevice: the simulated GPU under a simulated allocator.
//
// It models what the allocators ask of CUDA, and nothing else: physical
// memory with a capacity (cudaMalloc and cuMemCreate fail beyond it), a
// virtual address space (cudaMalloc ranges and cuMemAddressReserve
// reservations, 2 MiB aligned), and counters of every call (DriverCalls).
// No memory is ever touched: addresses are numbers.
//
// Address order. The driver's choice of address is invisible to a trace,
// yet PyTorch's best fit breaks ties between free blocks of one size by
// address (the lowest first), so which segment a request reuses, and from
// there the peak, can depend on it. By default a new range is taken from
// the top of the highest free range that fits (kDescending: each new
// segment below the previous ones, as in Linux's top-down mmap area where
// CUDA's unified addresses live). On the traces of the H200 run
// (bench/data/traces/gpu/) this reproduces the caching allocator's peak
// reserved to the byte on all four models; first fit from the lowest
// address (kAscending) does on three and is 1.03% low on llama1b
// (bench/results/whatif.md).
//
// Invariants: physical_used() <= capacity(); address ranges handed out are
// disjoint, 2 MiB aligned and never contain address 0.
#ifndef LOOM_WHATIF_SIM_DEVICE_H_
#define LOOM_WHATIF_SIM_DEVICE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string_view>

#include "base/status.h"
#include "whatif/sim/stats.h"

namespace loom::whatif {

inline constexpr uint64_t kKiB = uint64_t{1} << 10;
inline constexpr uint64_t kMiB = uint64_t{1} << 20;
inline constexpr uint64_t kGiB = uint64_t{1} << 30;

// A half-open address range [address, address + size).
struct AddressRange {
  uint64_t address = 0;
  uint64_t size = 0;
  uint64_t end() const { return address + size; }
  friend bool operator==(const AddressRange&, const AddressRange&) = default;
};

// Where a new address range goes (see the header comment).
enum class AddressOrder : uint8_t {
  kDescending,  // the top of the highest free range that fits
  kAscending,   // the bottom of the lowest free range that fits
};

// "descending" / "ascending"; INVALID_ARGUMENT otherwise.
StatusOr<AddressOrder> ParseAddressOrder(std::string_view text);
std::string_view AddressOrderName(AddressOrder order);

class SimDevice {
 public:
  // Capacity used when none is given: 1 PiB, i.e. no OOM in practice.
  static constexpr uint64_t kUnlimitedCapacity = uint64_t{1} << 50;
  // Alignment (and rounding) of every address range handed out.
  static constexpr uint64_t kAddressAlignment = 2 * kMiB;

  // `capacity` is the physical memory in bytes; 0 means kUnlimitedCapacity.
  explicit SimDevice(uint64_t capacity = 0,
                     AddressOrder order = AddressOrder::kDescending);

  SimDevice(const SimDevice&) = delete;
  SimDevice& operator=(const SimDevice&) = delete;

  uint64_t capacity() const { return capacity_; }
  bool unlimited() const { return capacity_ == kUnlimitedCapacity; }
  uint64_t physical_used() const { return physical_used_; }
  uint64_t physical_free() const { return capacity_ - physical_used_; }
  const DriverCalls& calls() const { return calls_; }

  // cudaMalloc(size): physical memory plus an address range. nullopt when
  // the memory (or the address space) is exhausted; a failed call is still
  // counted.
  std::optional<uint64_t> Malloc(uint64_t size);
  // cudaFree. REQUIRES: (address, size) came from Malloc and is live.
  void Free(uint64_t address, uint64_t size);

  // cuMemCreate of one handle of `size` physical bytes; false when it does
  // not fit (the call is still counted).
  bool CreateHandle(uint64_t size);
  // cuMemRelease. REQUIRES: size <= physical_used().
  void ReleaseHandle(uint64_t size);

  // cuMemAddressReserve; nullopt when the address space is exhausted.
  std::optional<uint64_t> ReserveAddress(uint64_t size);
  // cuMemAddressFree. REQUIRES: the range came from ReserveAddress.
  void FreeAddress(uint64_t address, uint64_t size);

  // Counters only (mapping needs no bookkeeping here: the allocators own
  // their page tables and are checked against physical_used()).
  // `calls` calls, each covering `bytes`.
  void CountMap(uint64_t calls, uint64_t bytes) {
    calls_.Add(DriverCallKind::kMemMap, calls, bytes);
  }
  void CountUnmap(uint64_t calls, uint64_t bytes) {
    calls_.Add(DriverCallKind::kMemUnmap, calls, bytes);
  }
  void CountSetAccess(uint64_t calls, uint64_t bytes) {
    calls_.Add(DriverCallKind::kSetAccess, calls, bytes);
  }
  void CountSynchronize() { ++calls_.synchronize; }

 private:
  std::optional<uint64_t> TakeAddress(uint64_t size);
  void ReturnAddress(uint64_t address, uint64_t size);

  uint64_t capacity_;
  AddressOrder order_;
  uint64_t physical_used_ = 0;
  DriverCalls calls_;
  std::map<uint64_t, uint64_t> free_ranges_;  // start -> end, disjoint
  std::map<uint64_t, uint64_t> taken_;        // start -> rounded size
};

}  // namespace loom::whatif

#endif  // LOOM_WHATIF_SIM_DEVICE_H_
