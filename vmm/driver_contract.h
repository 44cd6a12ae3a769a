// DriverContract: the bookkeeping that enforces loom's driver contract.
//
// A model of the state of CUDA's virtual memory: live physical handles (size,
// device, how many of their bytes are mapped), live reservations and live
// mappings (which handle bytes back which virtual range, and whether access
// was granted). Driver (driver.h) asks it whether a call is allowed before the
// backend runs, and records the call after the backend succeeded, so every
// backend honours exactly the same rules. Pure bookkeeping: no system calls.
//
// The rules are CUDA's, as strict as the driver is (docs/driver_contract.md
// names the CUDA behaviour behind each): a mapping is of a whole handle
// (offset 0, the handle's size), an unmap takes exactly one mapping, access
// is set on whole consecutive mappings.
//
// Invariants (CheckInvariants): mappings never overlap; every mapping lies in
// one reservation and is of its whole handle; a handle's mapped-byte count
// equals the sum of its mappings.
#ifndef LOOM_VMM_DRIVER_CONTRACT_H_
#define LOOM_VMM_DRIVER_CONTRACT_H_

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"

namespace loom::vmm {

struct ContractCounts {
  uint64_t handles = 0;
  uint64_t handle_bytes = 0;
  uint64_t reservations = 0;
  uint64_t reserved_bytes = 0;
  uint64_t mappings = 0;
  uint64_t mapped_bytes = 0;
};

// How one device's physical memory is laid out (issue 21: whether the GPU
// pays for many mappings or small handles). Handle sizes are bucketed by
// powers of two: bucket B holds the handles of more than B/2 and at most B
// bytes.
struct MappingLayout {
  struct Bucket {
    uint64_t handles = 0;   // live handles of this size
    uint64_t bytes = 0;     // their bytes
    uint64_t mappings = 0;  // mappings of them (a handle may alias)
  };
  uint64_t handles = 0;
  uint64_t handle_bytes = 0;
  uint64_t mappings = 0;
  uint64_t mapped_bytes = 0;
  std::map<uint64_t, Bucket> by_handle_size;  // bucket upper bound -> counts
};

class DriverContract {
 public:
  // Each Check* returns OK if the call is allowed in the current state, or
  // the error the driver must return. `granularity` is the device's minimum.
  Status CheckCreate(int device, uint64_t size, uint64_t granularity) const;
  Status CheckRelease(uint64_t handle) const;
  Status CheckReserve(uint64_t size, uint64_t alignment,
                      uint64_t granularity) const;
  Status CheckUnreserve(uint64_t ptr, uint64_t size) const;
  Status CheckMap(uint64_t ptr, uint64_t size, uint64_t handle, uint64_t offset,
                  uint64_t granularity) const;
  // Unmap: the range is exactly one mapping (the range of one Map).
  Status CheckUnmap(uint64_t ptr, uint64_t size) const;
  // SetAccess: the range is whole consecutive mappings with no gap.
  Status CheckWholeMappings(uint64_t ptr, uint64_t size,
                            std::string_view what) const;
  // Copies and memsets: the range must be mapped and accessible.
  Status CheckAccessible(uint64_t ptr, uint64_t size) const;

  // Record successful calls. REQUIRES: the matching Check* returned OK.
  void OnCreate(uint64_t handle, int device, uint64_t size);
  void OnRelease(uint64_t handle);
  void OnReserve(uint64_t ptr, uint64_t size);
  void OnUnreserve(uint64_t ptr);
  void OnMap(uint64_t ptr, uint64_t size, uint64_t handle, uint64_t offset);
  void OnUnmap(uint64_t ptr, uint64_t size);
  void OnSetAccess(uint64_t ptr, uint64_t size);

  // Device of a live handle. REQUIRES: the handle is live.
  int HandleDevice(uint64_t handle) const;
  // Size of a live handle. REQUIRES: the handle is live.
  uint64_t HandleSize(uint64_t handle) const;
  // Device of the handle mapped at `ptr`. REQUIRES: `ptr` is mapped.
  int DeviceAt(uint64_t ptr) const;
  ContractCounts counts() const;
  // The live handles of `device` and their mappings (walks every mapping).
  MappingLayout Layout(int device) const;
  // Aborts (LOOM_CHECK) if the invariants at the top do not hold.
  void CheckInvariants() const;
  // Human-readable list of what is still live (for leak reports).
  std::string DescribeLive() const;

 private:
  struct HandleState {
    int device = 0;
    uint64_t size = 0;
    uint64_t mapped_bytes = 0;
  };
  struct Mapping {
    uint64_t size = 0;
    uint64_t handle = 0;
    uint64_t offset = 0;
    bool accessible = false;
  };
  // The reservation containing [ptr, ptr + size), or end().
  std::map<uint64_t, uint64_t>::const_iterator FindReservation(
      uint64_t ptr, uint64_t size) const;

  std::unordered_map<uint64_t, HandleState> handles_;
  std::map<uint64_t, uint64_t> reservations_;  // start -> size
  std::map<uint64_t, Mapping> mappings_;       // start -> mapping
  uint64_t handle_bytes_ = 0;
  uint64_t reserved_bytes_ = 0;
  uint64_t mapped_bytes_ = 0;
};

}  // namespace loom::vmm

#endif  // LOOM_VMM_DRIVER_CONTRACT_H_
