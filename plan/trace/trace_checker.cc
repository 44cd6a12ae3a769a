#include "plan/trace/trace_checker.h"

#include "base/text.h"

namespace loom::plan {
namespace {

// Quoted for messages; long or odd names are shortened and escaped.
std::string Shown(std::string_view name) { return QuotedForMessage(name, 64); }

}  // namespace

Status TraceChecker::CheckHeader(const TraceHeader& header) {
  if (header.device < -1 || header.device > kMaxDevice) {
    return OutOfRangeError("header device {} outside -1..{}", header.device,
                           kMaxDevice);
  }
  if (header.granularity > kMaxGranularity) {
    return OutOfRangeError("granularity {} above the limit 2^50",
                           header.granularity);
  }
  if (header.provenance.size() > kMaxProvenanceBytes) {
    return OutOfRangeError("provenance of {} bytes above the limit {}",
                           header.provenance.size(), kMaxProvenanceBytes);
  }
  return OkStatus();
}

Status TraceChecker::AddName(std::string_view name) {
  if (name.size() > kMaxNameBytes) {
    return OutOfRangeError("name of {} bytes above the limit {}", name.size(),
                           kMaxNameBytes);
  }
  if (names_.size() >= kMaxNames) {
    return OutOfRangeError("more than {} names", kMaxNames);
  }
  auto [it, inserted] = name_index_.emplace(
      std::string(name), static_cast<uint32_t>(names_.size()));
  if (!inserted) {
    return InvalidArgumentError("name {} defined twice", Shown(name));
  }
  names_.emplace_back(name);
  return OkStatus();
}

std::optional<uint32_t> TraceChecker::FindName(std::string_view name) const {
  auto it = name_index_.find(name);
  if (it == name_index_.end()) return std::nullopt;
  return it->second;
}

Status TraceChecker::CheckName(const Event& event) const {
  if (event.name >= names_.size()) {
    return OutOfRangeError(
        "{}: name index {} outside the name table ({} names)",
        EventKindName(event.kind), event.name, names_.size());
  }
  return OkStatus();
}

Status TraceChecker::CheckEvent(const Event& e) {
  auto unused = [&](bool flags, bool device, bool name, bool id, bool size,
                    bool stream) -> Status {
    const char* field = nullptr;
    if (!flags && e.flags != 0) field = "flags";
    if (!device && e.device != 0) field = "device";
    if (!name && e.name != 0) field = "name";
    if (!id && e.id != 0) field = "id";
    if (!size && e.size != 0) field = "size";
    if (!stream && e.stream != 0) field = "stream";
    if (field != nullptr) {
      return InvalidArgumentError("{} event with a non-zero '{}' field",
                                  EventKindName(e.kind), field);
    }
    return OkStatus();
  };
  auto check_device = [&]() -> Status {
    if (e.device < 0) {
      return OutOfRangeError("{} of request {} on device {} outside 0..{}",
                             EventKindName(e.kind), e.id, e.device, kMaxDevice);
    }
    return OkStatus();
  };
  switch (e.kind) {
    case EventKind::kAlloc:
      LOOM_RETURN_IF_ERROR(unused(false, true, false, true, true, true));
      LOOM_RETURN_IF_ERROR(check_device());
      if (e.size == 0) {
        return InvalidArgumentError("alloc of request {} has size 0", e.id);
      }
      if (e.size > kMaxRequestSize) {
        return OutOfRangeError("alloc of request {} has size {} above 2^50",
                               e.id, e.size);
      }
      if (!live_.insert(e.id).second) {
        return InvalidArgumentError("alloc of request {} which is already live",
                                    e.id);
      }
      break;
    case EventKind::kFree:
      LOOM_RETURN_IF_ERROR(unused(false, true, false, true, false, true));
      LOOM_RETURN_IF_ERROR(check_device());
      if (live_.erase(e.id) == 0) {
        return InvalidArgumentError("free of request {} which is not live",
                                    e.id);
      }
      break;
    case EventKind::kIterationBegin:
      LOOM_RETURN_IF_ERROR(unused(false, false, false, true, false, false));
      open_iteration_ = e.id;
      break;
    case EventKind::kIterationEnd:
      LOOM_RETURN_IF_ERROR(unused(false, false, false, true, false, false));
      if (!open_iteration_.has_value()) {
        return InvalidArgumentError(
            "end of iteration {} with no open iteration", e.id);
      }
      if (*open_iteration_ != e.id) {
        return InvalidArgumentError(
            "end of iteration {} while iteration {} is open", e.id,
            *open_iteration_);
      }
      open_iteration_.reset();
      break;
    case EventKind::kPhase:
      LOOM_RETURN_IF_ERROR(unused(false, false, true, false, false, false));
      LOOM_RETURN_IF_ERROR(CheckName(e));
      break;
    case EventKind::kModuleEnter:
      LOOM_RETURN_IF_ERROR(unused(true, false, true, false, false, false));
      if ((e.flags & ~kDynamicModule) != 0) {
        return InvalidArgumentError("module_enter with unknown flags {:#x}",
                                    e.flags);
      }
      LOOM_RETURN_IF_ERROR(CheckName(e));
      if (modules_.size() >= kMaxModuleDepth) {
        return OutOfRangeError("more than {} nested modules", kMaxModuleDepth);
      }
      modules_.push_back(e.name);
      break;
    case EventKind::kModuleExit:
      LOOM_RETURN_IF_ERROR(unused(false, false, true, false, false, false));
      LOOM_RETURN_IF_ERROR(CheckName(e));
      if (modules_.empty()) {
        return InvalidArgumentError("exit of module {} with no open module",
                                    Shown(names_[e.name]));
      }
      if (modules_.back() != e.name) {
        return InvalidArgumentError(
            "exit of module {} while module {} is the innermost open one",
            Shown(names_[e.name]), Shown(names_[modules_.back()]));
      }
      modules_.pop_back();
      break;
    default:
      return InvalidArgumentError("unknown event kind {}",
                                  static_cast<int>(e.kind));
  }
  ++events_;
  return OkStatus();
}

}  // namespace loom::plan
