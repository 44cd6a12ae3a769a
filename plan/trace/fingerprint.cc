#include "plan/trace/fingerprint.h"

#include <fmt/format.h>

#include <unordered_map>
#include <vector>

#include "base/json.h"
#include "base/sha256.h"

namespace loom::plan {
namespace {

struct Part {
  Sha256 hash;
  uint64_t allocs = 0;
  uint64_t frees = 0;
};

bool IsIterationMarker(EventKind kind) {
  return kind == EventKind::kIterationBegin || kind == EventKind::kIterationEnd;
}

}  // namespace

RequestFingerprint FingerprintRequests(const Trace& trace) {
  const std::vector<Event>& events = trace.events;
  const int64_t count = static_cast<int64_t>(events.size());
  // The steady part: scanning backwards, the last iter_begin followed (before
  // the next iteration marker) by an allocation and closed by a marker.
  int64_t steady_start = -1, steady_end = -1;
  int64_t end = -1;           // the iteration marker closing the candidate
  bool allocates = false;     // an alloc lies between the candidate and `end`
  for (int64_t i = count - 1; i >= 0; --i) {
    const EventKind kind = events[i].kind;
    if (kind == EventKind::kIterationBegin && end >= 0 && allocates) {
      steady_start = i;
      steady_end = end;
      break;
    }
    if (IsIterationMarker(kind)) {
      end = i;
      allocates = false;
    } else if (kind == EventKind::kAlloc) {
      allocates = true;
    }
  }

  Part prologue, steady;
  std::unordered_map<uint64_t, uint64_t> stream_order = {{0, 0}};
  std::unordered_map<uint64_t, uint64_t> ordinal_of;  // request id -> ordinal
  std::vector<bool> dynamic_stack;
  uint64_t counted = 0, iterations = 0;
  auto stream_index = [&](uint64_t stream) {
    return stream_order.try_emplace(stream, stream_order.size()).first->second;
  };
  for (int64_t i = 0; i < count; ++i) {
    const Event& event = events[i];
    if (event.kind == EventKind::kIterationBegin) ++iterations;
    if (steady_end >= 0 && i > steady_end) continue;
    Part& part =
        steady_start >= 0 && i >= steady_start && i <= steady_end ? steady
                                                                  : prologue;
    switch (event.kind) {
      case EventKind::kModuleEnter:
        dynamic_stack.push_back((event.flags & kDynamicModule) != 0 ||
                                (!dynamic_stack.empty() && dynamic_stack.back()));
        break;
      case EventKind::kModuleExit:
        if (!dynamic_stack.empty()) dynamic_stack.pop_back();
        break;
      case EventKind::kIterationBegin:
        part.hash.Update("ib;");
        break;
      case EventKind::kIterationEnd:
        part.hash.Update("ie;");
        break;
      case EventKind::kAlloc: {
        if (!dynamic_stack.empty() && dynamic_stack.back()) break;
        const uint64_t stream = stream_index(event.stream);
        ordinal_of[event.id] = counted++;
        ++part.allocs;
        part.hash.Update(fmt::format("a{},{};", event.size, stream));
        break;
      }
      case EventKind::kFree: {
        auto it = ordinal_of.find(event.id);
        if (it == ordinal_of.end()) break;  // the free of a dynamic request
        const uint64_t age = counted - it->second;
        ordinal_of.erase(it);
        const uint64_t stream = stream_index(event.stream);
        ++part.frees;
        part.hash.Update(fmt::format("f{},{};", age, stream));
        break;
      }
      case EventKind::kPhase:
        break;
    }
  }
  RequestFingerprint out;
  out.prologue = prologue.hash.HexDigest();
  out.steady = steady.hash.HexDigest();
  out.prologue_allocs = prologue.allocs;
  out.steady_allocs = steady.allocs;
  out.steady_frees = steady.frees;
  out.iterations = iterations;
  out.events = static_cast<uint64_t>(count);
  out.has_steady = steady_start >= 0;
  return out;
}

std::string FingerprintJson(const RequestFingerprint& fingerprint) {
  JsonWriter w;
  w.BeginObject();
  w.Key("version").Int(fingerprint.version);
  w.Key("prologue").String(fingerprint.prologue);
  w.Key("steady").String(fingerprint.steady);
  w.Key("prologue_allocs").Uint(fingerprint.prologue_allocs);
  w.Key("steady_allocs").Uint(fingerprint.steady_allocs);
  w.Key("steady_frees").Uint(fingerprint.steady_frees);
  w.Key("iterations").Uint(fingerprint.iterations);
  w.Key("events").Uint(fingerprint.events);
  w.Key("has_steady").Bool(fingerprint.has_steady);
  w.EndObject();
  return w.str();
}

}  // namespace loom::plan
