// Matcher: routes each request to its plan entry, and resynchronises.
//
// The plan lists the requests of the prologue (set-up and early iterations)
// and of one steady-state iteration. The matcher keeps a cursor and compares
// each incoming request's
// size with the entry under the cursor. When they differ it looks a short
// way ahead (a request of the plan did not come: skip it) and a short way
// back (an earlier skip was wrong), so that an extra, missing or resized
// request costs that request only, never the rest of the iteration
// (STAlloc's matcher never resynchronises, so one extra request there shifts
// every later match). The prologue is matched once; iteration markers after
// the plan's early iterations restart the steady-state entries. Without
// markers the prologue runs once and the iteration repeats.
//
// Drift: when no entry of the request's exact size is in reach, the entry
// right under the cursor is taken if its size is close (within an eighth
// of it, at most 64 KiB away): a request that grew or shrank a little in the
// same place of the iteration (a resized activation) is that entry's request,
// so it gets the entry's planned lifetime and pages instead of being an extra
// one. Only the cursor's own entry qualifies: a close-sized extra request
// elsewhere cannot take a slot it does not stand at. Not thread-safe: the
// allocator serialises access.
#ifndef LOOM_VMM_MATCHER_H_
#define LOOM_VMM_MATCHER_H_

#include <cstdint>
#include <vector>

#include "vmm/runtime_plan.h"

namespace loom::vmm {

class Matcher {
 public:
  // How far (in plan entries) the cursor may jump forward or back to find a
  // request's entry.
  static constexpr int kLookAhead = 48;
  static constexpr int kLookBehind = 16;
  // A close size: within size/kNearFraction of the entry's, but never more
  // than kNearMaxBytes away (an unrelated request of a similar size must not
  // pass for a large entry) nor less than kNearBytes.
  static constexpr uint64_t kNearFraction = 8;
  static constexpr uint64_t kNearMaxBytes = uint64_t{64} << 10;
  static constexpr uint64_t kNearBytes = 512;

  // REQUIRES: `plan` outlives the matcher.
  explicit Matcher(const RuntimePlan& plan);

  struct Match {
    const PlannedRequest* entry = nullptr;  // nullptr: no entry (a miss)
    bool prologue = false;                  // the entry is the prologue's
    bool near = false;  // matched by a close size, not the exact one
    int64_t time = 0;   // iteration time of the cursor
  };
  // Finds the entry for a request of `size` bytes and advances past it.
  Match Next(uint64_t size);

  // An iteration begins (as marked at run time). The first
  // `plan.prologue_iterations` are part of the prologue; from the next one
  // on, every iteration restarts the steady-state entries.
  void IterationBegin();
  // Moves the cursor to the start of the steady-state iteration (used when a
  // plan is installed in the middle of a run).
  void JumpToIteration();

  // The plan's time at the cursor (for choosing pages that stay idle).
  int64_t now() const;
  bool in_prologue() const { return in_prologue_; }
  // In the set-up, before any iteration: nothing of the iteration's
  // schedule has begun.
  bool in_setup() const { return in_prologue_ && iterations_seen_ == 0; }
  // In the prologue: the early iteration being matched (0-based; -1 in the
  // set-up).
  int64_t prologue_iteration() const { return iterations_seen_ - 1; }

 private:
  const std::vector<PlannedRequest>& sequence() const {
    return in_prologue_ ? plan_.prologue : plan_.iteration;
  }
  // Moves to the next entry; wraps to the steady sequence at the end.
  void Advance();

  const RuntimePlan& plan_;
  // Looks for `size` in `seq` around `cursor` (ahead, then behind).
  static const PlannedRequest* Find(const std::vector<PlannedRequest>& seq,
                                    size_t& cursor, uint64_t size, int ahead,
                                    int behind);

  bool in_prologue_;
  size_t cursor_ = 0;
  int64_t iterations_seen_ = 0;
};

}  // namespace loom::vmm

#endif  // LOOM_VMM_MATCHER_H_
