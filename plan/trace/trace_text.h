// The text form of trace files (`.ltt`, version 1; docs/formats.md): one
// event per line, for humans, tests and the Python snapshot importer
// (pure C++). Use trace_io.h's OpenTraceReader / NewTraceWriter, which pick
// the form; these are their text halves.
//
// Extension of the written spec (documented in docs/formats.md): a line
// `name <name>` appends a name to the name table without an event. Writers
// emit it only for names that are not first used, in table order, by the next
// event (unused names, or a table not in first-use order), so the name table
// survives a round trip exactly. Comments may also end a line (` # ...`).
#ifndef LOOM_PLAN_TRACE_TRACE_TEXT_H_
#define LOOM_PLAN_TRACE_TRACE_TEXT_H_

#include <memory>
#include <string>
#include <string_view>

#include "base/status.h"
#include "base/byte_stream.h"
#include "plan/trace/trace_io.h"

namespace loom::plan {

inline constexpr std::string_view kTextTraceMagic = "loom-trace";
inline constexpr uint64_t kTextTraceVersion = 1;
// Longest line a reader accepts (a quoted name or provenance fits easily).
inline constexpr size_t kMaxTextLineBytes = size_t{1} << 20;

// Reads the header from `in` (positioned at the start of the file).
StatusOr<std::unique_ptr<TraceReader>> OpenTextTraceReader(
    std::unique_ptr<ByteReader> in);

// Writes `header` to `sink`. REQUIRES: TraceChecker::CheckHeader(header).
StatusOr<std::unique_ptr<TraceWriter>> NewTextTraceWriter(
    std::unique_ptr<ByteSink> sink, const TraceHeader& header);

// `name` as the text form writes it: bare when it is a plain token, else
// double-quoted with escapes (`\\`, `\"`, `\n`, `\t`, `\xHH`).
std::string FormatTextName(std::string_view name);

}  // namespace loom::plan

#endif  // LOOM_PLAN_TRACE_TRACE_TEXT_H_
