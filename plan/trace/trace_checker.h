// TraceChecker: the streaming validity rules shared by every trace reader and
// writer (pure C++).
//
// Both file forms (text and binary) accept exactly the same set of traces, so
// that converting between them never fails and is lossless. This class is
// that set's definition: it sees the header, each name definition and each
// event in order, and keeps only what the rules need (the live request ids,
// the open module stack, the open iteration, the name table), i.e. memory
// proportional to the live set, never to the trace length.
//
// Rules (beyond trace.h's ValidateTrace):
//  - header: device in -1..32767, granularity <= 2^50, provenance <= 64 KiB;
//  - names: unique, at most 4096 bytes each, at most 2^20 of them;
//  - alloc: 0 < size <= 2^50, id not live; free: id live;
//  - alloc/free device in 0..32767;
//  - phase/module events name an existing entry; module exits match the
//    innermost open module; at most 4096 modules open;
//  - `iter_end N` closes the open iteration N (an `iter_begin` may also
//    simply follow another one: begin-only markers are allowed);
//  - fields a kind does not use are 0 (`flags` only carries kDynamicModule on
//    module_enter), so every accepted event has one exact encoding.
// Messages carry no location: readers prefix file and line/offset.
#ifndef LOOM_PLAN_TRACE_TRACE_CHECKER_H_
#define LOOM_PLAN_TRACE_TRACE_CHECKER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/status.h"
#include "plan/trace/trace.h"

namespace loom::plan {

inline constexpr uint64_t kMaxRequestSize = uint64_t{1} << 50;
inline constexpr uint64_t kMaxGranularity = uint64_t{1} << 50;
inline constexpr size_t kMaxProvenanceBytes = size_t{1} << 16;
inline constexpr size_t kMaxNameBytes = 4096;
inline constexpr size_t kMaxNames = size_t{1} << 20;
inline constexpr size_t kMaxModuleDepth = 4096;
inline constexpr int kMaxDevice = 32767;

class TraceChecker {
 public:
  // Hash for heterogeneous lookup of names by string_view.
  struct NameHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const {
      return std::hash<std::string_view>{}(s);
    }
  };

  static Status CheckHeader(const TraceHeader& header);

  // Appends `name` to the name table.
  Status AddName(std::string_view name);
  // Index of `name` in the table, if there.
  std::optional<uint32_t> FindName(std::string_view name) const;
  const std::vector<std::string>& names() const { return names_; }

  // Checks `event` against the rules and the state so far, then applies it.
  // On error the state is unchanged.
  Status CheckEvent(const Event& event);

  uint64_t events() const { return events_; }
  size_t live_requests() const { return live_.size(); }

 private:
  Status CheckName(const Event& event) const;

  std::vector<std::string> names_;
  std::unordered_map<std::string, uint32_t, NameHash, std::equal_to<>>
      name_index_;
  std::unordered_set<uint64_t> live_;
  std::vector<uint32_t> modules_;
  std::optional<uint64_t> open_iteration_;
  uint64_t events_ = 0;
};

}  // namespace loom::plan

#endif  // LOOM_PLAN_TRACE_TRACE_CHECKER_H_
