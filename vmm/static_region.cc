#include "vmm/static_region.h"

#include <algorithm>
#include <bit>

namespace loom::vmm {

StaticRegion::StaticRegion(Driver& driver, PagePool& pool, DevicePtr base,
                           uint64_t granularity, int64_t period)
    : driver_(driver),
      pool_(pool),
      base_(base),
      granularity_(granularity),
      shift_(std::countr_zero(granularity)),
      period_(period) {
  LOOM_CHECK(std::has_single_bit(granularity),
             "granularity {} is not a power of two", granularity);
}

StatusOr<std::unique_ptr<StaticRegion>> StaticRegion::Create(
    Driver& driver, PagePool& pool, int device, const RuntimePlan& plan,
    const std::vector<PageId>& pages) {
  const uint64_t g = pool.granularity();
  LOOM_CHECK(plan.region_bytes == pages.size() * g,
             "region of {} bytes with {} pages", plan.region_bytes,
             pages.size());
  if (pages.empty()) {
    return InvalidArgumentError("a static region needs at least one granule");
  }
  LOOM_ASSIGN_OR_RETURN(DevicePtr base, driver.Reserve(plan.region_bytes));
  std::unique_ptr<StaticRegion> region(
      new StaticRegion(driver, pool, base, g, plan.period));
  region->granules_.resize(pages.size());
  region->schedule_.resize(pages.size());
  // Map page by page, then grant access to the whole region in one call
  // (cuMemSetAccess takes any fully mapped range, across mappings); on
  // failure the destructor unmaps what was mapped.
  for (uint32_t i = 0; i < pages.size(); ++i) {
    Page& page = pool.page(pages[i]);
    LOOM_CHECK(page.live && page.static_granule == kNoGranule);
    DevicePtr at = base + i * g;
    LOOM_RETURN_IF_ERROR(driver.Map(at, g, page.handle));
    page.static_granule = i;
    region->granules_[i].page = pages[i];
  }
  LOOM_RETURN_IF_ERROR(
      driver.SetAccess(base, plan.region_bytes, device, pool.peers()));
  // The planned schedule of every granule.
  auto touch = [&](const PlannedRequest& r, auto&& visit) {
    if (r.offset == kUnplanned) return;
    uint64_t first = static_cast<uint64_t>(r.offset) / g;
    uint64_t last = (static_cast<uint64_t>(r.offset) + r.size - 1) / g;
    for (uint64_t k = first; k <= last && k < pages.size(); ++k) {
      visit(region->schedule_[k]);
    }
  };
  // Persistent: prologue entries planned for the whole period.
  for (const PlannedRequest& r : plan.prologue) {
    if (plan.period > 0 && r.end - r.start >= plan.period) {
      touch(r, [](Schedule& granule) { granule.persistent = true; });
    }
  }
  for (const PlannedRequest& r : plan.iteration) {
    int64_t start = plan.period > 0 ? r.start % plan.period : r.start;
    touch(r,
          [&](Schedule& granule) { granule.planned_starts.push_back(start); });
  }
  for (Schedule& granule : region->schedule_) {
    std::sort(granule.planned_starts.begin(), granule.planned_starts.end());
  }
  return region;
}

StaticRegion::~StaticRegion() {
  LOOM_CHECK(occupied_bytes_ == 0, "static region destroyed with {} bytes live",
             occupied_bytes_);
  for (uint32_t i = 0; i < granules_.size(); ++i) {
    PageId id = granules_[i].page;
    if (id == kNoPage || pool_.page(id).static_granule != i) continue;
    Status status = driver_.Unmap(base_ + i * granularity_, granularity_);
    if (!status.ok()) {
      fmt::print(stderr, "loom: unmapping static granule {} failed: {}\n", i,
                 status.ToString());
      continue;
    }
    pool_.page(id).static_granule = kNoGranule;
  }
  Status status = driver_.Unreserve(base_, bytes());
  if (!status.ok()) {
    fmt::print(stderr, "loom: freeing the static region failed: {}\n",
               status.ToString());
  }
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
    Page& page = pool_.page(granule.page);
    LOOM_CHECK(page.static_users > 0);
    --page.static_users;
    if (tag.epoch != 0) AddFence(page, lo, hi, tag);
  }
  occupied_bytes_ -= size;
}

int64_t StaticRegion::TimeToNextUse(uint32_t granule, int64_t now,
                                    bool in_setup) const {
  const Schedule& g = schedule_[granule];
  if (g.persistent) return 0;
  if (g.planned_starts.empty()) return kNever;
  // In the set-up no iteration has begun: the granule is next used at its
  // first planned start of the first iteration, whenever that begins (a
  // request that may outlive the set-up must not take it).
  if (in_setup) return g.planned_starts.front();
  if (period_ <= 0) return 0;
  now %= period_;
  auto it =
      std::lower_bound(g.planned_starts.begin(), g.planned_starts.end(), now);
  if (it != g.planned_starts.end()) return *it - now;
  return g.planned_starts.front() + period_ -
         now;  // wraps to the next iteration
}

void StaticRegion::CheckInvariants() const {
  uint64_t live_bytes = 0;
  for (uint32_t k = 0; k < granules_.size(); ++k) {
    const Granule& granule = granules_[k];
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
    const Page& page = pool_.page(granule.page);
    LOOM_CHECK_EQ(page.static_users, live.size() + (granule.full ? 1 : 0));
    LOOM_CHECK(page.static_users == 0 || page.arena_users == 0,
               "page of static granule {} serves static and arena allocations",
               k);
  }
  LOOM_CHECK_EQ(live_bytes, occupied_bytes_);
}

}  // namespace loom::vmm
