// Shared body of the trace reader fuzz targets (bench/fuzz/run_fuzz.sh).
//
// Whatever the input, the reader must return a Status or a trace; a trace it
// accepts must be valid, and must survive writing and reading in both forms.
// Any violation traps, which libFuzzer reports as a crash.
#ifndef LOOM_BENCH_FUZZ_FUZZ_COMMON_H_
#define LOOM_BENCH_FUZZ_FUZZ_COMMON_H_

#include <string_view>

#include "plan/trace/trace.h"
#include "plan/trace/trace_io.h"

namespace loom::plan {

inline void FuzzOneTrace(std::string_view data) {
  StatusOr<Trace> trace = ParseTrace(data, "fuzz");
  if (!trace.ok()) {
    if (trace.status().message().empty()) __builtin_trap();
    return;
  }
  if (!ValidateTrace(*trace).ok()) __builtin_trap();
  for (TraceFormat format : {TraceFormat::kText, TraceFormat::kBinary}) {
    StatusOr<std::string> again = SerializeTrace(*trace, format);
    if (!again.ok()) __builtin_trap();
    StatusOr<Trace> back = ParseTrace(*again, "again");
    if (!back.ok() || !(*back == *trace)) __builtin_trap();
  }
}

}  // namespace loom::plan

#endif  // LOOM_BENCH_FUZZ_FUZZ_COMMON_H_
