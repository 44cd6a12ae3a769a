#include "vmm/arena.h"

#include <algorithm>

namespace loom::vmm {
namespace {

// How many free blocks Allocate examines in best-fit order before it settles
// for a place that needs new mappings.
constexpr int kMaxBlocksExamined = 64;

uint64_t RoundUp(uint64_t value, uint64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

}  // namespace

uint32_t Arena::PieceLo(uint64_t granule, uint64_t offset) const {
  const uint64_t start = granule * granularity_;
  return static_cast<uint32_t>(offset > start ? offset - start : 0);
}

uint32_t Arena::PieceHi(uint64_t granule, uint64_t offset,
                        uint64_t size) const {
  const uint64_t start = granule * granularity_;
  const uint64_t end = std::min(offset + size, start + granularity_);
  return static_cast<uint32_t>(end - start);
}

Arena::Arena(Driver& driver, PagePool& pool, int device, DevicePtr base,
             uint64_t va_bytes)
    : driver_(driver),
      pool_(pool),
      device_(device),
      base_(base),
      va_bytes_(va_bytes),
      granularity_(pool.granularity()),
      granule_page_(va_bytes / pool.granularity(), kNoPage),
      free_(va_bytes) {}

StatusOr<std::unique_ptr<Arena>> Arena::Create(Driver& driver, PagePool& pool,
                                               int device, uint64_t va_bytes) {
  if (va_bytes == 0 || va_bytes % pool.granularity() != 0) {
    return InvalidArgumentError(
        "arena size {} is not a positive multiple of {}", va_bytes,
        pool.granularity());
  }
  LOOM_ASSIGN_OR_RETURN(DevicePtr base, driver.Reserve(va_bytes));
  return std::unique_ptr<Arena>(
      new Arena(driver, pool, device, base, va_bytes));
}

Arena::~Arena() {
  LOOM_CHECK(live_bytes_ == 0, "arena destroyed with {} bytes live",
             live_bytes_);
  StatusOr<std::vector<PageId>> unmapped = UnmapIdle();
  if (!unmapped.ok()) {
    fmt::print(stderr, "loom: unmapping the arena failed: {}\n",
               unmapped.status().ToString());
  }
  Status status = driver_.Unreserve(base_, va_bytes_);
  if (!status.ok()) {
    fmt::print(stderr, "loom: freeing the arena failed: {}\n",
               status.ToString());
  }
}

Arena::Candidate Arena::Examine(uint64_t block, uint64_t bsize, uint64_t size,
                                Stream stream, int64_t until,
                                PagePolicy& policy) const {
  Candidate c;
  uint64_t position = block;
  std::vector<PageId> stitched;  // pages mapped twice met in the place
  while (position + size <= block + bsize) {
    uint64_t first = position / granularity_;
    uint64_t last = (position + size - 1) / granularity_;
    uint64_t unmapped = 0;
    uint64_t blocked = ~uint64_t{0};
    stitched.clear();
    for (uint64_t k = first; k <= last; ++k) {
      PageId page = granule_page_[k];
      if (page == kNoPage) {
        ++unmapped;
        continue;
      }
      // A page mapped at several places serves allocations at one of them
      // at a time, and never twice in one allocation.
      const Page& p = pool_.page(page);
      const bool several = p.arena_mappings > 1;
      if ((several && ((p.arena_users != 0 && p.arena_in_use_at != k) ||
                       std::find(stitched.begin(), stitched.end(), page) !=
                           stitched.end())) ||
          !policy.Usable(page, PieceLo(k, position), PieceHi(k, position, size),
                         stream, until)) {
        blocked = k;
        break;
      }
      if (several) stitched.push_back(page);
    }
    if (blocked == ~uint64_t{0}) {
      c.block = block;
      c.position = position;
      c.unmapped = unmapped;
      c.found = true;
      return c;
    }
    position = (blocked + 1) * granularity_;  // skip past the busy granule
  }
  return c;
}

Status Arena::MapRun(uint64_t granule, PageRun run) {
  for (uint32_t i = 0; i < run.count; ++i) {
    const Page& page = pool_.page(run.first + i);
    // Mapped nowhere in the arena, or (stitched) mapped once and idle.
    LOOM_CHECK(page.live && page.arena_mappings < kMaxArenaMappings &&
               (page.arena_granule == kNoGranule || page.arena_users == 0));
  }
  LOOM_RETURN_IF_ERROR(pool_.MapRun(base_ + granule * granularity_, run));
  for (uint32_t i = 0; i < run.count; ++i) {
    Page& page = pool_.page(run.first + i);
    if (page.arena_granule == kNoGranule) {
      page.arena_granule = static_cast<uint32_t>(granule + i);
    } else {
      ++stitches_;
      if (page.static_granule != kNoGranule) ++static_stitches_;
    }
    ++page.arena_mappings;
    granule_page_[granule + i] = run.first + i;
  }
  mappings_[granule] = run.count;
  mapped_granules_ += run.count;
  mapped_extent_ = std::max(mapped_extent_, granule + run.count);
  ++maps_;
  return OkStatus();
}

Status Arena::UnmapMapping(uint64_t head) {
  auto it = mappings_.find(head);
  LOOM_CHECK(it != mappings_.end(), "no arena mapping at granule {}", head);
  const uint64_t length = it->second;
  LOOM_RETURN_IF_ERROR(
      driver_.Unmap(base_ + head * granularity_, length * granularity_));
  ++unmaps_;
  without_access_.erase(head);
  const PageId chunk = granule_page_[head];
  mappings_.erase(it);
  // Another mapping of the chunk, if it is stitched at several places.
  uint64_t other = kNoPlace;
  if (pool_.page(chunk).arena_mappings > 1) {
    for (const auto& [h, n] : mappings_) {
      if (granule_page_[h] == chunk) {
        other = h;
        break;
      }
    }
    LOOM_CHECK(other != kNoPlace, "page {} has no second mapping", chunk);
  }
  for (uint64_t k = head; k < head + length; ++k) {
    Page& page = pool_.page(granule_page_[k]);
    --page.arena_mappings;
    page.arena_granule = other == kNoPlace
                             ? kNoGranule
                             : static_cast<uint32_t>(other + (k - head));
    granule_page_[k] = kNoPage;
  }
  mapped_granules_ -= length;
  return OkStatus();
}

bool Arena::MappingIdle(uint64_t head, uint64_t length) const {
  for (uint64_t k = head; k < head + length; ++k) {
    if (pool_.page(granule_page_[k]).arena_users != 0) return false;
  }
  return true;
}

bool Arena::PlaceIdle(uint64_t head, uint64_t length) const {
  for (uint64_t k = head; k < head + length; ++k) {
    const Page& page = pool_.page(granule_page_[k]);
    if (page.arena_users != 0 && page.arena_in_use_at == k) return false;
  }
  return true;
}

void Arena::UnmapFresh(const std::vector<uint64_t>& heads) {
  for (uint64_t head : heads) {
    Status undo = UnmapMapping(head);
    if (undo.ok()) continue;
    // The mapping stays (UnmapMapping changed nothing). Granted access now,
    // it is an idle mapping like any other; if the driver refuses, it stays
    // noted, and the next placement over it grants access first (or fails),
    // so that it is never handed out without.
    without_access_.insert(head);
    Status access = GrantAccess(head, head);
    const uint64_t length = mappings_.at(head);
    if (access.ok()) {
      fmt::print(stderr, "loom: undoing a mapping failed: {}; it stays\n",
                 undo.ToString());
    } else {
      fmt::print(stderr,
                 "loom: undoing a mapping failed: {}; granting it access "
                 "failed: {}; granules {}..{} stay mapped without access\n",
                 undo.ToString(), access.ToString(), head, head + length - 1);
    }
  }
}

Status Arena::GrantAccess(uint64_t first, uint64_t last) {
  for (auto it = without_access_.begin(); it != without_access_.end();) {
    const uint64_t head = *it;
    const uint64_t length = mappings_.at(head);
    if (head > last || head + length <= first) {
      ++it;
      continue;
    }
    LOOM_RETURN_IF_ERROR(driver_.SetAccess(base_ + head * granularity_,
                                           length * granularity_, device_,
                                           pool_.peers()));
    it = without_access_.erase(it);
  }
  return OkStatus();
}

Arena::Candidate Arena::BestFit(uint64_t size, Stream stream, int64_t until,
                                PagePolicy& policy) const {
  Candidate best;
  int examined = 0;
  for (auto it = free_.FirstFitting(size);
       it != free_.end() && examined < kMaxBlocksExamined; ++it, ++examined) {
    Candidate c = Examine(it->second, it->first, size, stream, until, policy);
    if (!c.found) continue;
    c.block_size = it->first;
    if (c.unmapped == 0) return c;
    if (!best.found || c.unmapped < best.unmapped) best = c;
  }
  return best;
}

uint64_t Arena::MappedFit(uint64_t size, Stream stream, int64_t until,
                          PagePolicy& policy) const {
  const Candidate c =
      BestFit(RoundUp(size, kArenaAlignment), stream, until, policy);
  return c.found && c.unmapped == 0 ? c.block_size : kNoFit;
}

StatusOr<DevicePtr> Arena::Allocate(uint64_t size, Stream stream, int64_t until,
                                    PagePolicy& policy) {
  if (size == 0) return InvalidArgumentError("arena: size 0");
  size = RoundUp(size, kArenaAlignment);
  if (size > va_bytes_) {
    return OutOfMemoryError("request of {} bytes exceeds the arena ({} bytes)",
                            size, va_bytes_);
  }
  Candidate best = BestFit(size, stream, until, policy);
  if (!best.found || best.unmapped > 0) {
    // The last free block (the untouched end of the arena) always fits.
    if (!free_.empty()) {
      const auto [last, last_size] = free_.Last();
      Candidate c = Examine(last, last_size, size, stream, until, policy);
      if (c.found && (!best.found || c.unmapped < best.unmapped)) best = c;
    }
  }
  if (!best.found) {
    return OutOfMemoryError("arena: no place for {} bytes", size);
  }
  uint64_t first = best.position / granularity_;
  uint64_t last = (best.position + size - 1) / granularity_;
  // Unmapped granules right after the place: a chunk already held that is
  // larger than the last stretch may take them too (counted only when
  // something is to be mapped: the hot path maps nothing).
  uint64_t after = 0;
  while (best.unmapped > 0 && after < PagePool::kMaxChunkPages &&
         last + 1 + after < granule_page_.size() &&
         granule_page_[last + 1 + after] == kNoPage) {
    ++after;
  }
  // While granules of this place are being mapped, ReclaimIdle leaves them.
  placing_first_ = first;
  placing_last_ = last + after;
  // Map the missing granules, a run of pages at a time, then grant access
  // to all of them in one call (over the span from the first to the last
  // fresh granule: every granule between is mapped by then). Until access
  // is granted the fresh granules are inside the placing range, which
  // ReclaimIdle leaves alone; on any failure they are unmapped again, so no
  // mapping without access remains.
  std::vector<uint64_t> fresh;  // heads of the mappings made here
  uint64_t fresh_end = 0;
  Status placed = OkStatus();
  for (uint64_t k = first; k <= last && placed.ok();) {
    if (granule_page_[k] != kNoPage) {
      ++k;
      continue;
    }
    uint64_t s = k;
    while (s < last && granule_page_[s + 1] == kNoPage) ++s;
    const uint32_t wanted = static_cast<uint32_t>(s - k + 1);
    const uint32_t room =
        wanted + (s == last ? static_cast<uint32_t>(after) : 0);
    StatusOr<PageRun> run = policy.Acquire(wanted, room, stream, until);
    if (!run.ok()) {
      placed = run.status();
      break;
    }
    LOOM_CHECK(run->count >= 1 && run->count <= room,
               "page policy gave {} pages for {} granules", run->count, room);
    placed = MapRun(k, *run);
    if (!placed.ok()) break;
    fresh.push_back(k);
    fresh_end = k + run->count;
    k += run->count;
  }
  if (placed.ok() && !fresh.empty()) {
    placed = driver_.SetAccess(base_ + fresh.front() * granularity_,
                               (fresh_end - fresh.front()) * granularity_,
                               device_, pool_.peers());
  }
  if (placed.ok() && !without_access_.empty()) [[unlikely]] {
    placed = GrantAccess(first, last);
  }
  placing_first_ = placing_last_ = kNoPlace;
  if (!placed.ok()) {
    UnmapFresh(fresh);
    return placed;
  }
  free_.Take(best.block, best.position, size);
  for (uint64_t k = first; k <= last; ++k) {
    Page& page = pool_.page(granule_page_[k]);
    ++page.arena_users;
    page.arena_in_use_at = static_cast<uint32_t>(k);
  }
  live_bytes_ += size;
  return base_ + best.position;
}

void Arena::Free(DevicePtr ptr, uint64_t size, std::span<const FreeTag> tags) {
  size = RoundUp(size, kArenaAlignment);
  uint64_t offset = ptr - base_;
  LOOM_CHECK(Contains(ptr) && offset + size <= va_bytes_);
  uint64_t first = offset / granularity_;
  uint64_t last = (offset + size - 1) / granularity_;
  for (uint64_t k = first; k <= last; ++k) {
    Page& page = pool_.page(granule_page_[k]);
    LOOM_CHECK(page.arena_users > 0);
    --page.arena_users;
    page.arena_freed_at = clock_;
    for (const FreeTag& tag : tags) {
      if (tag.epoch != 0) {
        AddFence(page, PieceLo(k, offset), PieceHi(k, offset, size), tag);
      }
    }
  }
  live_bytes_ -= size;
  ++clock_;
  free_.Give(offset, size, "arena");
}

StatusOr<PageRun> Arena::ReclaimIdle(
    uint32_t max_pages, const std::function<bool(PageId)>& wanted,
    const std::function<Status(PageId)>& prepare) {
  for (const auto& [head, length] : mappings_) {
    if (length > max_pages) continue;
    if (head + length > placing_first_ && head <= placing_last_) continue;
    if (!MappingIdle(head, length)) continue;
    // Its pages must end mapped nowhere in the arena.
    if (pool_.page(granule_page_[head]).arena_mappings > 1) continue;
    bool all_wanted = true;
    for (uint64_t k = head; k < head + length && all_wanted; ++k) {
      all_wanted = wanted(granule_page_[k]);
    }
    if (!all_wanted) continue;
    for (uint64_t k = head; k < head + length; ++k) {
      LOOM_RETURN_IF_ERROR(prepare(granule_page_[k]));
    }
    const PageRun chunk{granule_page_[head], static_cast<uint32_t>(length)};
    LOOM_RETURN_IF_ERROR(UnmapMapping(head));
    return chunk;
  }
  return NotFoundError("no idle arena mapping to reclaim");
}

std::vector<PageId> Arena::IdlePages() const {
  std::vector<PageId> out;
  for (const auto& [head, length] : mappings_) {
    if (!MappingIdle(head, length)) continue;
    for (uint64_t k = head; k < head + length; ++k) {
      out.push_back(granule_page_[k]);
    }
  }
  // A stitched chunk's pages once.
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

StatusOr<PageRun> Arena::StitchableChunk(
    uint32_t wanted, uint32_t room,
    const std::function<bool(PageId)>& usable) const {
  PageRun best;
  uint64_t best_freed_at = 0;
  for (const auto& [head, length] : mappings_) {
    if (length > room) continue;
    if (head + length > placing_first_ && head <= placing_last_) continue;
    const Page& first = pool_.page(granule_page_[head]);
    if (first.arena_mappings >= kMaxArenaMappings) continue;
    if (!MappingIdle(head, length)) continue;
    // The one idle the longest (freed first): a chunk freed lately is
    // likely to be wanted back where it is mapped.
    uint64_t freed_at = 0;
    for (uint64_t k = head; k < head + length; ++k) {
      freed_at =
          std::max(freed_at, pool_.page(granule_page_[k]).arena_freed_at);
    }
    // (One within the stretch before one that maps past it.)
    if (best.count != 0 &&
        std::make_pair(length > wanted, freed_at) >=
            std::make_pair(best.count > wanted, best_freed_at)) {
      continue;
    }
    bool ok = true;
    for (uint64_t k = head; k < head + length && ok; ++k) {
      ok = usable(granule_page_[k]);
    }
    // Nor one with a page mapped in the place being mapped (through any of
    // its mappings, over any part of it).
    if (ok && first.arena_mappings > 1 && placing_first_ != kNoPlace) {
      const PageId chunk = granule_page_[head];
      for (uint64_t k = placing_first_; k <= placing_last_ && ok; ++k) {
        ok = granule_page_[k] == kNoPage || granule_page_[k] < chunk ||
             granule_page_[k] >= chunk + length;
      }
    }
    if (!ok) continue;
    best = PageRun{granule_page_[head], static_cast<uint32_t>(length)};
    best_freed_at = freed_at;
  }
  if (best.count == 0) return NotFoundError("no idle arena chunk to stitch");
  return best;
}

StatusOr<std::vector<PageId>> Arena::UnmapIdle() {
  std::vector<PageId> unmapped;
  // One call per mapping: CUDA unmaps exactly what one map mapped.
  std::vector<uint64_t> idle;
  for (const auto& [head, length] : mappings_) {
    if (MappingIdle(head, length)) idle.push_back(head);
  }
  for (uint64_t head : idle) {
    const uint64_t length = mappings_.at(head);
    const PageId first = granule_page_[head];
    LOOM_RETURN_IF_ERROR(UnmapMapping(head));
    // A stitched chunk's pages once, when their last mapping goes.
    if (pool_.page(first).arena_mappings != 0) continue;
    for (uint64_t i = 0; i < length; ++i) unmapped.push_back(first + i);
  }
  return unmapped;
}

bool Arena::BusyElsewhere(uint64_t head, uint64_t length) const {
  return !MappingIdle(head, length) && PlaceIdle(head, length);
}

std::vector<PageId> Arena::BusyElsewherePages() const {
  std::vector<PageId> out;
  for (const auto& [head, length] : mappings_) {
    if (!BusyElsewhere(head, length)) continue;
    for (uint64_t k = head; k < head + length; ++k) {
      out.push_back(granule_page_[k]);
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

Status Arena::UnmapBusyElsewhere() {
  std::vector<uint64_t> heads;
  for (const auto& [head, length] : mappings_) {
    if (BusyElsewhere(head, length)) heads.push_back(head);
  }
  for (uint64_t head : heads) LOOM_RETURN_IF_ERROR(UnmapMapping(head));
  return OkStatus();
}

std::vector<std::pair<DevicePtr, uint64_t>> Arena::MappedRanges() const {
  std::vector<std::pair<DevicePtr, uint64_t>> out;
  for (uint64_t k = 0; k < mapped_extent_; ++k) {
    if (granule_page_[k] == kNoPage) continue;
    DevicePtr at = base_ + k * granularity_;
    if (!out.empty() && out.back().first + out.back().second == at) {
      out.back().second += granularity_;
    } else {
      out.emplace_back(at, granularity_);
    }
  }
  return out;
}

void Arena::CheckInvariants() const {
  const uint64_t free_bytes = free_.CheckInvariants(va_bytes_, "arena");
  LOOM_CHECK_EQ(free_bytes + live_bytes_, va_bytes_);
  for (uint64_t head : without_access_) {
    LOOM_CHECK(mappings_.contains(head),
               "granule {} noted without access is not a mapping's head", head);
  }
  std::map<PageId, uint32_t> mappings_of;  // of the pages mapped twice
  uint64_t mapped = 0;
  for (uint64_t k = 0; k < granule_page_.size(); ++k) {
    PageId id = granule_page_[k];
    if (id == kNoPage) continue;
    ++mapped;
    const Page& page = pool_.page(id);
    LOOM_CHECK(page.live && page.arena_granule != kNoGranule &&
                   granule_page_[page.arena_granule] == id &&
                   page.arena_mappings >= 1 &&
                   page.arena_mappings <= kMaxArenaMappings,
               "arena granule {} page mismatch", k);
    LOOM_CHECK(
        page.arena_users == 0 || granule_page_[page.arena_in_use_at] == id,
        "page {} in use at a granule that does not map it", id);
    LOOM_CHECK(page.static_users == 0 || page.arena_users == 0,
               "page of arena granule {} serves static and arena allocations",
               k);
    if (page.arena_mappings > 1) ++mappings_of[id];
  }
  LOOM_CHECK_EQ(mapped, mapped_granules_);
  for (const auto& [id, n] : mappings_of) {
    LOOM_CHECK_EQ(n, pool_.page(id).arena_mappings);
  }
  uint64_t in_mappings = 0;
  uint64_t previous = 0;
  for (const auto& [head, length] : mappings_) {
    LOOM_CHECK(length > 0 && head >= previous, "arena mappings overlap at {}",
               head);
    LOOM_CHECK(pool_.WholeChunk(
                   PageRun{granule_page_[head], static_cast<uint32_t>(length)}),
               "arena mapping at {} is not one whole chunk", head);
    for (uint64_t k = head; k < head + length; ++k) {
      LOOM_CHECK(granule_page_[k] == granule_page_[head] + (k - head),
                 "arena mapping at {} does not map its run", head);
    }
    previous = head + length;
    in_mappings += length;
  }
  LOOM_CHECK_EQ(in_mappings, mapped_granules_);
}

}  // namespace loom::vmm
