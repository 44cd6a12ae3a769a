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
// A plan made from a trace carries it; one made from a CSV instance does
// not (the runtime refuses such a plan with a clear message). The decoder
// checks every value against the plan (buffer indices, sizes no larger than
// the buffer's reserved size) and never trusts a count beyond the payload.
#ifndef LOOM_PLAN_PLANFILE_REQUEST_TABLE_H_
#define LOOM_PLAN_PLANFILE_REQUEST_TABLE_H_

#include <cstdint>
#include <optional>
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

// The sequences the runtime matcher replays (plan file section REQS).
struct RequestTable {
  int64_t prologue_iterations = 0;  // early iterations before the steady one
  std::vector<RequestRef> prologue;
  std::vector<RequestRef> iteration;
  friend bool operator==(const RequestTable&, const RequestTable&) = default;
};

inline constexpr uint32_t kRequestTableTag = PlanTag("REQS");

PlanSection EncodeRequestTable(const RequestTable& table);

// The REQS section of `plan` decoded and checked, or nullopt if the plan has
// none. `source` names the file in errors.
StatusOr<std::optional<RequestTable>> DecodeRequestTable(
    const PlanFile& plan, std::string_view source);

}  // namespace loom::plan

#endif  // LOOM_PLAN_PLANFILE_REQUEST_TABLE_H_
