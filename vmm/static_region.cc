#include "vmm/static_region.h"

#include <algorithm>
#include <bit>

namespace loom::vmm {

StaticRegion::StaticRegion(Driver& driver, PagePool& pool, int device,
                           DevicePtr base, uint64_t granularity)
    : driver_(driver),
      pool_(pool),
      base_(base),
      granularity_(granularity),
      shift_(std::countr_zero(granularity)),
      device_(device) {
  LOOM_CHECK(std::has_single_bit(granularity),
             "granularity {} is not a power of two", granularity);
}

StatusOr<std::unique_ptr<StaticRegion>> StaticRegion::Create(Driver& driver,
                                                             PagePool& pool,
                                                             int device,
                                                             uint64_t bytes) {
  const uint64_t g = pool.granularity();
  if (bytes == 0 || bytes % g != 0) {
    return InvalidArgumentError(
        "a static region of {} bytes is not a positive multiple of the "
        "granularity {}",
        bytes, g);
  }
  LOOM_ASSIGN_OR_RETURN(DevicePtr base, driver.Reserve(bytes));
  std::unique_ptr<StaticRegion> region(
      new StaticRegion(driver, pool, device, base, g));
  region->granules_.resize(bytes / g);
  return region;
}

StaticRegion::~StaticRegion() {
  LOOM_CHECK(occupied_bytes_ == 0, "static region destroyed with {} bytes live",
             occupied_bytes_);
  // Each mapping is a whole chunk, its first page at its first granule:
  // one unmap each.
  const uint32_t n = backed_extent_;
  for (uint32_t k = 0; k < n;) {
    if (granules_[k].page == kNoPage) {
      ++k;
      continue;
    }
    const PageRun chunk = pool_.ChunkOf(granules_[k].page);
    LOOM_CHECK(chunk.first == granules_[k].page,
               "static granule {} is not the head of its mapping", k);
    Status status =
        driver_.Unmap(base_ + k * granularity_, chunk.count * granularity_);
    if (!status.ok()) {
      fmt::print(stderr, "loom: unmapping static granules {}..{} failed: {}\n",
                 k, k + chunk.count - 1, status.ToString());
    }
    const uint32_t end = k + chunk.count;
    for (; k < end; ++k) {
      pool_.page(granules_[k].page).static_granule = kNoGranule;
      granules_[k].page = kNoPage;
    }
  }
  Status status = driver_.Unreserve(base_, bytes());
  if (!status.ok()) {
    fmt::print(stderr, "loom: freeing the static region failed: {}\n",
               status.ToString());
  }
}

void StaticRegion::Unback(
    const std::vector<std::pair<uint32_t, uint32_t>>& runs) {
  for (const auto& [first, count] : runs) {
    Status undo =
        driver_.Unmap(base_ + first * granularity_, count * granularity_);
    if (!undo.ok()) {
      // The mapping stays backed. Granted access now, its granules are
      // backed ahead of use, as Back leaves granules past a request; if the
      // driver refuses, they stay marked, and the next Back over them
      // grants access first (or fails), so that they are never handed out
      // without.
      for (uint32_t k = first; k < first + count; ++k) {
        granules_[k].no_access = true;
      }
      no_access_granules_ += count;
      Status access = GrantAccess(first, first + count - 1);
      if (access.ok()) {
        fmt::print(stderr,
                   "loom: undoing a static mapping failed: {}; it stays\n",
                   undo.ToString());
      } else {
        fmt::print(stderr,
                   "loom: undoing a static mapping failed: {}; granting it "
                   "access failed: {}; granules {}..{} stay mapped without "
                   "access\n",
                   undo.ToString(), access.ToString(), first,
                   first + count - 1);
      }
      continue;
    }
    for (uint32_t k = first; k < first + count; ++k) {
      Page& page = pool_.page(granules_[k].page);
      page.static_granule = kNoGranule;
      page.static_users = 0;
      granules_[k].page = kNoPage;
      --backed_granules_;
      if (!granules_[k].used) --backed_unused_granules_;
    }
  }
}

Status StaticRegion::Back(uint64_t offset, uint64_t size, PageSource& source,
                          uint32_t limit) {
  const uint32_t first = static_cast<uint32_t>(offset >> shift_);
  const uint32_t last = static_cast<uint32_t>((offset + size - 1) >> shift_);
  const uint32_t n = granule_count();
  std::vector<std::pair<uint32_t, uint32_t>> mapped;  // (granule, count)
  Status status;
  for (uint32_t k = first; k <= last && status.ok();) {
    if (granules_[k].page != kNoPage) {
      ++k;
      continue;
    }
    // The unbacked stretch [k, s] of the range, and how far past the
    // range's end pages may go (granules still unbacked).
    uint32_t s = k;
    while (s < last && granules_[s + 1].page == kNoPage) ++s;
    // New pages may back up to kMaxPrebacked more; memory already held
    // (a whole chunk) may go over every unbacked granule the plan uses.
    uint32_t reach = s;
    uint32_t room_end = s;
    if (s == last) {
      while (room_end + 1 < std::min(n, limit) &&
             granules_[room_end + 1].page == kNoPage &&
             room_end + 1 - k < PagePool::kMaxChunkPages) {
        ++room_end;
        if (room_end - last <= kMaxPrebacked) reach = room_end;
      }
    }
    StatusOr<std::vector<PageRun>> runs =
        source.Take(k, s - k + 1, reach - k + 1, room_end - k + 1);
    if (!runs.ok()) {
      status = runs.status();
      break;
    }
    uint32_t given = 0;
    for (const PageRun& run : *runs) given += run.count;
    LOOM_CHECK(given >= 1 && given <= room_end - k + 1,
               "page source gave {} pages for {} granules", given,
               room_end - k + 1);
    for (const PageRun& run : *runs) {
      status = pool_.MapRun(base_ + k * granularity_, run);
      if (!status.ok()) break;
      mapped.emplace_back(k, run.count);
      for (uint32_t i = 0; i < run.count; ++i) {
        Granule& granule = granules_[k + i];
        Page& page = pool_.page(run.first + i);
        LOOM_CHECK(page.live && page.static_granule == kNoGranule);
        page.static_granule = k + i;
        page.static_users = static_cast<uint32_t>(granule.partial.size()) +
                            (granule.full ? 1 : 0);
        granule.page = run.first + i;
        ++backed_granules_;
        if (!granule.used) ++backed_unused_granules_;
        backed_extent_ = std::max(backed_extent_, k + i + 1);
      }
      k += run.count;
    }
  }
  if (status.ok() && !mapped.empty()) {
    const uint32_t lo = mapped.front().first;
    const uint32_t hi = mapped.back().first + mapped.back().second;
    status =
        driver_.SetAccess(base_ + lo * granularity_, (hi - lo) * granularity_,
                          device_, pool_.peers());
  }
  if (status.ok() && no_access_granules_ > 0) [[unlikely]] {
    status = GrantAccess(first, last);
  }
  if (!status.ok()) Unback(mapped);
  return status;
}

Status StaticRegion::GrantAccess(uint32_t first, uint32_t last) {
  for (uint32_t k = first; k <= last; ++k) {
    if (!granules_[k].no_access) continue;
    // The whole stretch: whole mappings, past the range if need be.
    uint32_t lo = k;
    while (lo > 0 && granules_[lo - 1].no_access) --lo;
    uint32_t hi = k + 1;
    while (hi < granule_count() && granules_[hi].no_access) ++hi;
    LOOM_RETURN_IF_ERROR(driver_.SetAccess(base_ + lo * granularity_,
                                           (hi - lo) * granularity_, device_,
                                           pool_.peers()));
    for (uint32_t j = lo; j < hi; ++j) granules_[j].no_access = false;
    no_access_granules_ -= hi - lo;
    k = hi - 1;
  }
  return OkStatus();
}

std::vector<std::pair<DevicePtr, uint64_t>> StaticRegion::MappedRanges() const {
  std::vector<std::pair<DevicePtr, uint64_t>> out;
  for (uint32_t k = 0; k < backed_extent_; ++k) {
    if (granules_[k].page == kNoPage) continue;
    const DevicePtr at = base_ + k * granularity_;
    if (!out.empty() && out.back().first + out.back().second == at) {
      out.back().second += granularity_;
    } else {
      out.emplace_back(at, granularity_);
    }
  }
  return out;
}

namespace {

// Calls visit(granule index, lo, hi) for each granule piece of a byte range.
template <typename Visit>
void ForEachPiece(uint64_t offset, uint64_t size, uint64_t g, Visit&& visit) {
  uint64_t end = offset + size;
  while (offset < end) {
    uint64_t k = offset / g;
    uint64_t piece_end = std::min(end, (k + 1) * g);
    if (!visit(static_cast<uint32_t>(k), static_cast<uint32_t>(offset - k * g),
               static_cast<uint32_t>(piece_end - k * g))) {
      return;
    }
    offset = piece_end;
  }
}

}  // namespace

bool StaticRegion::RangeFree(uint64_t offset, uint64_t size) const {
  if (size == 0 || offset > bytes() || size > bytes() - offset) return false;
  const uint32_t g = static_cast<uint32_t>(granularity_);
  bool free = true;
  ForEachPiece(offset, size, granularity_,
               [&](uint32_t k, uint32_t lo, uint32_t hi) {
                 const Granule& granule = granules_[k];
                 if (granule.full) {
                   free = false;
                 } else if (lo == 0 && hi == g) {
                   free = granule.partial.empty();
                 } else {
                   for (const auto& [a, b] : granule.partial) {
                     if (a < hi && lo < b) {
                       free = false;
                       break;
                     }
                   }
                 }
                 return free;
               });
  return free;
}

void StaticRegion::Release(uint64_t offset, uint64_t size, const FreeTag& tag) {
  const uint64_t end = offset + size;
  const uint64_t mask = granularity_ - 1;
  const uint64_t first = offset >> shift_;
  const uint64_t last = (end - 1) >> shift_;
  const uint32_t g = static_cast<uint32_t>(granularity_);
  for (uint64_t k = first; k <= last; ++k) {
    Granule& granule = granules_[k];
    const uint32_t lo = k == first ? static_cast<uint32_t>(offset & mask) : 0;
    const uint32_t hi =
        k == last ? static_cast<uint32_t>(((end - 1) & mask) + 1) : g;
    if (lo == 0 && hi == g) {
      LOOM_CHECK(granule.full, "releasing static granule {}, which is not live",
                 k);
      granule.full = false;
    } else {
      auto& partial = granule.partial;
      auto it = partial.begin();
      while (it != partial.end() && it->first != lo) ++it;
      LOOM_CHECK(it != partial.end() && it->second == hi,
                 "releasing static bytes [{}, {}) of granule {}, not live", lo,
                 hi, k);
      *it = partial.back();
      partial.pop_back();
    }
    if (granule.page == kNoPage) continue;  // a Back that failed
    Page& page = pool_.page(granule.page);
    LOOM_CHECK(page.static_users > 0);
    --page.static_users;
    if (tag.epoch != 0) AddFence(page, lo, hi, tag);
  }
  occupied_bytes_ -= size;
}

void StaticRegion::CheckInvariants() const {
  uint64_t live_bytes = 0, backed_unused = 0;
  uint32_t no_access = 0;
  for (uint32_t k = 0; k < granules_.size(); ++k) {
    const Granule& granule = granules_[k];
    if (granule.no_access) {
      ++no_access;
      LOOM_CHECK(
          granule.page != kNoPage && !granule.full && granule.partial.empty(),
          "static granule {} without access is unbacked or live", k);
    }
    if (granule.page != kNoPage && !granule.used) ++backed_unused;
    LOOM_CHECK(granule.used || (!granule.full && granule.partial.empty()));
    const auto& live = granule.partial;
    LOOM_CHECK(!granule.full || live.empty(),
               "static granule {}: a full piece and partial pieces", k);
    if (granule.full) live_bytes += granularity_;
    for (size_t i = 0; i < live.size(); ++i) {
      LOOM_CHECK(live[i].first < live[i].second &&
                 live[i].second <= granularity_ &&
                 live[i].second - live[i].first < granularity_);
      live_bytes += live[i].second - live[i].first;
      for (size_t j = i + 1; j < live.size(); ++j) {
        LOOM_CHECK(
            live[i].second <= live[j].first || live[j].second <= live[i].first,
            "static granule {}: live ranges overlap", k);
      }
    }
    if (granule.page == kNoPage) {
      LOOM_CHECK(!granule.full && live.empty(),
                 "static granule {} holds live bytes without a page", k);
      continue;
    }
    const Page& page = pool_.page(granule.page);
    LOOM_CHECK(page.live && page.static_granule == k,
               "static granule {} page mismatch", k);
    LOOM_CHECK_EQ(page.static_users, live.size() + (granule.full ? 1 : 0));
    LOOM_CHECK(page.static_users == 0 || page.arena_users == 0,
               "page of static granule {} serves static and arena allocations",
               k);
  }
  LOOM_CHECK_EQ(live_bytes, occupied_bytes_);
  LOOM_CHECK_EQ(backed_unused, backed_unused_granules_);
  LOOM_CHECK_EQ(no_access, no_access_granules_);
}

}  // namespace loom::vmm
