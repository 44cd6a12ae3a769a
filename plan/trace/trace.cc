#include "plan/trace/trace.h"

#include <unordered_set>

namespace loom::plan {

std::string_view EventKindName(EventKind kind) {
  switch (kind) {
    case EventKind::kAlloc:
      return "alloc";
    case EventKind::kFree:
      return "free";
    case EventKind::kIterationBegin:
      return "iter_begin";
    case EventKind::kIterationEnd:
      return "iter_end";
    case EventKind::kPhase:
      return "phase";
    case EventKind::kModuleEnter:
      return "module_enter";
    case EventKind::kModuleExit:
      return "module_exit";
  }
  return "unknown";
}

Event Event::Alloc(uint64_t id, uint64_t size, uint64_t stream,
                   int16_t device) {
  Event e;
  e.kind = EventKind::kAlloc;
  e.id = id;
  e.size = size;
  e.stream = stream;
  e.device = device;
  return e;
}

Event Event::Free(uint64_t id, uint64_t stream, int16_t device) {
  Event e;
  e.kind = EventKind::kFree;
  e.id = id;
  e.stream = stream;
  e.device = device;
  return e;
}

Event Event::IterationBegin(uint64_t iteration) {
  Event e;
  e.kind = EventKind::kIterationBegin;
  e.id = iteration;
  return e;
}

Event Event::IterationEnd(uint64_t iteration) {
  Event e;
  e.kind = EventKind::kIterationEnd;
  e.id = iteration;
  return e;
}

Event Event::Phase(uint32_t name) {
  Event e;
  e.kind = EventKind::kPhase;
  e.name = name;
  return e;
}

Event Event::ModuleEnter(uint32_t name, bool dynamic) {
  Event e;
  e.kind = EventKind::kModuleEnter;
  e.name = name;
  e.flags = dynamic ? kDynamicModule : 0;
  return e;
}

Event Event::ModuleExit(uint32_t name) {
  Event e;
  e.kind = EventKind::kModuleExit;
  e.name = name;
  return e;
}

uint32_t Trace::InternName(std::string_view name) {
  for (uint32_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return i;
  }
  names.emplace_back(name);
  return static_cast<uint32_t>(names.size() - 1);
}

void Trace::AddAlloc(uint64_t id, uint64_t size, uint64_t stream) {
  events.push_back(Event::Alloc(id, size, stream));
}
void Trace::AddFree(uint64_t id, uint64_t stream) {
  events.push_back(Event::Free(id, stream));
}
void Trace::AddPhase(std::string_view phase) {
  events.push_back(Event::Phase(InternName(phase)));
}
void Trace::AddModuleEnter(std::string_view module, bool dynamic) {
  events.push_back(Event::ModuleEnter(InternName(module), dynamic));
}
void Trace::AddModuleExit(std::string_view module) {
  events.push_back(Event::ModuleExit(InternName(module)));
}
void Trace::AddIterationBegin(uint64_t iteration) {
  events.push_back(Event::IterationBegin(iteration));
}
void Trace::AddIterationEnd(uint64_t iteration) {
  events.push_back(Event::IterationEnd(iteration));
}

Status ValidateTrace(const Trace& trace) {
  std::unordered_set<uint64_t> live;
  std::vector<uint32_t> modules;
  for (size_t t = 0; t < trace.events.size(); ++t) {
    const Event& e = trace.events[t];
    switch (e.kind) {
      case EventKind::kAlloc:
        if (e.size == 0) {
          return InvalidArgumentError(
              "event {}: alloc of request {} has size 0", t, e.id);
        }
        if (!live.insert(e.id).second) {
          return InvalidArgumentError(
              "event {}: request {} allocated while still live", t, e.id);
        }
        break;
      case EventKind::kFree:
        if (live.erase(e.id) == 0) {
          return InvalidArgumentError(
              "event {}: free of request {} which is not live", t, e.id);
        }
        break;
      case EventKind::kIterationBegin:
      case EventKind::kIterationEnd:
        break;
      case EventKind::kPhase:
      case EventKind::kModuleEnter:
      case EventKind::kModuleExit:
        if (e.name >= trace.names.size()) {
          return InvalidArgumentError(
              "event {}: name index {} outside the name table ({} names)", t,
              e.name, trace.names.size());
        }
        if (e.kind == EventKind::kModuleEnter) modules.push_back(e.name);
        if (e.kind == EventKind::kModuleExit) {
          if (modules.empty() || modules.back() != e.name) {
            return InvalidArgumentError(
                "event {}: exit of module '{}' does not match the innermost "
                "open module",
                t, trace.names[e.name]);
          }
          modules.pop_back();
        }
        break;
      default:
        return InvalidArgumentError("event {}: unknown event kind {}", t,
                                    static_cast<int>(e.kind));
    }
  }
  return OkStatus();
}

}  // namespace loom::plan
