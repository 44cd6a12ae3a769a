// Perturbing a trace, for measuring a plan on a run it was not made from: a
// seeded share of requests dropped, requests added, and requests resized
// (pure C++).
//
// A dropped request disappears with its free. An added request (random size
// up to `max_add_bytes`, on the default stream) is inserted right after a
// kept allocation and freed at a later free, or at the end. A resized
// request keeps its place and grows or shrinks by 512 B to 32 KiB (never
// below 512 B). Markers are kept, so iterations, phases and modules stay
// where they were. The same trace and options always give the same result.
#ifndef LOOM_WHATIF_WORKLOADS_PERTURB_H_
#define LOOM_WHATIF_WORKLOADS_PERTURB_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"
#include "plan/trace/trace.h"

namespace loom::whatif {

struct PerturbOptions {
  double drop = 0;    // share of allocations dropped, 0..1
  double add = 0;     // an extra request after this share of allocations
  double resize = 0;  // share of allocations resized
  uint64_t seed = 1;
  uint64_t max_add_bytes = uint64_t{8} << 20;  // an added request's most; >= 1

  bool any() const { return drop > 0 || add > 0 || resize > 0; }
};

// "drop=P,add=P,resize=P,seed=S[,max_add=BYTES]": P a fraction (0.03) or a
// percentage (3%); BYTES as base/flags.h's ParseSize ("4096", "256KiB"), at
// least 1. Keys may be omitted (0; max_add: 8 MiB); INVALID_ARGUMENT names a
// bad item.
StatusOr<PerturbOptions> ParsePerturbOptions(std::string_view text);

// "drop=3%,add=3%,resize=3%,seed=1", for reports (and ",max_add=BYTES" when
// not the default); ParsePerturbOptions reads it back.
std::string FormatPerturbOptions(const PerturbOptions& options);

// REQUIRES: `trace` is well formed; options.max_add_bytes >= 1. The result is
// well formed too.
plan::Trace Perturb(const plan::Trace& trace, const PerturbOptions& options);

}  // namespace loom::whatif

#endif  // LOOM_WHATIF_WORKLOADS_PERTURB_H_
