#include "vmm/plan_referee.h"

#include <algorithm>

#include "base/check.h"

namespace loom::vmm {
namespace {

constexpr uint64_t kAlignment = 512;  // the arena's (arena.h)
constexpr uint64_t kShadowSpace = uint64_t{1} << 50;

uint64_t RoundUp(uint64_t value, uint64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

}  // namespace

ShadowArena::ShadowArena(uint64_t granularity) : granularity_(granularity) {
  InsertFree(0, kShadowSpace);
}

void ShadowArena::Reset() {
  free_by_offset_.clear();
  free_by_size_.clear();
  touched_map_.clear();
  touched_ = 0;
  live_bytes_ = 0;
  InsertFree(0, kShadowSpace);
}

void ShadowArena::InsertFree(uint64_t offset, uint64_t size) {
  free_by_offset_[offset] = size;
  free_by_size_.emplace(size, offset);
}

void ShadowArena::Touch(uint64_t offset, uint64_t size) {
  const uint64_t first = offset / granularity_;
  const uint64_t last = (offset + size - 1) / granularity_;
  if (last >= touched_map_.size()) touched_map_.resize(last + 1, false);
  for (uint64_t k = first; k <= last; ++k) {
    if (!touched_map_[k]) {
      touched_map_[k] = true;
      ++touched_;
    }
  }
}

uint64_t ShadowArena::Allocate(uint64_t size) {
  size = RoundUp(std::max<uint64_t>(size, 1), kAlignment);
  auto fit = free_by_size_.lower_bound({size, 0});
  LOOM_CHECK(fit != free_by_size_.end(), "shadow space exhausted");
  const auto [bsize, offset] = *fit;
  free_by_size_.erase(fit);
  free_by_offset_.erase(offset);
  if (bsize > size) InsertFree(offset + size, bsize - size);
  live_bytes_ += size;
  Touch(offset, size);
  return offset;
}

void ShadowArena::Free(uint64_t offset, uint64_t size) {
  size = RoundUp(std::max<uint64_t>(size, 1), kAlignment);
  LOOM_CHECK(live_bytes_ >= size);
  live_bytes_ -= size;
  uint64_t begin = offset, end = offset + size;
  auto next = free_by_offset_.lower_bound(offset);
  if (next != free_by_offset_.end()) {
    LOOM_CHECK(next->first >= end, "shadow free of a free block");
    if (next->first == end) {
      end += next->second;
      free_by_size_.erase({next->second, next->first});
      next = free_by_offset_.erase(next);
    }
  }
  if (next != free_by_offset_.begin()) {
    auto prev = std::prev(next);
    LOOM_CHECK(prev->first + prev->second <= begin,
               "shadow free of a free block");
    if (prev->first + prev->second == begin) {
      begin = prev->first;
      free_by_size_.erase({prev->second, prev->first});
      free_by_offset_.erase(prev);
    }
  }
  InsertFree(begin, end - begin);
}

void ShadowArena::CheckInvariants() const {
  LOOM_CHECK(free_by_offset_.size() == free_by_size_.size());
  uint64_t free = 0, last_end = 0;
  bool first = true;
  for (const auto& [offset, size] : free_by_offset_) {
    LOOM_CHECK(size > 0);
    LOOM_CHECK(first || offset > last_end, "shadow free blocks touch");
    LOOM_CHECK(free_by_size_.count({size, offset}) == 1);
    first = false;
    last_end = offset + size;
    free += size;
  }
  LOOM_CHECK(free + live_bytes_ == kShadowSpace, "shadow bytes lost");
  uint64_t touched = 0;
  for (bool t : touched_map_) touched += t ? 1 : 0;
  LOOM_CHECK(touched == touched_);
}

void PlanReferee::Start(uint64_t held_bytes) {
  shadow_.Reset();
  verdict_ = Verdict::kWatching;
  held_at_start_ = held_bytes;
  dynamic_peak_ = held_bytes;
  quiet_iterations_ = 0;
  peak_at_boundary_ = 0;
  began_ = false;
}

void PlanReferee::Stop() {
  if (verdict_ == Verdict::kWatching) shadow_.Reset();
  verdict_ = Verdict::kNone;
}

bool PlanReferee::Judge(uint64_t plan_bytes, uint64_t expected_bytes) {
  if (!watching()) return false;
  ++judgements_;
  dynamic_peak_ = std::max(dynamic_peak_, dynamic_now());
  plan_bytes_ = plan_bytes;
  const uint64_t dynamic = std::max(dynamic_peak_, expected_bytes);
  const uint64_t slack = std::max(kSlackBytes, dynamic / kSlackFraction);
  if (plan_bytes <= dynamic + slack) return false;
  verdict_ = Verdict::kLost;
  ++losses_;
  lost_plan_bytes_ = plan_bytes;
  lost_dynamic_bytes_ = dynamic_peak_;
  shadow_.Reset();  // its memory goes; frees are ignored
  return true;
}

void PlanReferee::IterationBegin() {
  if (!watching()) return;
  dynamic_peak_ = std::max(dynamic_peak_, dynamic_now());
  if (began_) {
    // A whole iteration since the last boundary.
    if (dynamic_peak_ == peak_at_boundary_) {
      ++quiet_iterations_;
    } else {
      quiet_iterations_ = 0;
    }
  }
  began_ = true;
  peak_at_boundary_ = dynamic_peak_;
  if (quiet_iterations_ >= kConfirmIterations) {
    verdict_ = Verdict::kConfirmed;
    shadow_.Reset();
  }
}

const char* PlanReferee::Name(Verdict v) {
  switch (v) {
    case Verdict::kNone:
      return "none";
    case Verdict::kWatching:
      return "watching";
    case Verdict::kConfirmed:
      return "confirmed";
    case Verdict::kLost:
      return "lost";
  }
  return "?";
}

}  // namespace loom::vmm
