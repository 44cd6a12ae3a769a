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

ShadowArena::ShadowArena(uint64_t granularity)
    : granularity_(granularity), free_(kShadowSpace) {}

void ShadowArena::Reset() {
  free_.Reset(kShadowSpace);
  touched_map_.clear();
  touched_ = 0;
  live_bytes_ = 0;
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
  auto fit = free_.FirstFitting(size);
  LOOM_CHECK(fit != free_.end(), "shadow space exhausted");
  const uint64_t offset = fit->second;
  free_.Take(offset, offset, size);
  live_bytes_ += size;
  Touch(offset, size);
  return offset;
}

void ShadowArena::Free(uint64_t offset, uint64_t size) {
  size = RoundUp(std::max<uint64_t>(size, 1), kAlignment);
  LOOM_CHECK(live_bytes_ >= size);
  live_bytes_ -= size;
  free_.Give(offset, size, "shadow");
}

void ShadowArena::CheckInvariants() const {
  LOOM_CHECK(free_.CheckInvariants(kShadowSpace, "shadow") + live_bytes_ ==
                 kShadowSpace,
             "shadow bytes lost");
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

void PlanReferee::Forfeit(uint64_t plan_bytes, uint64_t dynamic_bytes) {
  verdict_ = Verdict::kLost;
  ++losses_;
  lost_plan_bytes_ = plan_bytes;
  lost_dynamic_bytes_ = dynamic_bytes;
  shadow_.Reset();
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
