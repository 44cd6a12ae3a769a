// A planning instance: buffers with lifetimes and sizes (pure C++).
//
// This is the input of the planner and the verifier. A buffer is live during
// the half-open time interval [start, end) and needs `size` contiguous bytes.
// Two buffers conflict when their lifetimes intersect; a plan gives every
// buffer an offset so that conflicting buffers never share a byte.
//
// Cyclic instances (period > 0) describe one steady-state iteration that is
// replayed forever: time is taken modulo `period`, and a buffer may cross the
// iteration boundary (start < period < end <= start + period), in which case
// it is live during [start, period) and [0, end - period).
//
// Invariants (ValidateInstance): start < end; size > 0; alignment is a power
// of two; for cyclic instances 0 <= start < period and end - start <= period.
#ifndef LOOM_PLAN_SOLVER_INSTANCE_H_
#define LOOM_PLAN_SOLVER_INSTANCE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"

namespace loom::plan {

struct Buffer {
  uint64_t id = 0;         // caller's identifier (CSV id, request ordinal)
  int64_t start = 0;       // first time step live
  int64_t end = 0;         // first time step dead again (half-open)
  uint64_t size = 0;       // bytes
  uint64_t alignment = 1;  // required offset alignment (power of two)

  friend bool operator==(const Buffer&, const Buffer&) = default;
};

struct Instance {
  std::vector<Buffer> buffers;
  int64_t period = 0;     // 0: not cyclic; else the iteration length
  uint64_t capacity = 0;  // 0: none given; else the memory size to fit in
  // Optional textual ids (MiniMalloc's "b1"); empty, or one per buffer.
  std::vector<std::string> labels;

  friend bool operator==(const Instance&, const Instance&) = default;
};

// The time intervals during which `buffer` is live, after wrapping for cyclic
// instances: one interval, or two when it crosses the iteration boundary.
// REQUIRES: the buffer is valid for `period` (ValidateInstance).
std::vector<std::pair<int64_t, int64_t>> LiveIntervals(const Buffer& buffer,
                                                       int64_t period);

// True when the two buffers are live at a common time step.
bool Conflict(const Buffer& a, const Buffer& b, int64_t period);

// Max over time of the total size of live buffers: no plan can have a lower
// peak. Sizes are first rounded up to `round_to` (1 = exact bytes).
uint64_t LowerBound(const Instance& instance, uint64_t round_to = 1);

// Checks the invariants at the top of this file; the error names the buffer.
Status ValidateInstance(const Instance& instance);

}  // namespace loom::plan

#endif  // LOOM_PLAN_SOLVER_INSTANCE_H_
