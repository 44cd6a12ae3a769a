#include "vmm/matcher.h"

namespace loom::vmm {

Matcher::Matcher(const RuntimePlan& plan)
    : plan_(plan), in_prologue_(!plan.prologue.empty()) {}

void Matcher::Advance() {
  ++cursor_;
  if (cursor_ >= sequence().size()) {
    in_prologue_ = false;
    cursor_ = 0;
  }
}

int64_t Matcher::now() const {
  if (in_prologue_ || plan_.iteration.empty()) return 0;
  return plan_.iteration[cursor_ % plan_.iteration.size()].start;
}

Matcher::Match Matcher::Next(uint64_t size) {
  Match match;
  const std::vector<PlannedRequest>& seq = sequence();
  if (seq.empty()) return match;
  match.time = now();
  // Ahead (including the cursor itself), within the current sequence.
  for (int k = 0; k <= kLookAhead && cursor_ + k < seq.size(); ++k) {
    if (seq[cursor_ + k].size == size) {
      cursor_ += k;
      match.entry = &seq[cursor_];
      match.prologue = in_prologue_;
      if (!in_prologue_) match.time = match.entry->start;
      Advance();
      return match;
    }
  }
  // Behind: an earlier resynchronisation skipped too far.
  for (int k = 1; k <= kLookBehind && static_cast<size_t>(k) <= cursor_; ++k) {
    if (seq[cursor_ - k].size == size) {
      cursor_ -= k;
      match.entry = &seq[cursor_];
      match.prologue = in_prologue_;
      if (!in_prologue_) match.time = match.entry->start;
      Advance();
      return match;
    }
  }
  return match;  // an extra request: the cursor stays
}

void Matcher::IterationBegin() {
  ++iterations_seen_;
  // Recorded iterations before the steady state are part of the prologue:
  // the cursor keeps its place there until the steady state begins.
  if (in_prologue_ && iterations_seen_ <= plan_.prologue_iterations) return;
  JumpToIteration();
}

void Matcher::JumpToIteration() {
  in_prologue_ = false;
  cursor_ = 0;
}

}  // namespace loom::vmm
