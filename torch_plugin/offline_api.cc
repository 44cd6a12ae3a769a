// The offline half of libloom's C ABI (loom_c_api.h, "Offline tools"): the
// planner's entry point, the request fingerprint and trace files for the
// Python package, with every failure turned into a code and a message.
#include <fmt/format.h>

#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "plan/make_plan.h"
#include "plan/planfile/plan_file.h"
#include "plan/trace/fingerprint.h"
#include "plan/trace/trace.h"
#include "plan/trace/trace_checker.h"
#include "plan/trace/trace_io.h"
#include "torch_plugin/loom_c_api.h"
#include "torch_plugin/runtime.h"
#include "whatif/loom/plan_check.h"

#define LOOM_EXPORT __attribute__((visibility("default")))

// The opaque handle: a trace and the checker that has accepted its events.
struct loom_trace {
  loom::plan::Trace trace;
  loom::plan::TraceChecker checker;
};

namespace {

using loom::Status;
using loom::StatusOr;
using loom::plan::Event;
using loom::plan::EventKind;

thread_local std::string last_result;

int Code(const Status& status) {
  if (!status.ok()) loom::plugin::SetLastError(status);
  return static_cast<int>(status.code());
}

template <typename Body>
int Guarded(Body&& body) {
  try {
    return Code(body());
  } catch (const std::bad_alloc&) {
    return Code(loom::OutOfMemoryError("host memory exhausted"));
  } catch (const std::exception& e) {
    return Code(loom::InternalError("unexpected exception: {}", e.what()));
  } catch (...) {
    return Code(loom::InternalError("unexpected exception"));
  }
}

Status NeedArgument(const void* pointer, std::string_view what) {
  if (pointer == nullptr) return loom::InvalidArgumentError("null {}", what);
  return loom::OkStatus();
}

loom::plan::TraceFormat FormatForPath(std::string_view path) {
  return path.ends_with(".ltt") ? loom::plan::TraceFormat::kText
                                : loom::plan::TraceFormat::kBinary;
}

// One ABI record -> an Event; kinds outside 1..7 and values that do not fit
// the event's fields are errors (the checker sees the rest).
StatusOr<Event> DecodeRecord(const unsigned long long* r) {
  if (r[0] < 1 || r[0] > 7) {
    return loom::InvalidArgumentError("unknown event kind {}", r[0]);
  }
  if (r[1] > 0xff || r[2] > 0x7fff || r[3] > 0xffffffffull) {
    return loom::InvalidArgumentError(
        "flags {}, device {} or name {} out of range", r[1], r[2], r[3]);
  }
  Event event;
  event.kind = static_cast<EventKind>(r[0]);
  event.flags = static_cast<uint8_t>(r[1]);
  event.device = static_cast<int16_t>(r[2]);
  event.name = static_cast<uint32_t>(r[3]);
  event.id = r[4];
  event.size = r[5];
  event.stream = r[6];
  return event;
}

// The plan replayed on the trace it was made from, with and without it.
StatusOr<loom::whatif::PlanCheck> CheckOnTrace(
    const char* input, const loom::plan::MadePlan& made) {
  LOOM_ASSIGN_OR_RETURN(loom::plan::Trace trace, loom::plan::ReadTrace(input));
  return loom::whatif::CheckPlanOnRecording(trace, made.file,
                                            made.file.granule_bytes);
}

}  // namespace

extern "C" {

LOOM_EXPORT int loom_plan_trace(const char* input, const char* plan_path,
                                const char* options) {
  return Guarded([&]() -> Status {
    LOOM_RETURN_IF_ERROR(NeedArgument(input, "input path"));
    LOOM_RETURN_IF_ERROR(NeedArgument(plan_path, "plan path"));
    loom::plan::MakePlanOptions make;
    if (options != nullptr) {
      LOOM_RETURN_IF_ERROR(loom::plan::ParseMakePlanOptions(options, &make));
    }
    LOOM_ASSIGN_OR_RETURN(loom::plan::MadePlan made,
                          loom::plan::MakePlanFromFile(input, make));
    if (!made.verdict.valid()) {
      return loom::InternalError("{}: the plan is invalid: {}", input,
                                 made.verdict.message);
    }
    if (!made.result.fits) {
      return loom::FailedPreconditionError(
          "{}: no plan within the capacity of {} bytes (best peak {})", input,
          make.capacity, made.result.peak_bytes);
    }
    // A trace (not a CSV instance): does the plan earn its place on it
    // (whatif/loom/plan_check.h)? The verdict goes in the report and in the
    // plan file (section CHEK); the session does not serve a plan that
    // does not. A check that cannot run is reported ("check_error") and
    // costs the plan nothing: the plan is made and written, as before the
    // check existed.
    std::optional<loom::StatusOr<loom::whatif::PlanCheck>> check;
    if (made.requests.has_value()) {
      check = CheckOnTrace(input, made);
      if (check->ok()) loom::whatif::RecordPlanCheck(**check, made.file);
    }
    LOOM_RETURN_IF_ERROR(loom::plan::WritePlanFile(plan_path, made.file));
    last_result = loom::plan::MadePlanJson(made, make);
    if (check.has_value())
      last_result = loom::whatif::WithPlanCheck(last_result, *check);
    return loom::OkStatus();
  });
}

LOOM_EXPORT int loom_plan_file_check(const char* path) {
  return Guarded([&]() -> Status {
    LOOM_RETURN_IF_ERROR(NeedArgument(path, "plan path"));
    LOOM_ASSIGN_OR_RETURN(loom::plan::PlanFile file,
                          loom::plan::ReadPlanFile(path));
    LOOM_ASSIGN_OR_RETURN(std::optional<loom::whatif::PlanCheck> check,
                          loom::whatif::RecordedPlanCheck(file, path));
    last_result = fmt::format("{{\"check\": {}}}",
                              check.has_value() ? check->Json() : "null");
    return loom::OkStatus();
  });
}

LOOM_EXPORT int loom_fingerprint_trace(const char* path) {
  return Guarded([&]() -> Status {
    LOOM_RETURN_IF_ERROR(NeedArgument(path, "trace path"));
    LOOM_ASSIGN_OR_RETURN(loom::plan::Trace trace, loom::plan::ReadTrace(path));
    last_result =
        loom::plan::FingerprintJson(loom::plan::FingerprintRequests(trace));
    return loom::OkStatus();
  });
}

LOOM_EXPORT const char* loom_last_result(void) { return last_result.c_str(); }

LOOM_EXPORT loom_trace* loom_trace_new(int device,
                                       unsigned long long granularity,
                                       const char* provenance) {
  std::unique_ptr<loom_trace> made;
  Guarded([&]() -> Status {
    auto trace = std::make_unique<loom_trace>();
    trace->trace.header.device = device;
    trace->trace.header.granularity = granularity;
    trace->trace.header.provenance = provenance != nullptr ? provenance : "";
    LOOM_RETURN_IF_ERROR(
        loom::plan::TraceChecker::CheckHeader(trace->trace.header));
    made = std::move(trace);
    return loom::OkStatus();
  });
  return made.release();
}

LOOM_EXPORT int loom_trace_read(const char* path, loom_trace** out) {
  return Guarded([&]() -> Status {
    LOOM_RETURN_IF_ERROR(NeedArgument(path, "trace path"));
    LOOM_RETURN_IF_ERROR(NeedArgument(out, "output"));
    *out = nullptr;
    LOOM_ASSIGN_OR_RETURN(std::unique_ptr<loom::plan::TraceReader> reader,
                          loom::plan::OpenTraceReader(path));
    auto trace = std::make_unique<loom_trace>();
    LOOM_ASSIGN_OR_RETURN(trace->trace, loom::plan::ReadTraceFrom(*reader));
    // The checker of a handle that was read: the same state as if its events
    // had been appended, so more can be appended and checked.
    for (const std::string& name : trace->trace.names) {
      LOOM_RETURN_IF_ERROR(trace->checker.AddName(name));
    }
    for (const Event& event : trace->trace.events) {
      LOOM_RETURN_IF_ERROR(trace->checker.CheckEvent(event));
    }
    *out = trace.release();
    return loom::OkStatus();
  });
}

LOOM_EXPORT void loom_trace_free(loom_trace* trace) { delete trace; }

LOOM_EXPORT int loom_trace_header(const loom_trace* trace, int* device,
                                  unsigned long long* granularity) {
  return Guarded([&]() -> Status {
    LOOM_RETURN_IF_ERROR(NeedArgument(trace, "trace"));
    if (device != nullptr) *device = trace->trace.header.device;
    if (granularity != nullptr) *granularity = trace->trace.header.granularity;
    return loom::OkStatus();
  });
}

LOOM_EXPORT const char* loom_trace_provenance(const loom_trace* trace) {
  return trace == nullptr ? nullptr : trace->trace.header.provenance.c_str();
}

LOOM_EXPORT long long loom_trace_name_count(const loom_trace* trace) {
  return trace == nullptr ? -1
                          : static_cast<long long>(trace->trace.names.size());
}

LOOM_EXPORT const char* loom_trace_name(const loom_trace* trace,
                                        long long index) {
  if (trace == nullptr || index < 0 ||
      static_cast<size_t>(index) >= trace->trace.names.size()) {
    return nullptr;
  }
  return trace->trace.names[static_cast<size_t>(index)].c_str();
}

LOOM_EXPORT long long loom_trace_intern_name(loom_trace* trace,
                                             const char* name) {
  long long index = -1;
  Guarded([&]() -> Status {
    LOOM_RETURN_IF_ERROR(NeedArgument(trace, "trace"));
    LOOM_RETURN_IF_ERROR(NeedArgument(name, "name"));
    if (std::optional<uint32_t> found = trace->checker.FindName(name)) {
      index = *found;
      return loom::OkStatus();
    }
    LOOM_RETURN_IF_ERROR(trace->checker.AddName(name));
    trace->trace.names.emplace_back(name);
    index = static_cast<long long>(trace->trace.names.size() - 1);
    return loom::OkStatus();
  });
  return index;
}

LOOM_EXPORT long long loom_trace_event_count(const loom_trace* trace) {
  return trace == nullptr ? -1
                          : static_cast<long long>(trace->trace.events.size());
}

LOOM_EXPORT int loom_trace_get_events(const loom_trace* trace,
                                      long long first, long long count,
                                      unsigned long long* out) {
  return Guarded([&]() -> Status {
    LOOM_RETURN_IF_ERROR(NeedArgument(trace, "trace"));
    const auto size = static_cast<long long>(trace->trace.events.size());
    if (first < 0 || count < 0 || first > size || count > size - first) {
      return loom::OutOfRangeError("events [{}, {}) of a trace of {}", first,
                                   first + count, size);
    }
    if (count > 0) LOOM_RETURN_IF_ERROR(NeedArgument(out, "output"));
    for (long long i = 0; i < count; ++i) {
      const Event& e = trace->trace.events[static_cast<size_t>(first + i)];
      unsigned long long* r = out + i * LOOM_TRACE_FIELDS;
      r[0] = static_cast<unsigned long long>(e.kind);
      r[1] = e.flags;
      r[2] = static_cast<unsigned long long>(e.device);
      r[3] = e.name;
      r[4] = e.id;
      r[5] = e.size;
      r[6] = e.stream;
    }
    return loom::OkStatus();
  });
}

LOOM_EXPORT int loom_trace_add_events(loom_trace* trace,
                                      const unsigned long long* records,
                                      long long count) {
  return Guarded([&]() -> Status {
    LOOM_RETURN_IF_ERROR(NeedArgument(trace, "trace"));
    if (count < 0) return loom::InvalidArgumentError("count {}", count);
    if (count > 0) LOOM_RETURN_IF_ERROR(NeedArgument(records, "records"));
    loom::plan::TraceChecker checker = trace->checker;  // all or nothing
    std::vector<Event> events;
    events.reserve(static_cast<size_t>(count));
    const size_t base = trace->trace.events.size();
    for (long long i = 0; i < count; ++i) {
      StatusOr<Event> event = DecodeRecord(records + i * LOOM_TRACE_FIELDS);
      Status status =
          event.ok() ? checker.CheckEvent(*event) : event.status();
      if (!status.ok()) {
        return status.WithContext(
            fmt::format("event {}", base + static_cast<size_t>(i)));
      }
      events.push_back(*event);
    }
    trace->checker = std::move(checker);
    trace->trace.events.insert(trace->trace.events.end(), events.begin(),
                               events.end());
    return loom::OkStatus();
  });
}

LOOM_EXPORT int loom_trace_write(const loom_trace* trace, const char* path) {
  return Guarded([&]() -> Status {
    LOOM_RETURN_IF_ERROR(NeedArgument(trace, "trace"));
    LOOM_RETURN_IF_ERROR(NeedArgument(path, "path"));
    return loom::plan::WriteTrace(path, trace->trace, FormatForPath(path));
  });
}

}  // extern "C"
