// MiniMalloc CSV planning instances: read and write (pure C++).
//
// Format (google/minimalloc): a header line naming the columns, then one
// buffer per line. Columns: `id` (or `buffer`, `buffer_id`; integer or text),
// `lower` (or `begin`, `start`), `upper` (half-open end) or `end` (inclusive
// end, as MiniMalloc treats it), `size`, and optionally `alignment` and
// `offset` (a solution, as written by `loom plan --offsets`). Unknown columns
// are an error. Every value is checked: a bad file yields a Status naming the
// file, the line and the problem, never a crash.
#ifndef LOOM_PLAN_SOLVER_MINIMALLOC_CSV_H_
#define LOOM_PLAN_SOLVER_MINIMALLOC_CSV_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "plan/solver/instance.h"

namespace loom::plan {

// Largest buffer size or time value the reader accepts (2^50): anything
// bigger is treated as corrupt input rather than a real workload.
inline constexpr uint64_t kMaxCsvValue = uint64_t{1} << 50;

struct CsvInstance {
  Instance instance;
  std::vector<uint64_t> offsets;  // one per buffer if the file had `offset`
};

// Parses CSV text. `source` names the input in error messages.
StatusOr<CsvInstance> ParseMinimallocCsv(std::string_view text,
                                         std::string_view source);

// Reads and parses a file.
StatusOr<CsvInstance> ReadMinimallocCsv(const std::string& path);

// Formats `instance` as CSV with half-open `lower,upper`. If `offsets` is
// non-empty (one per buffer) an `offset` column is added.
std::string FormatMinimallocCsv(const Instance& instance,
                                const std::vector<uint64_t>& offsets = {});

// Writes FormatMinimallocCsv(...) to `path`.
Status WriteMinimallocCsv(const std::string& path, const Instance& instance,
                          const std::vector<uint64_t>& offsets = {});

}  // namespace loom::plan

#endif  // LOOM_PLAN_SOLVER_MINIMALLOC_CSV_H_
