#include "plan/make_plan.h"

#include <algorithm>
#include <charconv>
#include <utility>

#include "base/json.h"
#include "base/text.h"
#include "plan/instance_input.h"
#include "plan/planfile/make_plan_file.h"

namespace loom::plan {
namespace {

// For a cyclic plan, the buffers that live the whole period (persistent:
// weights, optimizer state) go first, packed at the bottom of the region in
// id order, and everything else is planned above them. No peak is lost (a
// persistent buffer is live all the time, so the lower bound is their sum
// plus the rest's), and the layout above them is a region of its own: a
// plan variant made later for another shape of iteration starts there too
// and shares those granules (vmm/allocator.h).
StatusOr<PlanResult> PlanPersistentFirst(const Instance& instance,
                                         const PlannerOptions& planner) {
  if (instance.period <= 0) return PlanInstance(instance, planner);
  auto round = [](uint64_t v, uint64_t m) { return (v + m - 1) / m * m; };
  const uint64_t unit = std::max<uint64_t>(planner.size_round, 1);
  std::vector<size_t> persistent, rest;
  for (size_t i = 0; i < instance.buffers.size(); ++i) {
    const Buffer& b = instance.buffers[i];
    (b.end - b.start >= instance.period ? persistent : rest).push_back(i);
  }
  if (persistent.empty() || rest.empty()) {
    return PlanInstance(instance, planner);
  }
  std::vector<uint64_t> offsets(instance.buffers.size(), 0);
  uint64_t bottom = 0;
  for (size_t i : persistent) {
    const Buffer& b = instance.buffers[i];
    const uint64_t align =
        std::max({b.alignment, planner.min_alignment, uint64_t{1}});
    bottom = round(bottom, align);
    offsets[i] = bottom;
    bottom += round(b.size, unit);
  }
  Instance above = instance;
  above.buffers.clear();
  PlannerOptions rest_options = planner;
  rest_options.group.clear();
  if (planner.capacity != 0) {
    rest_options.capacity = planner.capacity > bottom ? planner.capacity - bottom
                                                      : 1;
  }
  for (size_t i : rest) {
    above.buffers.push_back(instance.buffers[i]);
    if (!planner.group.empty()) rest_options.group.push_back(planner.group[i]);
  }
  // Offsets above the bottom keep the alignment every buffer needs.
  uint64_t base_align = std::max<uint64_t>(planner.min_alignment, 1);
  for (size_t i : rest) {
    base_align = std::max(base_align, instance.buffers[i].alignment);
  }
  bottom = round(bottom, base_align);
  LOOM_ASSIGN_OR_RETURN(PlanResult result, PlanInstance(above, rest_options));
  for (size_t k = 0; k < rest.size(); ++k) {
    offsets[rest[k]] = bottom + result.offsets[k];
  }
  std::vector<uint64_t> sizes(instance.buffers.size(), 0);
  for (size_t i : persistent) sizes[i] = round(instance.buffers[i].size, unit);
  for (size_t k = 0; k < rest.size(); ++k) sizes[rest[k]] = result.sizes[k];
  result.offsets = std::move(offsets);
  result.sizes = std::move(sizes);
  result.peak_bytes += bottom;
  result.lower_bound_bytes += bottom;
  Instance reserved = instance;
  for (size_t i = 0; i < reserved.buffers.size(); ++i) {
    reserved.buffers[i].size = result.sizes[i];
  }
  result.peak_granules =
      PeakGranules(reserved, result.offsets, planner.granule_bytes);
  result.fits = planner.capacity == 0 || result.peak_bytes <= planner.capacity;
  result.algorithm = "persistent-first+" + result.algorithm;
  return result;
}

StatusOr<MadePlan> Solve(Instance instance, std::vector<uint32_t> group,
                         std::optional<RequestTable> requests,
                         std::vector<TimeWindow> windows,
                         const MakePlanOptions& options,
                         uint64_t recorded_granularity) {
  const uint64_t unit = requests.has_value() ? 512 : 1;
  PlannerOptions planner;
  planner.algorithm = options.algorithm;
  planner.time_limit_seconds = options.time_limit_seconds;
  planner.capacity = options.capacity;
  planner.minimize = options.minimize;
  planner.size_round = options.size_round != 0 ? options.size_round : unit;
  planner.min_alignment =
      options.min_alignment != 0 ? options.min_alignment : unit;
  planner.granule_bytes =
      ResolveGranule(options.granule_bytes, recorded_granularity);
  planner.group = std::move(group);
  planner.seed = options.seed;
  planner.progress = options.progress;
  MadePlan made;
  LOOM_ASSIGN_OR_RETURN(
      made.result, requests.has_value() ? PlanPersistentFirst(instance, planner)
                                        : PlanInstance(instance, planner));
  windows.insert(windows.begin(), options.windows.begin(),
                 options.windows.end());
  StatusOr<PlanFile> file = MakePlanFile(
      instance, made.result, planner,
      options.source.empty() ? std::string("trace") : options.source, windows);
  if (!file.ok()) return file.status().WithContext("dynamic windows");
  made.file = *std::move(file);
  if (requests.has_value()) {
    for (PlanSection& section : EncodeRequestTable(*requests))
      made.file.extra.push_back(std::move(section));
  }
  // The planner verified its plan already; this check is the report's. A
  // plan over the capacity is reported as not fitting, not as invalid.
  VerifyOptions verify;
  verify.capacity = options.capacity != 0 && made.result.fits
                        ? options.capacity
                        : made.file.region_size;
  verify.size_round = planner.size_round;
  verify.min_alignment = planner.min_alignment;
  made.verdict = VerifyPlacement(instance, made.result.offsets, verify);
  made.instance = std::move(instance);
  made.requests = std::move(requests);
  return made;
}

Status ParseBool(std::string_view key, std::string_view value, bool* out) {
  if (value == "1" || value == "true") {
    *out = true;
  } else if (value == "0" || value == "false") {
    *out = false;
  } else {
    return InvalidArgumentError("plan option {}: {} is not 0/1/true/false",
                                key, QuotedForMessage(value, 64));
  }
  return OkStatus();
}

template <typename T>
Status ParseNumber(std::string_view key, std::string_view value, T* out) {
  T parsed{};
  auto [ptr, ec] =
      std::from_chars(value.data(), value.data() + value.size(), parsed);
  if (ec != std::errc() || ptr != value.data() + value.size() ||
      value.empty()) {
    return InvalidArgumentError("plan option {}: {} is not a number", key,
                                QuotedForMessage(value, 64));
  }
  *out = parsed;
  return OkStatus();
}

Status ApplyOption(std::string_view key, std::string_view value,
                   MakePlanOptions* o) {
  if (key == "algorithm") {
    LOOM_ASSIGN_OR_RETURN(o->algorithm, ParseAlgorithm(value));
  } else if (key == "time_limit") {
    LOOM_RETURN_IF_ERROR(ParseNumber(key, value, &o->time_limit_seconds));
    if (!(o->time_limit_seconds > 0)) {
      return InvalidArgumentError("plan option time_limit must be positive");
    }
  } else if (key == "capacity") {
    LOOM_RETURN_IF_ERROR(ParseNumber(key, value, &o->capacity));
  } else if (key == "minimize") {
    LOOM_RETURN_IF_ERROR(ParseBool(key, value, &o->minimize));
  } else if (key == "round") {
    LOOM_RETURN_IF_ERROR(ParseNumber(key, value, &o->size_round));
  } else if (key == "align") {
    LOOM_RETURN_IF_ERROR(ParseNumber(key, value, &o->min_alignment));
  } else if (key == "granule") {
    LOOM_RETURN_IF_ERROR(ParseNumber(key, value, &o->granule_bytes));
    if (o->granule_bytes == 0) {
      return InvalidArgumentError("plan option granule must be positive");
    }
  } else if (key == "seed") {
    LOOM_RETURN_IF_ERROR(ParseNumber(key, value, &o->seed));
  } else if (key == "period") {
    LOOM_RETURN_IF_ERROR(ParseNumber(key, value, &o->period));
  } else if (key == "scope") {
    LOOM_ASSIGN_OR_RETURN(o->scope, ParsePlanScope(value));
  } else if (key == "steady_iteration") {
    LOOM_RETURN_IF_ERROR(ParseNumber(key, value, &o->steady_iteration));
  } else if (key == "persistent") {
    LOOM_RETURN_IF_ERROR(ParseBool(key, value, &o->include_persistent));
  } else if (key == "source") {
    o->source = std::string(value);
  } else {
    return InvalidArgumentError(
        "unknown plan option {} (algorithm, time_limit, capacity, minimize, "
        "round, align, granule, seed, period, scope, steady_iteration, "
        "persistent, source)",
        QuotedForMessage(key, 64));
  }
  return OkStatus();
}

}  // namespace

Status ParseMakePlanOptions(std::string_view settings,
                            MakePlanOptions* options) {
  MakePlanOptions parsed = *options;
  size_t begin = 0;
  while (begin <= settings.size()) {
    size_t end = settings.find_first_of(";\n", begin);
    if (end == std::string_view::npos) end = settings.size();
    const std::string_view item = TrimBlanks(settings.substr(begin, end - begin));
    begin = end + 1;
    if (item.empty()) continue;
    const size_t equals = item.find('=');
    if (equals == std::string_view::npos) {
      return InvalidArgumentError("plan option {} is not key=value",
                                  QuotedForMessage(item, 64));
    }
    LOOM_RETURN_IF_ERROR(ApplyOption(TrimBlanks(item.substr(0, equals)),
                                     TrimBlanks(item.substr(equals + 1)),
                                     &parsed));
  }
  *options = std::move(parsed);
  return OkStatus();
}

StatusOr<MadePlan> MakePlan(const Trace& trace,
                            const MakePlanOptions& options) {
  PlanningProblemOptions problem_options;
  problem_options.scope = options.scope;
  problem_options.steady_iteration = options.steady_iteration;
  problem_options.include_persistent = options.include_persistent;
  LOOM_ASSIGN_OR_RETURN(PlanningProblem problem,
                        BuildPlanningProblem(trace, problem_options));
  const int32_t steady = problem.steady_iteration;
  std::string note = std::move(problem.note);
  LOOM_ASSIGN_OR_RETURN(
      MadePlan made,
      Solve(std::move(problem.instance), std::move(problem.phase_group),
            std::move(problem.requests), std::move(problem.windows), options,
            trace.header.granularity));
  made.steady_iteration = steady;
  made.note = std::move(note);
  return made;
}

StatusOr<MadePlan> MakePlan(const Instance& instance,
                            const MakePlanOptions& options) {
  Instance copy = instance;
  copy.period = options.period;
  return Solve(std::move(copy), {}, std::nullopt, {}, options,
               /*recorded_granularity=*/0);
}

StatusOr<MadePlan> MakePlanFromFile(const std::string& path,
                                    const MakePlanOptions& options) {
  InstanceInputOptions input_options;
  input_options.scope = options.scope;
  input_options.steady_iteration = options.steady_iteration;
  input_options.include_persistent = options.include_persistent;
  LOOM_ASSIGN_OR_RETURN(InstanceInput input,
                        ReadInstanceInput(path, input_options));
  MakePlanOptions with_source = options;
  if (with_source.source.empty()) with_source.source = path;
  if (!input.requests.has_value()) input.instance.period = options.period;
  StatusOr<MadePlan> made =
      Solve(std::move(input.instance), std::move(input.group),
            std::move(input.requests), std::move(input.windows), with_source,
            input.granularity);
  if (!made.ok()) return made.status().WithContext(path);
  made->note = std::move(input.note);
  made->steady_iteration = input.steady_iteration;
  return made;
}

std::string MadePlanJson(const MadePlan& made, const MakePlanOptions& options,
                         int indent) {
  const PlanResult& result = made.result;
  const PlanFile& file = made.file;
  const double ratio = result.lower_bound_bytes == 0
                           ? 1.0
                           : static_cast<double>(result.peak_bytes) /
                                 static_cast<double>(result.lower_bound_bytes);
  JsonWriter w(indent);
  w.BeginObject();
  w.Key("input").String(file.source);
  if (!made.note.empty()) w.Key("derived").String(made.note);
  if (made.requests.has_value()) {
    w.Key("requests").Uint(made.requests->prologue.size() +
                           made.requests->iteration.size());
    w.Key("steady_iteration").Int(made.steady_iteration);
  }
  w.Key("buffers").Uint(made.instance.buffers.size());
  w.Key("peak_bytes").Uint(result.peak_bytes);
  w.Key("lower_bound_bytes").Uint(result.lower_bound_bytes);
  w.Key("ratio").Double(ratio);
  w.Key("peak_granules").Uint(result.peak_granules);
  w.Key("granule_bytes").Uint(file.granule_bytes);
  w.Key("region_bytes").Uint(file.region_size);
  w.Key("seconds").Double(result.seconds);
  w.Key("seconds_to_best").Double(result.seconds_to_best);
  w.Key("valid").Bool(made.verdict.valid());
  if (!made.verdict.valid()) w.Key("invalid").String(made.verdict.message);
  w.Key("algorithm").String(result.algorithm);
  w.Key("optimal").Bool(result.optimal);
  w.Key("capacity").Uint(options.capacity);
  w.Key("fits").Bool(result.fits);
  w.Key("capacity_infeasible").Bool(result.capacity_infeasible);
  w.Key("attempts").BeginArray();
  for (const Attempt& a : result.attempts) {
    w.BeginObject();
    w.Key("algorithm").String(a.algorithm);
    w.Key("peak_bytes").Uint(a.peak_bytes);
    w.Key("seconds").Double(a.seconds);
    if (!a.note.empty()) w.Key("note").String(a.note);
    w.EndObject();
  }
  w.EndArray();
  if (!file.dynamic_spaces.empty()) {
    w.Key("dynamic_windows").BeginArray();
    for (const ReusableSpace& s : file.dynamic_spaces) {
      w.BeginObject();
      w.Key("start").Int(s.window.start);
      w.Key("end").Int(s.window.end);
      w.Key("name").String(s.window.name);
      w.Key("idle_bytes").Uint(s.bytes());
      w.Key("idle_granules").Uint(s.granule_count(file.granule_bytes));
      w.EndObject();
    }
    w.EndArray();
  }
  w.EndObject();
  return w.str();
}

}  // namespace loom::plan
