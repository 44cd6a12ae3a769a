#include "stress/ownership.h"

#include <algorithm>

namespace loom::stress {

std::string Ownership::Take(int device, uint64_t owner,
                            const std::vector<vmm::PhysicalExtent>& extents) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const vmm::PhysicalExtent& e : extents) {
    auto it = owned_.lower_bound({device, e.page, 0});
    const auto end = owned_.upper_bound({device, e.page, ~uint32_t{0}});
    for (; it != end; ++it) {
      const uint32_t lo = std::get<2>(it->first);
      const auto [hi, holder] = it->second;
      if (holder != owner && lo < e.hi && e.lo < hi) {
        return fmt::format(
            "bytes [{}, {}) of page {} that owner {} still holds",
            std::max(lo, e.lo), std::min(hi, e.hi), e.page, holder);
      }
    }
  }
  std::vector<Key>& keys = owned_by_[owner];
  for (const vmm::PhysicalExtent& e : extents) {
    auto [it, inserted] =
        owned_.try_emplace({device, e.page, e.lo}, e.hi, owner);
    if (!inserted) it->second.first = std::max(it->second.first, e.hi);
    keys.push_back({device, e.page, e.lo});
  }
  return "";
}

void Ownership::Release(uint64_t owner) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = owned_by_.find(owner);
  if (it == owned_by_.end()) return;
  for (const Key& key : it->second) owned_.erase(key);
  owned_by_.erase(it);
}

}  // namespace loom::stress
