// RuntimePlan: what the run-time allocator needs from an offline plan.
//
// A plan file (plan/planfile/plan_file.h) is converted into this plain
// structure (vmm/plan_loader.h); the allocator never parses files. The plan
// describes the request sequences as they were recorded:
//  - `prologue`: every request before the steady state, in order: the
//    set-up and the early iterations; those that stay live into the steady
//    state (weights, optimizer state) carry a persistent offset, those of
//    early iterations the offset of their steady-state counterpart;
//  - `iteration`: the requests of one steady-state iteration, in order,
//    replayed every iteration (requests made inside dynamic modules are not
//    part of the sequence);
//  - per dynamic window, the n-th request of the window in an iteration:
//    a slot of the largest size the recorded iterations made there (MoE
//    experts' sizes follow the routing); a dynamic request is served at its
//    slot when it fits, by the dynamic space otherwise.
// Offsets are byte offsets in the static region of `region_bytes`. Time is the
// plan's event index within the iteration, in [0, period); `start`/`end` are
// the planned lifetime (end may exceed period for requests that cross the
// iteration boundary).
#ifndef LOOM_VMM_RUNTIME_PLAN_H_
#define LOOM_VMM_RUNTIME_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

namespace loom::vmm {

inline constexpr int64_t kUnplanned = -1;

struct PlannedRequest {
  uint64_t size = 0;            // exact requested bytes, the matching key
  int64_t offset = kUnplanned;  // in the static region, or kUnplanned
  int64_t start = 0;            // planned lifetime (iteration time)
  int64_t end = 0;
  friend bool operator==(const PlannedRequest&,
                         const PlannedRequest&) = default;
};

// One iteration's requests of a dynamic window, in order, and per request
// the call of the window's module it was made in (1 for the iteration's
// first; 0: the module was entered in another phase): each call of the
// module starts at its first request, so a call that made fewer (an expert
// without tokens) shifts no later call.
struct WindowRequests {
  std::vector<PlannedRequest> requests;
  std::vector<uint32_t> calls;  // as many as `requests`
};

// A dynamic module's window ("module@phase"): the granules of the static
// region idle during it, and the slots of its requests.
struct DynamicWindow {
  std::string module;  // module name as marked at run time
  int64_t start = 0;   // iteration time of the window
  int64_t end = 0;
  std::vector<uint32_t> idle_granules;  // static-region granule indices
  // The n-th request of the window in a steady iteration: its slot (size:
  // the largest recorded there; offset kUnplanned if it has none).
  WindowRequests steady;
  // Per early iteration (the prologue's, 0-based), its requests in the
  // window: at the slots of the steady ones they line up with, persistent
  // ranges (state made inside a module left open), or kUnplanned.
  std::vector<WindowRequests> early;
};

struct RuntimePlan {
  uint64_t region_bytes = 0;  // static region size (multiple of granularity)
  int64_t period = 0;         // events per iteration
  // Iteration-begin markers recorded inside the prologue: the steady-state
  // iteration starts at the next one.
  int64_t prologue_iterations = 0;
  std::vector<PlannedRequest> prologue;
  std::vector<PlannedRequest> iteration;
  std::vector<DynamicWindow> windows;
};

// True for an entry of `plan` placed for a whole period or more: a
// persistent buffer (weights, optimizer state).
inline bool Persistent(const PlannedRequest& entry, const RuntimePlan& plan) {
  return entry.offset != kUnplanned && plan.period > 0 &&
         entry.end - entry.start >= plan.period;
}

}  // namespace loom::vmm

#endif  // LOOM_VMM_RUNTIME_PLAN_H_
