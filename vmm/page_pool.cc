#include "vmm/page_pool.h"

#include <algorithm>

namespace loom::vmm {

void AddFence(Page& page, uint32_t lo, uint32_t hi, const FreeTag& tag) {
  for (Fence& f : page.fences) {
    if (f.tag.stream == tag.stream) {
      f.lo = std::min(f.lo, lo);
      f.hi = std::max(f.hi, hi);
      f.tag.epoch = std::max(f.tag.epoch, tag.epoch);
      return;
    }
  }
  page.fences.push_back(Fence{tag, lo, hi});
}

PagePool::PagePool(Driver& driver, int device, uint64_t granularity,
                   uint64_t cap_bytes, std::vector<int> peers)
    : driver_(driver),
      device_(device),
      granularity_(granularity),
      cap_bytes_(cap_bytes),
      peers_(std::move(peers)) {
  LOOM_CHECK(granularity_ > 0);
}

PagePool::~PagePool() {
  for (PageId id = 0; id < pages_.size(); ++id) {
    if (!pages_[id].live) continue;
    LOOM_CHECK(pages_[id].static_granule == kNoGranule &&
                   pages_[id].arena_granule == kNoGranule,
               "page {} destroyed while mapped", id);
    Status status = driver_.Release(pages_[id].handle);
    if (!status.ok()) {
      fmt::print(stderr, "loom: releasing page {} failed: {}\n", id,
                 status.ToString());
    }
  }
}

StatusOr<PageId> PagePool::Grow() {
  if (cap_bytes_ != 0 && bytes() + granularity_ > cap_bytes_) {
    return OutOfMemoryError("memory cap of {} bytes reached ({} pages held)",
                            cap_bytes_, live_pages_);
  }
  LOOM_ASSIGN_OR_RETURN(PhysicalHandle handle,
                        driver_.Create(device_, granularity_));
  PageId id;
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
  } else {
    LOOM_CHECK(pages_.size() < kNoPage - 1, "page id space exhausted");
    id = static_cast<PageId>(pages_.size());
    pages_.emplace_back();
  }
  pages_[id] = Page{};
  pages_[id].handle = handle;
  pages_[id].live = true;
  ++live_pages_;
  ++creates_;
  if (live_pages_ > peak_pages_) peak_pages_ = live_pages_;
  return id;
}

Status PagePool::ReleasePage(PageId id) {
  Page& p = pages_.at(id);
  LOOM_CHECK(p.live && p.static_granule == kNoGranule &&
                 p.arena_granule == kNoGranule && p.static_users == 0 &&
                 p.arena_users == 0,
             "page {} released while in use", id);
  LOOM_RETURN_IF_ERROR(driver_.Release(p.handle));
  p = Page{};
  free_ids_.push_back(id);
  --live_pages_;
  ++releases_;
  return OkStatus();
}

}  // namespace loom::vmm
