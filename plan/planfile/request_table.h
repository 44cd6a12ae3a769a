// The request table of a plan file (section REQS): the request sequences
// the run-time matcher replays, each entry pointing at its planned buffer
// (pure C++).
//
// Payload (little-endian varints; signed values zigzag-encoded):
//   prologue_iterations, prologue count, iteration count, then per entry
//   (prologue first) size, buffer id + 1 (0 = unplanned), start, end.
// EncodeRequestTable takes buffer ids in RequestRef::buffer (the planning
// problem's buffer ids); DecodeRequestTable returns indices into
// PlanFile::buffers.
// Requests made inside modules marked dynamic (MoE experts) have their own
// sequences, one per dynamic window ("module@phase"): the k-th request of
// the window in an iteration, its size the largest the recorded iterations
// made at that position (section DREQ, optional: a reader without it serves
// every dynamic request from the dynamic space). Payload: window count,
// then per window its name (length, bytes), entry count, entries as in
// REQS and each entry's call, then the count of early iterations (at most
// prologue_iterations) and per early iteration the same (entry count,
// entries, calls).
// A plan made from a trace carries it; one made from a CSV instance does
// not (the runtime refuses such a plan with a clear message). The decoder
// checks every value against the plan (buffer indices, sizes no larger than
// the buffer's reserved size) and never trusts a count beyond the payload.
#ifndef LOOM_PLAN_PLANFILE_REQUEST_TABLE_H_
#define LOOM_PLAN_PLANFILE_REQUEST_TABLE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "plan/planfile/plan_file.h"

namespace loom::plan {

// One request of a sequence the runtime replays.
struct RequestRef {
  uint64_t size = 0;    // exact requested bytes
  int64_t buffer = -1;  // index into the instance's buffers; -1: unplanned
  int64_t start = 0;    // iteration time of the request (prologue: 0)
  int64_t end = 0;      // iteration time of its free (may exceed the period)
  friend bool operator==(const RequestRef&, const RequestRef&) = default;
};

// One iteration's requests of a dynamic window, in order, and per request
// the call of the window's module it was made in (1 for the iteration's
// first call; 0 if the module was entered in another phase): the run time
// starts each call at its first request.
struct WindowRequests {
  std::vector<RequestRef> requests;
  std::vector<uint32_t> calls;  // as many as `requests`
  friend bool operator==(const WindowRequests&,
                         const WindowRequests&) = default;
};

// The requests of one dynamic window.
struct DynamicSequence {
  std::string window;     // "module@phase", as the plan's DYNS windows
  WindowRequests steady;  // the steady iteration's: the slots
  // Per early iteration (the prologue's, 0-based), its requests in the
  // window: at the slot of the steady request at the same position of the
  // same call (when the call made as many), persistent buffers (optimizer
  // state made inside a module left open), or unplanned.
  std::vector<WindowRequests> early;
  friend bool operator==(const DynamicSequence&,
                         const DynamicSequence&) = default;
};

// The sequences the runtime matcher replays (plan file sections REQS and
// DREQ).
struct RequestTable {
  int64_t prologue_iterations = 0;  // early iterations before the steady one
  std::vector<RequestRef> prologue;
  std::vector<RequestRef> iteration;
  std::vector<DynamicSequence> dynamic;  // by window name, sorted
  friend bool operator==(const RequestTable&, const RequestTable&) = default;
};

inline constexpr uint32_t kRequestTableTag = PlanTag("REQS");
inline constexpr uint32_t kDynamicRequestsTag = PlanTag("DREQ");

// The REQS section, and the DREQ section (only when `table.dynamic` is not
// empty).
std::vector<PlanSection> EncodeRequestTable(const RequestTable& table);

// The REQS section of `plan` (with DREQ, if present) decoded and checked,
// or nullopt if the plan has none. `source` names the file in errors.
StatusOr<std::optional<RequestTable>> DecodeRequestTable(
    const PlanFile& plan, std::string_view source);

}  // namespace loom::plan

#endif  // LOOM_PLAN_PLANFILE_REQUEST_TABLE_H_
