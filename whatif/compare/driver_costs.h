// Driver time: what a row's driver calls stand for on a real GPU, priced
// with per-call costs measured there.
//
// A DriverCostTable holds, for a few handle sizes (the rows), the median
// microseconds of each CUDA call; it is the JSON that bench/gpu/driver_costs
// --json writes:
//   {"device": ..., "sizes": [{"bytes": 2097152,
//     "cuMemCreate": {"median_us": 8.3, "p99_us": 45.9}, ...}, ...]}
// (other keys ignored; "cudaMalloc" and "cudaFree" are read when present,
// though the tool does not measure them yet).
//
// The embedded table (H200DriverCosts) is the NVIDIA H200's of 2026-11-26
// (driver 580.159.04, CUDA 13.0; bench/gpu/driver_costs --rounds 50, the
// run printed in ../shared/gpu_runs/2026-11-26/tests_summary.md): at 2 MiB
// create 8.3 us, map 1.1, set-access 21.1, unmap 14.9, release 10.5,
// reserve and free 0.8.
//
// Pricing (PriceDriverCalls): each call at the cost of its kind for its
// size, linear between the measured sizes and clamped outside them (a call
// below the smallest size costs the smallest's, one above the largest the
// largest's). A call whose size is unknown (bytes 0; every row records
// sizes today: the simulators per call, loom's through
// vmm::Driver::sized_calls) is priced at the smallest size, the granule. Kinds the table has no figure for
// (cudaMalloc and cudaFree in the measured tables) are not priced: they are
// counted as unpriced, and reports say the time is incomplete.
#ifndef LOOM_WHATIF_COMPARE_DRIVER_COSTS_H_
#define LOOM_WHATIF_COMPARE_DRIVER_COSTS_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "whatif/sim/stats.h"

namespace loom::whatif {

struct DriverCostTable {
  // One line naming where the numbers come from.
  std::string source;
  struct Row {
    uint64_t bytes = 0;
    // Median microseconds per kind (kAllDriverCallKinds' order); negative:
    // not measured at this size.
    std::array<double, kDriverCallKinds> median_us;
  };
  std::vector<Row> rows;  // by ascending bytes, distinct

  // The cost of one call of `kind` covering `bytes` (0: unknown, priced at
  // the smallest size), or nullopt when no row has the kind.
  std::optional<double> CostUs(DriverCallKind kind, uint64_t bytes) const;
  // The smallest size measured (the granule), 0 for an empty table.
  uint64_t smallest_bytes() const {
    return rows.empty() ? 0 : rows.front().bytes;
  }
};

// The embedded table: the H200's (header comment).
const DriverCostTable& H200DriverCosts();

// Parses bench/gpu/driver_costs --json output. INVALID_ARGUMENT, naming
// `source` and the place, for malformed JSON, a missing or empty "sizes",
// a row without a positive integer "bytes", two rows of one size, a
// median that is not a non-negative number, or no known call at all.
StatusOr<DriverCostTable> ParseDriverCosts(std::string_view json,
                                           std::string_view source);
// Reads and parses the file at `path` (NOT_FOUND if it cannot be read).
StatusOr<DriverCostTable> ReadDriverCosts(const std::string& path);

// What a set of calls stands for.
struct DriverTime {
  double us = 0;  // the priced calls' time
  uint64_t priced_calls = 0;
  uint64_t unsized_calls = 0;   // priced, at the smallest size (unknown)
  uint64_t unpriced_calls = 0;  // of kinds the table has no figure for
  std::vector<std::string> unpriced_kinds;  // their CUDA names
  bool complete() const { return unpriced_calls == 0; }
};

DriverTime PriceDriverCalls(const DriverCalls& calls,
                            const DriverCostTable& table);

// "0 us", "812 us", "12.4 ms", "3.05 s".
std::string FormatMicros(double us);

}  // namespace loom::whatif

#endif  // LOOM_WHATIF_COMPARE_DRIVER_COSTS_H_
