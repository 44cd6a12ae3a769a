#include "plan/trace/trace_io.h"

#include "plan/trace/trace_binary.h"
#include "plan/trace/trace_text.h"

namespace loom::plan {

std::string_view TraceFormatName(TraceFormat format) {
  return format == TraceFormat::kBinary ? "binary" : "text";
}

StatusOr<TraceFormat> ParseTraceFormat(std::string_view name) {
  if (name == "text" || name == "ltt") return TraceFormat::kText;
  if (name == "binary" || name == "ltb") return TraceFormat::kBinary;
  return InvalidArgumentError("unknown trace format '{}' (text or binary)",
                              name);
}

StatusOr<bool> TraceReader::Next(Event* event) {
  if (!error_.ok()) return error_;
  if (done_) return false;
  StatusOr<bool> next = ReadNext(event);
  if (!next.ok()) {
    error_ = next.status();
    return error_;
  }
  if (!*next) done_ = true;
  return next;
}

Status TraceWriter::Fail(Status status) {
  if (error_.ok()) {
    error_ = Status(status.code(),
                    fmt::format("{}: {}", sink_->name(), status.message()));
  }
  return error_;
}

Status TraceWriter::AddName(std::string_view name) {
  if (!error_.ok()) return error_;
  if (finished_) return Fail(FailedPreconditionError("writer is finished"));
  Status status = checker_.AddName(name);
  if (!status.ok()) return Fail(status);
  return OkStatus();
}

StatusOr<uint32_t> TraceWriter::InternName(std::string_view name) {
  if (std::optional<uint32_t> index = checker_.FindName(name)) return *index;
  LOOM_RETURN_IF_ERROR(AddName(name));
  return static_cast<uint32_t>(names().size() - 1);
}

Status TraceWriter::Write(const Event& event) {
  if (!error_.ok()) return error_;
  if (finished_) return Fail(FailedPreconditionError("writer is finished"));
  uint64_t index = checker_.events();
  Status status = checker_.CheckEvent(event);
  if (!status.ok()) {
    return Fail(Status(status.code(),
                       fmt::format("event {}: {}", index, status.message())));
  }
  bool named = event.kind == EventKind::kPhase ||
               event.kind == EventKind::kModuleEnter ||
               event.kind == EventKind::kModuleExit;
  bool defines = false;
  if (named && event.name >= emitted_names_) {
    for (; emitted_names_ < event.name; ++emitted_names_) {
      status = EmitName(emitted_names_);
      if (!status.ok()) return Fail(status);
    }
    defines = true;
    emitted_names_ = event.name + 1;
  }
  status = EmitEvent(event, defines);
  if (!status.ok()) return Fail(status);
  return OkStatus();
}

Status TraceWriter::Finish() {
  if (!error_.ok()) return error_;
  if (finished_) return OkStatus();
  for (; emitted_names_ < names().size(); ++emitted_names_) {
    Status status = EmitName(emitted_names_);
    if (!status.ok()) return Fail(status);
  }
  Status status = EmitEnd();
  if (status.ok()) status = sink_->Close();
  if (!status.ok()) return Fail(status);
  finished_ = true;
  return OkStatus();
}

StatusOr<std::unique_ptr<TraceReader>> OpenTraceReader(
    std::unique_ptr<ByteSource> source) {
  auto reader = std::make_unique<ByteReader>(std::move(source));
  LOOM_ASSIGN_OR_RETURN(std::string_view head,
                        reader->Peek(kBinaryTraceMagic.size()));
  if (head == kBinaryTraceMagic)
    return OpenBinaryTraceReader(std::move(reader));
  return OpenTextTraceReader(std::move(reader));
}

StatusOr<std::unique_ptr<TraceReader>> OpenTraceReader(
    const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<ByteSource> source,
                        OpenFileSource(path));
  return OpenTraceReader(std::move(source));
}

StatusOr<std::unique_ptr<TraceWriter>> NewTraceWriter(
    std::unique_ptr<ByteSink> sink, const TraceHeader& header,
    TraceFormat format) {
  Status status = TraceChecker::CheckHeader(header);
  if (!status.ok()) {
    return Status(status.code(),
                  fmt::format("{}: {}", sink->name(), status.message()));
  }
  if (format == TraceFormat::kBinary) {
    return NewBinaryTraceWriter(std::move(sink), header);
  }
  return NewTextTraceWriter(std::move(sink), header);
}

StatusOr<std::unique_ptr<TraceWriter>> OpenTraceWriter(
    const std::string& path, const TraceHeader& header, TraceFormat format) {
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<ByteSink> sink, OpenFileSink(path));
  return NewTraceWriter(std::move(sink), header, format);
}

StatusOr<Trace> ReadTraceFrom(TraceReader& reader) {
  Trace trace;
  trace.header = reader.header();
  Event event;
  while (true) {
    LOOM_ASSIGN_OR_RETURN(bool more, reader.Next(&event));
    if (!more) break;
    trace.events.push_back(event);
  }
  trace.names = reader.names();
  return trace;
}

StatusOr<Trace> ReadTrace(const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<TraceReader> reader,
                        OpenTraceReader(path));
  return ReadTraceFrom(*reader);
}

StatusOr<Trace> ParseTrace(std::string_view data, std::string_view source) {
  LOOM_ASSIGN_OR_RETURN(
      std::unique_ptr<TraceReader> reader,
      OpenTraceReader(NewMemorySource(data, std::string(source))));
  return ReadTraceFrom(*reader);
}

namespace {

Status WriteAll(const Trace& trace, TraceWriter& writer) {
  for (const std::string& name : trace.names) {
    LOOM_RETURN_IF_ERROR(writer.AddName(name));
  }
  for (const Event& event : trace.events) {
    LOOM_RETURN_IF_ERROR(writer.Write(event));
  }
  return writer.Finish();
}

}  // namespace

Status WriteTrace(const std::string& path, const Trace& trace,
                  TraceFormat format) {
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<TraceWriter> writer,
                        OpenTraceWriter(path, trace.header, format));
  return WriteAll(trace, *writer);
}

StatusOr<std::string> SerializeTrace(const Trace& trace, TraceFormat format) {
  std::string out;
  LOOM_ASSIGN_OR_RETURN(
      std::unique_ptr<TraceWriter> writer,
      NewTraceWriter(NewStringSink(&out, "<memory>"), trace.header, format));
  LOOM_RETURN_IF_ERROR(WriteAll(trace, *writer));
  return out;
}

Status CopyTrace(TraceReader& reader, TraceWriter& writer) {
  Event event;
  auto sync_names = [&]() -> Status {
    const std::vector<std::string>& names = reader.names();
    for (size_t i = writer.names().size(); i < names.size(); ++i) {
      LOOM_RETURN_IF_ERROR(writer.AddName(names[i]));
    }
    return OkStatus();
  };
  while (true) {
    LOOM_ASSIGN_OR_RETURN(bool more, reader.Next(&event));
    LOOM_RETURN_IF_ERROR(sync_names());
    if (!more) break;
    LOOM_RETURN_IF_ERROR(writer.Write(event));
  }
  return writer.Finish();
}

Status ConvertTrace(const std::string& in_path, const std::string& out_path,
                    TraceFormat format) {
  if (in_path == out_path) {
    return InvalidArgumentError("{}: cannot convert a trace onto itself",
                                in_path);
  }
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<TraceReader> reader,
                        OpenTraceReader(in_path));
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<TraceWriter> writer,
                        OpenTraceWriter(out_path, reader->header(), format));
  return CopyTrace(*reader, *writer);
}

}  // namespace loom::plan
