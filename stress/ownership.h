// Ownership: which live buffer of the stress program holds each physical
// byte, per device, so that the invariant "no physical byte belongs to two
// live allocations" is checked at every hand-out. An owner is a buffer, or
// a captured graph (all of its buffers, which may overlap one another: the
// graph reuses its memory in capture order). Thread-safe.
#ifndef LOOM_STRESS_OWNERSHIP_H_
#define LOOM_STRESS_OWNERSHIP_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "vmm/allocator.h"

namespace loom::stress {

class Ownership {
 public:
  // Gives `owner` the bytes of `extents` on `device`. Returns "" on
  // success, else what conflicts (bytes another owner holds); then nothing
  // is taken.
  std::string Take(int device, uint64_t owner,
                   const std::vector<vmm::PhysicalExtent>& extents);
  // Takes back every byte `owner` holds (none: nothing happens).
  void Release(uint64_t owner);

 private:
  using Key = std::tuple<int, vmm::PageId, uint32_t>;   // device, page, lo
  std::mutex mu_;                                       // guards both maps
  std::map<Key, std::pair<uint32_t, uint64_t>> owned_;  // -> (hi, owner)
  std::map<uint64_t, std::vector<Key>> owned_by_;
};

}  // namespace loom::stress

#endif  // LOOM_STRESS_OWNERSHIP_H_
