// The request fingerprint of a recorded trace: may one rank replay the plan
// made from another rank's trace? (pure C++)
//
// A plan places the requests of one recorded run. Another process may replay
// it only if it makes the same requests in the same order, which
// data-parallel ranks do and pipeline stages do not. The fingerprint hashes
// (SHA-256) the request sequence a plan depends on, with what legitimately
// differs between processes taken out:
//  - requests made inside modules marked dynamic (MoE buffers the plan never
//    places), and their frees, are skipped;
//  - stream handles (different in every process) become the order in which
//    streams first appear (the default stream 0 stays 0);
//  - a free is identified by how many counted requests back its allocation
//    was, not by request id.
// Each alloc contributes "a<size>,<stream>;", each free "f<age>,<stream>;",
// each iteration begin/end "ib;"/"ie;"; other markers do not count. Two parts
// are hashed apart: the steady part (the last complete iteration that
// allocates: an iter_begin up to its iter_end or the next iter_begin) and
// the prologue (everything before it); events after the steady part belong
// to no plan and are ignored. Two fingerprints match when both have a steady
// part and both digests are equal.
#ifndef LOOM_PLAN_TRACE_FINGERPRINT_H_
#define LOOM_PLAN_TRACE_FINGERPRINT_H_

#include <cstdint>
#include <string>

#include "plan/trace/trace.h"

namespace loom::plan {

// Bumped whenever the hashed tokens change: fingerprints of different
// versions never match.
inline constexpr int kFingerprintVersion = 1;

struct RequestFingerprint {
  int version = kFingerprintVersion;
  std::string prologue;  // 64 hex digits
  std::string steady;    // 64 hex digits
  uint64_t prologue_allocs = 0;
  uint64_t steady_allocs = 0;
  uint64_t steady_frees = 0;
  uint64_t iterations = 0;  // iteration-begin markers in the whole trace
  uint64_t events = 0;      // events in the whole trace
  bool has_steady = false;  // a complete iteration that allocates exists
};

// REQUIRES: `trace` is well formed (ValidateTrace), as every reader returns.
RequestFingerprint FingerprintRequests(const Trace& trace);

// The fingerprint as a JSON object (keys as the fields above).
std::string FingerprintJson(const RequestFingerprint& fingerprint);

}  // namespace loom::plan

#endif  // LOOM_PLAN_TRACE_FINGERPRINT_H_
