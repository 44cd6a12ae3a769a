// The trace model: what loom records of a training run (pure C++).
//
// A trace is one time-ordered list of events: allocations, frees and markers
// (iteration begin/end, phase, module enter/exit). The index of an event in
// the list is its time; markers take a time step like any other event.
// Readers and writers of the binary and text forms live in trace_io.h; this
// header only defines the in-memory model.
//
// Invariants of a well-formed trace (checked by ValidateTrace):
//  - every Free names a request id that is live (allocated, not yet freed);
//  - request ids are never reused while live;
//  - phase and module events name an entry of `names`;
//  - module enter/exit events nest properly.
// A request may stay live at the end of the trace (never freed).
#ifndef LOOM_PLAN_TRACE_TRACE_H_
#define LOOM_PLAN_TRACE_TRACE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"

namespace loom::plan {

enum class EventKind : uint8_t {
  kAlloc = 1,           // request `id` of `size` bytes on `stream`
  kFree = 2,            // request `id` freed, issued on `stream`
  kIterationBegin = 3,  // iteration number `id` starts
  kIterationEnd = 4,    // iteration number `id` ends
  kPhase = 5,           // the run enters phase `names[name]` (forward, ...)
  kModuleEnter = 6,     // module `names[name]` starts (flags: kDynamicModule)
  kModuleExit = 7,      // module `names[name]` ends
};

// Short lower-case name of a kind ("alloc", "free", "iter_begin", ...).
std::string_view EventKindName(EventKind kind);

// Event::flags bits.
inline constexpr uint8_t kDynamicModule = 1;  // on kModuleEnter: sizes vary

struct Event {
  EventKind kind = EventKind::kAlloc;
  uint8_t flags = 0;    // see kDynamicModule
  int16_t device = 0;   // CUDA device ordinal of alloc/free
  uint32_t name = 0;    // phase/module events: index into Trace::names
  uint64_t id = 0;      // alloc/free: request id; iteration events: number
  uint64_t size = 0;    // alloc: requested bytes (> 0)
  uint64_t stream = 0;  // alloc/free: stream handle value, 0 = default

  static Event Alloc(uint64_t id, uint64_t size, uint64_t stream = 0,
                     int16_t device = 0);
  static Event Free(uint64_t id, uint64_t stream = 0, int16_t device = 0);
  static Event IterationBegin(uint64_t iteration);
  static Event IterationEnd(uint64_t iteration);
  static Event Phase(uint32_t name);
  static Event ModuleEnter(uint32_t name, bool dynamic = false);
  static Event ModuleExit(uint32_t name);

  friend bool operator==(const Event&, const Event&) = default;
};

// Well-known phase names.
inline constexpr std::string_view kPhaseForward = "forward";
inline constexpr std::string_view kPhaseBackward = "backward";
inline constexpr std::string_view kPhaseOptimizer = "optimizer";
inline constexpr std::string_view kPhaseEval = "eval";

struct TraceHeader {
  int32_t device = 0;        // device recorded, -1 when several
  uint64_t granularity = 0;  // allocation granularity in bytes, 0 = unknown
  std::string provenance;    // free text: recorder, source file, date
  friend bool operator==(const TraceHeader&, const TraceHeader&) = default;
};

// A whole trace held in memory. Large traces can also be processed as a
// stream (trace_io.h) without materialising this.
struct Trace {
  TraceHeader header;
  std::vector<std::string> names;  // referenced by Event::name
  std::vector<Event> events;       // in time order

  // Returns the index of `name` in `names`, appending it if new.
  uint32_t InternName(std::string_view name);

  // Convenience appenders that intern names.
  void AddAlloc(uint64_t id, uint64_t size, uint64_t stream = 0);
  void AddFree(uint64_t id, uint64_t stream = 0);
  void AddPhase(std::string_view phase);
  void AddModuleEnter(std::string_view module, bool dynamic = false);
  void AddModuleExit(std::string_view module);
  void AddIterationBegin(uint64_t iteration);
  void AddIterationEnd(uint64_t iteration);

  friend bool operator==(const Trace&, const Trace&) = default;
};

// Checks the invariants listed at the top of this file. The error names the
// first offending event index.
Status ValidateTrace(const Trace& trace);

}  // namespace loom::plan

#endif  // LOOM_PLAN_TRACE_TRACE_H_
