#include "vmm/plan_loader.h"

#include <algorithm>
#include <cstdint>

#include "plan/planfile/request_table.h"

namespace loom::vmm {

StatusOr<RuntimePlan> ToRuntimePlan(const plan::PlanFile& file,
                                    std::string_view source,
                                    uint64_t granularity) {
  LOOM_CHECK(granularity != 0 && (granularity & (granularity - 1)) == 0);
  LOOM_ASSIGN_OR_RETURN(std::optional<plan::RequestTable> table,
                        plan::DecodeRequestTable(file, source));
  if (!table.has_value()) {
    return FailedPreconditionError(
        "{}: the plan has no request table: it was made from a bare instance "
        "(CSV), not from a trace, so the runtime cannot tell which request is "
        "which; plan a recorded trace instead",
        source);
  }
  RuntimePlan plan;
  if (file.region_size > (uint64_t{1} << 50)) {
    return OutOfRangeError("{}: region of {} bytes", source, file.region_size);
  }
  plan.region_bytes =
      (file.region_size + granularity - 1) / granularity * granularity;
  if (plan.region_bytes == 0) plan.region_bytes = granularity;
  plan.period = file.period;
  plan.prologue_iterations = table->prologue_iterations;
  auto convert = [&](const std::vector<plan::RequestRef>& refs,
                     std::vector<PlannedRequest>& out) {
    out.reserve(refs.size());
    for (const plan::RequestRef& r : refs) {
      PlannedRequest p;
      p.size = r.size;
      p.offset = r.buffer >= 0
                     ? static_cast<int64_t>(file.buffers[r.buffer].offset)
                     : kUnplanned;
      p.start = r.start;
      p.end = r.end;
      out.push_back(p);
    }
  };
  convert(table->prologue, plan.prologue);
  convert(table->iteration, plan.iteration);
  for (const plan::ReusableSpace& space : file.dynamic_spaces) {
    DynamicWindow window;
    window.module = space.window.name;
    window.start = space.window.start;
    window.end = space.window.end;
    for (const plan::AddressRange& range : space.ranges) {
      uint64_t first = (range.lo + granularity - 1) / granularity;
      uint64_t stop = range.hi / granularity;  // exclusive
      for (uint64_t k = first; k < stop && k * granularity < plan.region_bytes;
           ++k) {
        window.idle_granules.push_back(static_cast<uint32_t>(k));
      }
    }
    plan.windows.push_back(std::move(window));
  }
  // The windows' request slots (DREQ), by name; a window the plan's DYNS
  // does not list (none was computed) spans its requests.
  for (const plan::DynamicSequence& seq : table->dynamic) {
    auto it = std::find_if(
        plan.windows.begin(), plan.windows.end(),
        [&](const DynamicWindow& w) { return w.module == seq.window; });
    if (it == plan.windows.end()) {
      DynamicWindow window;
      window.module = seq.window;
      window.start = INT64_MAX;
      for (const plan::RequestRef& r : seq.steady.requests) {
        window.start = std::min(window.start, r.start);
        window.end = std::max(window.end, r.end);
      }
      if (seq.steady.requests.empty()) window.start = 0;
      plan.windows.push_back(std::move(window));
      it = std::prev(plan.windows.end());
    }
    auto convert_window = [&](const plan::WindowRequests& from,
                              WindowRequests& to) {
      convert(from.requests, to.requests);
      to.calls = from.calls;
    };
    convert_window(seq.steady, it->steady);
    for (const plan::WindowRequests& early : seq.early)
      convert_window(early, it->early.emplace_back());
  }
  return plan;
}

StatusOr<RuntimePlan> ReadRuntimePlan(const std::string& path,
                                      uint64_t granularity) {
  LOOM_ASSIGN_OR_RETURN(plan::PlanFile file, plan::ReadPlanFile(path));
  return ToRuntimePlan(file, path, granularity);
}

}  // namespace loom::vmm
