// Trace files: streaming readers and writers for the text and binary forms
// (pure C++). The forms are specified in docs/formats.md.
//
// A TraceReader yields a trace's header first, then its events one at a time;
// its name table grows as name definitions appear. A TraceWriter takes the
// header, then names and events in order, and Finish() writes the trailer.
// Neither ever holds the whole trace: memory is proportional to the live
// request set (plus one buffer), so million-event traces stream.
//
// Both forms hold exactly the same information and accept exactly the same
// traces (TraceChecker, trace_checker.h, states the rules), so conversion is
// lossless both ways: header, every event field, and the name table with its
// order. Writers emit a name's definition lazily, just before the first event
// that uses it (names never used go just before the trailer), so a writer's
// output is a function of (header, final name table, events) alone: binary ->
// text -> binary reproduces the bytes.
//
// Every reader rejects bad input (wrong magic or version, truncation,
// checksum mismatch, out-of-range values, broken alloc/free or module
// pairing, trailing garbage) with a Status whose message starts with the
// source name and the line (`file:12: ...`) or byte offset
// (`file: offset 345: ...`). Readers never crash and never allocate memory in
// proportion to a length field.
#ifndef LOOM_PLAN_TRACE_TRACE_IO_H_
#define LOOM_PLAN_TRACE_TRACE_IO_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "base/byte_stream.h"
#include "plan/trace/trace.h"
#include "plan/trace/trace_checker.h"

namespace loom::plan {

enum class TraceFormat : uint8_t {
  kText = 1,    // `.ltt`: one event per line, for humans and tests
  kBinary = 2,  // `.ltb`: varint records in CRC-32C-checked chunks
};

// "text" or "binary".
std::string_view TraceFormatName(TraceFormat format);
// Parses "text"/"binary" (also "ltt"/"ltb").
StatusOr<TraceFormat> ParseTraceFormat(std::string_view name);

class TraceReader {
 public:
  virtual ~TraceReader() = default;

  virtual TraceFormat format() const = 0;
  const std::string& source() const { return source_; }
  const TraceHeader& header() const { return header_; }
  // The names defined so far; Event::name indexes it.
  const std::vector<std::string>& names() const { return checker_.names(); }

  // Reads the next event into `*event`. Returns false at the clean end of the
  // trace (trailer checked, nothing after it). After an error or the end,
  // later calls return the same result.
  StatusOr<bool> Next(Event* event);

  uint64_t events_read() const { return checker_.events(); }

 protected:
  explicit TraceReader(std::string source) : source_(std::move(source)) {}
  virtual StatusOr<bool> ReadNext(Event* event) = 0;

  std::string source_;
  TraceHeader header_;
  TraceChecker checker_;

 private:
  bool done_ = false;
  Status error_;
};

class TraceWriter {
 public:
  virtual ~TraceWriter() = default;

  virtual TraceFormat format() const = 0;
  const std::vector<std::string>& names() const { return checker_.names(); }

  // Appends `name` to the name table. REQUIRES: not already there.
  Status AddName(std::string_view name);
  // The index of `name`, appending it when new.
  StatusOr<uint32_t> InternName(std::string_view name);
  // Appends one event; it must satisfy TraceChecker's rules given the events
  // before it (a name it uses must have been added).
  Status Write(const Event& event);
  // Writes the trailer and closes the output. A writer destroyed without
  // Finish leaves a file that readers reject as truncated.
  Status Finish();

  uint64_t events_written() const { return checker_.events(); }

 protected:
  TraceWriter(std::unique_ptr<ByteSink> sink) : sink_(std::move(sink)) {}

  // Writes the definition of names()[index] as a record of its own.
  virtual Status EmitName(uint32_t index) = 0;
  // Writes `event`. When `defines_name`, this is the first use of
  // names()[event.name], whose definition has not been written yet.
  virtual Status EmitEvent(const Event& event, bool defines_name) = 0;
  // Writes everything after the last event.
  virtual Status EmitEnd() = 0;

  ByteSink& sink() { return *sink_; }

 private:
  Status Fail(Status status);

  std::unique_ptr<ByteSink> sink_;
  TraceChecker checker_;
  uint32_t emitted_names_ = 0;
  bool finished_ = false;
  Status error_;  // the first failure; every later call returns it
};

// Opens a trace file of either form, detected by its magic, and reads its
// header.
StatusOr<std::unique_ptr<TraceReader>> OpenTraceReader(const std::string& path);
StatusOr<std::unique_ptr<TraceReader>> OpenTraceReader(
    std::unique_ptr<ByteSource> source);

// Creates `path` and writes `header`.
StatusOr<std::unique_ptr<TraceWriter>> OpenTraceWriter(
    const std::string& path, const TraceHeader& header, TraceFormat format);
StatusOr<std::unique_ptr<TraceWriter>> NewTraceWriter(
    std::unique_ptr<ByteSink> sink, const TraceHeader& header,
    TraceFormat format);

// Reads a whole trace into memory.
StatusOr<Trace> ReadTrace(const std::string& path);
// Parses an in-memory file; `source` names it in errors.
StatusOr<Trace> ParseTrace(std::string_view data, std::string_view source);
StatusOr<Trace> ReadTraceFrom(TraceReader& reader);

// Writes `trace` (validated on the way).
Status WriteTrace(const std::string& path, const Trace& trace,
                  TraceFormat format);
StatusOr<std::string> SerializeTrace(const Trace& trace, TraceFormat format);

// Streams `in_path` into `out_path` in `format`, passing names through in
// table order. REQUIRES: different paths.
Status ConvertTrace(const std::string& in_path, const std::string& out_path,
                    TraceFormat format);
// The same between a reader and a writer; the writer is finished.
Status CopyTrace(TraceReader& reader, TraceWriter& writer);

}  // namespace loom::plan

#endif  // LOOM_PLAN_TRACE_TRACE_IO_H_
