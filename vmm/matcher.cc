#include "vmm/matcher.h"

#include <algorithm>

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
  const std::vector<PlannedRequest>& seq = sequence();
  if (seq.empty()) return 0;
  return seq[cursor_ % seq.size()].start;
}

const PlannedRequest* Matcher::Find(const std::vector<PlannedRequest>& seq,
                                    size_t& cursor, uint64_t size, int ahead,
                                    int behind) {
  // Nearest first: 0, +1, -1, +2, -2, ... A request that was skipped is one
  // step ahead; one taken by an earlier, wrongly matched request is one step
  // behind; far matches are only taken when no nearer one exists (repeated
  // layers repeat sizes, so the nearest is the likeliest).
  const int reach = std::max(ahead, behind);
  for (int d = 0; d <= reach; ++d) {
    if (d <= ahead && cursor + d < seq.size() && seq[cursor + d].size == size) {
      cursor += d;
      return &seq[cursor];
    }
    if (d > 0 && d <= behind && static_cast<size_t>(d) <= cursor &&
        seq[cursor - d].size == size) {
      cursor -= d;
      return &seq[cursor];
    }
  }
  return nullptr;
}

Matcher::Match Matcher::Next(uint64_t size) {
  Match match;
  match.time = now();
  const std::vector<PlannedRequest>& seq = sequence();
  if (seq.empty()) return match;
  match.entry = Find(seq, cursor_, size, kLookAhead, kLookBehind);
  if (match.entry == nullptr && cursor_ < seq.size()) {
    const uint64_t planned = seq[cursor_].size;
    const uint64_t diff = planned > size ? planned - size : size - planned;
    const uint64_t tolerance =
        std::max(std::min(planned / kNearFraction, kNearMaxBytes), kNearBytes);
    if (diff <= tolerance) {
      match.entry = &seq[cursor_];
      match.near = true;
    }
  }
  if (match.entry == nullptr) return match;  // an extra: the cursor stays
  match.prologue = in_prologue_;
  match.time = match.entry->start;
  Advance();
  return match;
}

void Matcher::IterationBegin() {
  ++iterations_seen_;
  // Recorded early iterations are part of the prologue: the cursor keeps its
  // place there until the steady state begins.
  if (in_prologue_ && iterations_seen_ <= plan_.prologue_iterations) return;
  JumpToIteration();
}

void Matcher::JumpToIteration() {
  in_prologue_ = false;
  cursor_ = 0;
}

}  // namespace loom::vmm
