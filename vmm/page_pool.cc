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
                   uint64_t cap_bytes, std::vector<int> peers,
                   uint32_t max_chunk_pages)
    : driver_(driver),
      device_(device),
      granularity_(granularity),
      cap_bytes_(cap_bytes),
      max_chunk_pages_(max_chunk_pages),
      peers_(std::move(peers)) {
  LOOM_CHECK(granularity_ > 0);
  LOOM_CHECK(max_chunk_pages_ >= 1 && max_chunk_pages_ <= kMaxChunkPages,
             "max_chunk_pages {} not in 1..{}", max_chunk_pages_,
             kMaxChunkPages);
}

PagePool::~PagePool() {
  for (PageId id = 0; id < pages_.size(); ++id) {
    if (!pages_[id].live || pages_[id].index != 0) continue;
    const uint32_t count = chunk_count_[id];
    for (PageId p = id; p < id + count; ++p) {
      LOOM_CHECK(pages_[p].static_granule == kNoGranule &&
                     pages_[p].arena_granule == kNoGranule,
                 "page {} destroyed while mapped", p);
    }
    Status status = driver_.Release(pages_[id].handle);
    if (!status.ok()) {
      fmt::print(stderr, "loom: releasing pages {}..{} failed: {}\n", id,
                 id + count - 1, status.ToString());
    }
  }
}

PageId PagePool::TakeIds(uint32_t count) {
  for (auto it = free_ids_.begin(); it != free_ids_.end(); ++it) {
    if (it->second < count) continue;
    const PageId first = it->first;
    const uint32_t left = it->second - count;
    free_ids_.erase(it);
    if (left > 0) free_ids_[first + count] = left;
    return first;
  }
  LOOM_CHECK(pages_.size() + count < kNoPage - 1, "page id space exhausted");
  const PageId first = static_cast<PageId>(pages_.size());
  pages_.resize(pages_.size() + count);
  chunk_count_.resize(pages_.size(), 0);
  return first;
}

void PagePool::GiveBackIds(PageId first, uint32_t count) {
  // Coalesce with the neighbouring released ranges.
  auto next = free_ids_.lower_bound(first);
  if (next != free_ids_.end() && next->first == first + count) {
    count += next->second;
    next = free_ids_.erase(next);
  }
  if (next != free_ids_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == first) {
      prev->second += count;
      return;
    }
  }
  free_ids_[first] = count;
}

StatusOr<PageRun> PagePool::GrowRun(uint32_t pages) {
  LOOM_CHECK(pages >= 1, "a chunk of no page");
  pages = std::min(pages, max_chunk_pages_);
  if (cap_bytes_ != 0) {
    const uint64_t room =
        cap_bytes_ > bytes() ? (cap_bytes_ - bytes()) / granularity_ : 0;
    if (room == 0) {
      return OutOfMemoryError("memory cap of {} bytes reached ({} pages held)",
                              cap_bytes_, live_pages_);
    }
    pages = static_cast<uint32_t>(std::min<uint64_t>(pages, room));
  }
  // A device short of room for many pages may still have room for fewer.
  StatusOr<PhysicalHandle> handle =
      driver_.Create(device_, pages * granularity_);
  while (!handle.ok() && handle.status().code() == StatusCode::kOutOfMemory &&
         pages > 1) {
    pages /= 2;
    handle = driver_.Create(device_, pages * granularity_);
  }
  if (!handle.ok()) return handle.status();
  const PageId first = TakeIds(pages);
  for (uint32_t i = 0; i < pages; ++i) {
    Page& page = pages_[first + i];
    page = Page{};
    page.handle = *handle;
    page.index = i;
    page.live = true;
  }
  chunk_count_[first] = pages;
  live_pages_ += pages;
  ++creates_;
  peak_pages_ = std::max(peak_pages_, live_pages_);
  return PageRun{first, pages};
}

StatusOr<PageId> PagePool::Grow() {
  LOOM_ASSIGN_OR_RETURN(PageRun run, GrowRun(1));
  return run.first;
}

PageRun PagePool::ChunkOf(PageId id) const {
  LOOM_CHECK(id < pages_.size() && pages_[id].live, "page {} is not live", id);
  const PageId first = id - pages_[id].index;
  return PageRun{first, chunk_count_[first]};
}

Status PagePool::ReleaseChunk(PageId first, uint32_t count) {
  LOOM_RETURN_IF_ERROR(driver_.Release(pages_[first].handle));
  for (PageId p = first; p < first + count; ++p) pages_[p] = Page{};
  chunk_count_[first] = 0;
  GiveBackIds(first, count);
  live_pages_ -= count;
  ++releases_;
  return OkStatus();
}

Status PagePool::ReleasePage(PageId id) {
  LOOM_CHECK(id < pages_.size() && pages_[id].live,
             "page {} released while in use (or not live)", id);
  const PageRun chunk = ChunkOf(id);
  for (PageId p = chunk.first; p < chunk.first + chunk.count; ++p) {
    const Page& page = pages_[p];
    LOOM_CHECK(page.spare() && page.static_users == 0 && page.arena_users == 0,
               "page {} released while in use", p);
  }
  return ReleaseChunk(chunk.first, chunk.count);
}

uint32_t PagePool::ReleaseSpareChunksWhere(bool unfenced_only,
                                           Status* first_error,
                                           uint32_t incoming) {
  uint32_t released = 0;
  for (PageId id = 0; id < pages_.size(); ++id) {
    if (incoming != kReleaseAll && FitsUnderPeak(incoming)) break;
    if (!pages_[id].live || pages_[id].index != 0) continue;
    const uint32_t count = chunk_count_[id];
    bool spare = true;
    for (PageId p = id; p < id + count && spare; ++p) {
      spare = pages_[p].spare() && pages_[p].static_users == 0 &&
              pages_[p].arena_users == 0 &&
              (!unfenced_only || pages_[p].fences.empty());
    }
    if (!spare) continue;
    Status status = ReleaseChunk(id, count);
    if (status.ok()) {
      released += count;
    } else if (first_error != nullptr && first_error->ok()) {
      *first_error = status;
    }
  }
  return released;
}

Status PagePool::ReleaseSpareChunks() {
  Status result;
  ReleaseSpareChunksWhere(/*unfenced_only=*/false, &result);
  return result;
}

uint32_t PagePool::ReleaseUnfencedSpareChunks() {
  return ReleaseSpareChunksWhere(/*unfenced_only=*/true, nullptr);
}

uint32_t PagePool::ReleaseUnfencedSpareChunksFor(uint32_t incoming) {
  return ReleaseSpareChunksWhere(/*unfenced_only=*/true, nullptr, incoming);
}

bool PagePool::WholeChunk(PageRun run) const {
  if (run.count == 0 || run.first >= pages_.size() || !pages_[run.first].live)
    return false;
  return pages_[run.first].index == 0 && chunk_count_[run.first] == run.count;
}

Status PagePool::MapRun(DevicePtr at, PageRun run) {
  LOOM_CHECK(WholeChunk(run),
             "pages {}..+{} are not one whole chunk (CUDA maps whole handles "
             "only)",
             run.first, run.count);
  return driver_.Map(at, run.count * granularity_, pages_[run.first].handle);
}

}  // namespace loom::vmm
