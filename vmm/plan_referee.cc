#include "vmm/plan_referee.h"

#include <algorithm>

namespace loom::vmm {

void PlanReferee::Start(uint64_t held_bytes, uint64_t iterations,
                        uint64_t iteration_requests) {
  shadow_.Restart(iterations);
  verdict_ = Verdict::kWatching;
  held_at_start_ = held_bytes;
  dynamic_peak_ = held_bytes;
  quiet_iterations_ = 0;
  peak_at_boundary_ = 0;
  began_ = false;
  quiet_requests_ = 0;
  quiet_mark_ = 0;
  quiet_limit_ = kConfirmIterations * iteration_requests;
}

void PlanReferee::CountQuietRequest() {
  const uint64_t mark = shadow_.held_high_water();
  if (mark != quiet_mark_) {
    quiet_mark_ = mark;
    quiet_requests_ = 0;
    return;
  }
  if (++quiet_requests_ < quiet_limit_) return;
  dynamic_peak_ = std::max(dynamic_peak_, dynamic_now());
  Confirm();
}

void PlanReferee::Confirm() {
  verdict_ = Verdict::kConfirmed;
  shadow_.Stop();
}

void PlanReferee::Stop() {
  if (verdict_ == Verdict::kWatching) shadow_.Stop();
  verdict_ = Verdict::kNone;
}

bool PlanReferee::Judge(uint64_t plan_bytes, uint64_t expected_bytes) {
  if (!watching()) return false;
  ++judgements_;
  dynamic_peak_ = std::max(dynamic_peak_, dynamic_now());
  plan_bytes_ = plan_bytes;
  const uint64_t dynamic = std::max(dynamic_peak_, expected_bytes);
  const uint64_t slack = std::max(kSlackBytes, dynamic / kSlackFraction);
  if (plan_bytes <= dynamic + slack || shadow_.exhausted()) return false;
  verdict_ = Verdict::kLost;
  ++losses_;
  lost_plan_bytes_ = plan_bytes;
  lost_dynamic_bytes_ = dynamic_peak_;
  shadow_.Stop();  // its memory goes; frees are ignored
  return true;
}

void PlanReferee::Forfeit(uint64_t plan_bytes, uint64_t dynamic_bytes) {
  if (verdict_ == Verdict::kWatching) shadow_.Stop();
  verdict_ = Verdict::kLost;
  ++losses_;
  lost_plan_bytes_ = plan_bytes;
  lost_dynamic_bytes_ = dynamic_bytes;
}

void PlanReferee::IterationBegin() {
  if (!watching()) return;
  shadow_.IterationBegin();
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
  if (quiet_iterations_ >= kConfirmIterations) Confirm();
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
