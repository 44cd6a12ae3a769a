// The plan verifier: checks any offsets against an instance (pure C++).
//
// Independent of the planner by design: it shares no placement code with
// plan/placement/*, so a bug there cannot hide itself here. Given an
// Instance and one offset per buffer it checks, in this order:
//   1. every buffer has an offset (the counts match);
//   2. every offset is a multiple of the buffer's alignment and of the
//      plan's minimum alignment;
//   3. offset + size neither overflows nor exceeds the capacity (when one
//      is given);
//   4. no two buffers whose lifetimes intersect share a byte. Lifetimes are
//      half-open and, for cyclic instances, wrap around the period
//      (LiveIntervals), so a plan valid here is valid when replayed every
//      iteration.
// Sizes are rounded up to `size_round` first (the planner reserves whole
// rounding units). Step 4 is a sweep line over time with an ordered map of
// the live address ranges: O(n log n), so 300,000 buffers take well under a
// second. The first violation found is reported; "first" is deterministic
// (checks 1-3 in buffer order, then the earliest time of the sweep).
#ifndef LOOM_PLAN_SOLVER_VERIFIER_H_
#define LOOM_PLAN_SOLVER_VERIFIER_H_

#include <cstdint>
#include <span>
#include <string>

#include "base/status.h"
#include "plan/solver/instance.h"

namespace loom::plan {

struct VerifyOptions {
  uint64_t capacity = 0;       // 0: unlimited; else offset + size <= capacity
  uint64_t size_round = 1;     // sizes are rounded up to a multiple of this
  uint64_t min_alignment = 1;  // offsets must also be multiples of this
};

enum class ViolationKind {
  kNone,
  kCount,      // offsets.size() != buffers.size()
  kAlignment,  // offset not a multiple of the alignment
  kCapacity,   // offset + size beyond the capacity (or overflowing 2^64)
  kOverlap,    // two live buffers share bytes
};

struct Verdict {
  ViolationKind kind = ViolationKind::kNone;
  // Index (into instance.buffers) of the offending buffer, and for overlaps
  // the other one (the one already live); SIZE_MAX when not applicable.
  size_t buffer = SIZE_MAX;
  size_t other = SIZE_MAX;
  int64_t time = 0;         // overlaps: a time step at which both are live
  std::string message;      // human-readable; empty when valid
  uint64_t peak_bytes = 0;  // max offset + rounded size over all buffers

  bool valid() const { return kind == ViolationKind::kNone; }
};

// Checks `offsets` (one per buffer of `instance`) as described above.
// REQUIRES: ValidateInstance(instance).ok(); options' size_round and
// min_alignment are >= 1.
Verdict VerifyPlacement(const Instance& instance,
                        std::span<const uint64_t> offsets,
                        const VerifyOptions& options = {});

// Checks that `planned` describes the same buffers as `instance`, position
// by position: same count, ids, lifetimes and alignment, and a planned size
// at least the instance's size. `planned` is typically the instance rebuilt
// from a plan file. The error names the first differing buffer.
Status CheckSameBuffers(const Instance& planned, const Instance& instance);

}  // namespace loom::plan

#endif  // LOOM_PLAN_SOLVER_VERIFIER_H_
