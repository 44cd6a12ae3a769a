// `loom_tool plan`: plans a trace or an instance through plan/'s entry point
// (plan/make_plan.h), which also checks the plan with the independent
// verifier; writes the plan file and/or an offsets CSV and reports peak,
// lower bound, granules and time. Given a plan file instead of
// an instance it prints the plan (show mode).
#include <charconv>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "base/flags.h"
#include "base/json.h"
#include "base/text.h"
#include "cli/commands.h"
#include "plan/make_plan.h"
#include "plan/planfile/plan_file.h"
#include "plan/solver/minimalloc_csv.h"
#include "plan/trace/trace_io.h"
#include "whatif/loom/plan_check.h"
#include "whatif/workloads/load.h"

namespace loom::cli {
namespace {

bool ParseInt(std::string_view text, int64_t* out) {
  auto [ptr, ec] =
      std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && ptr == text.data() + text.size() && !text.empty();
}

// "--windows 100:200:moe0,300:350": half-open time windows, optional names.
StatusOr<std::vector<plan::TimeWindow>> ParseWindows(std::string_view text) {
  std::vector<plan::TimeWindow> out;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t comma = text.find(',', begin);
    if (comma == std::string_view::npos) comma = text.size();
    const std::string_view item = text.substr(begin, comma - begin);
    begin = comma + 1;
    const size_t colon = item.find(':');
    const size_t second =
        colon == std::string_view::npos ? colon : item.find(':', colon + 1);
    plan::TimeWindow window;
    if (colon == std::string_view::npos ||
        !ParseInt(item.substr(0, colon), &window.start) ||
        !ParseInt(item.substr(colon + 1, second == std::string_view::npos
                                             ? std::string_view::npos
                                             : second - colon - 1),
                  &window.end)) {
      return InvalidArgumentError("--windows: '{}' is not start:end[:name]",
                                  item);
    }
    if (second != std::string_view::npos) {
      window.name = std::string(item.substr(second + 1));
    }
    out.push_back(window);
  }
  return out;
}

void PrintShow(const plan::PlanFile& plan, const std::string& path, bool json,
               int64_t max_buffers) {
  // The check made when the plan was (section CHEK), if it was.
  const StatusOr<std::optional<whatif::PlanCheck>> check =
      whatif::RecordedPlanCheck(plan, path);
  if (!json) {
    std::fputs(
        plan::FormatPlanText(plan, static_cast<size_t>(max_buffers)).c_str(),
        stdout);
    std::printf("check         %s\n",
                !check.ok()          ? check.status().ToString().c_str()
                : check->has_value() ? (*check)->Summary().c_str()
                                     : "none recorded (made without the "
                                       "check, or not from a trace)");
    return;
  }
  JsonWriter w(2);
  w.BeginObject();
  w.Key("source").String(plan.source);
  w.Key("algorithm").String(plan.algorithm);
  w.Key("buffers").Uint(plan.buffers.size());
  w.Key("peak_bytes").Uint(plan.peak_bytes);
  w.Key("lower_bound_bytes").Uint(plan.lower_bound_bytes);
  w.Key("peak_granules").Uint(plan.peak_granules);
  w.Key("granule_bytes").Uint(plan.granule_bytes);
  w.Key("region_bytes").Uint(plan.region_size);
  w.Key("period").Int(plan.period);
  w.Key("seconds").Double(plan.seconds);
  w.Key("optimal").Bool(plan.optimal);
  w.Key("dynamic_windows").Uint(plan.dynamic_spaces.size());
  if (!check.ok()) {
    w.Key("check_error").String(check.status().ToString());
  } else if (check->has_value()) {
    w.Key("check").Raw((*check)->Json());
  } else {
    w.Key("check").Null();
  }
  w.EndObject();
  std::printf("%s\n", w.str().c_str());
}

}  // namespace

int RunPlan(const Args& raw_args) {
  // `-o PATH` is accepted as a short form of --output.
  Args args;
  for (const std::string& arg : raw_args) {
    args.push_back(arg == "-o" ? "--output" : arg);
  }
  std::string input, output, offsets_path, algorithm = "auto", windows_text;
  // round/align 0: 512 for traces (a GPU tensor's address must be aligned),
  // 1 for CSV instances.
  // granule 0: the trace's recorded granularity, else 2 MiB (MakePlanOptions).
  uint64_t capacity = 0, round = 0, align = 0, granule = 0;
  double time_limit = 10;
  int64_t period = 0, seed = 1, show_buffers = 20;
  bool json = false, minimize = true, dump = false, persistent = true;
  bool check_plan = true;
  std::string scope = "auto";
  std::string source;
  int64_t steady_iteration = -1;
  FlagParser flags(
      "plan", "<instance.csv | plan> [options]",
      "Plans a MiniMalloc CSV instance or a loom trace (its steady-state "
      "iteration, as a cyclic instance, with the request table the runtime "
      "needs): one offset per buffer such that "
      "buffers live at the same time never share a byte, with the lowest peak "
      "found within the time limit (best fit, STAlloc memory layers, "
      "lowest-first, an exact search for small hard instances, local search). "
      "The plan is checked by the independent verifier. Given a plan file it "
      "prints it.");
  flags.AddPositional("input", &input,
                      "instance (CSV), trace, builtin:<name>, or plan file");
  flags.AddString("output", &output, "write the plan file here (also -o)");
  flags.AddString("offsets", &offsets_path,
                  "write id,lower,upper,size,offset CSV here");
  flags.AddSize("capacity", &capacity,
                "the plan must fit in this many bytes (exit 1 if it cannot)");
  flags.AddDouble("time-limit", &time_limit, "seconds to search (default 10)");
  flags.AddBool("json", &json, "print JSON instead of a table");
  flags.AddBool("check", &check_plan,
                "replay a trace with and without its plan on loom's run-time "
                "allocator (fake driver) and say whether the plan earns its "
                "place: auto mode does not serve one that holds more there "
                "(default on; --no-check skips the two replays)");
  flags.AddString("algorithm", &algorithm,
                  "auto, best-fit, lowest-first, layers, exact, local-search");
  flags.AddSize(
      "round", &round,
      "round sizes up to a multiple (default: 512 for traces, 1 for CSV)");
  flags.AddSize(
      "align", &align,
      "align offsets to a power of two (default: 512 for traces, 1 for CSV)");
  flags.AddSize("granule", &granule,
                "granule for physical accounting (default: the granularity "
                "the trace was recorded at, else 2MiB)");
  flags.AddBool("minimize", &minimize,
                "keep lowering the peak after a fitting plan (default on)");
  flags.AddInt("period", &period,
               "cyclic plan: the instance is one iteration of this length");
  flags.AddString("windows", &windows_text,
                  "dynamic windows start:end[:name],... : store the idle "
                  "static space of each in the plan");
  flags.AddBool("dump", &dump, "print the plan in text form");
  flags.AddInt("show-buffers", &show_buffers,
               "buffers listed by the text form (0: all; default 20)");
  flags.AddInt("seed", &seed, "local search seed");
  flags.AddString("scope", &scope,
                  "traces: auto (steady iteration if the trace has iteration "
                  "markers, else the whole trace), iteration, or trace");
  flags.AddInt("steady-iteration", &steady_iteration,
               "traces, scope iteration: which iteration (default: the "
               "analysis's choice)");
  flags.AddBool("persistent", &persistent,
                "traces: plan tensors allocated before the steady state that "
                "stay live (default on; off when they already live elsewhere)");
  flags.AddString("source", &source,
                  "the input's name recorded in the plan file (default: the "
                  "input as given; the front end passes a snapshot's path "
                  "for the temporary trace it plans)");
  if (std::optional<int> exit = flags.Parse(args)) return *exit;
  auto fail = [](const Status& status) {
    std::fprintf(stderr, "loom plan: %s\n", status.message().c_str());
    return 1;
  };

  // Show mode.
  {
    std::FILE* file = std::fopen(input.c_str(), "rb");
    char magic[8] = {};
    const size_t got = file ? std::fread(magic, 1, sizeof(magic), file) : 0;
    if (file) std::fclose(file);
    if (got == sizeof(magic) &&
        plan::LooksLikePlanFile(std::string_view(magic, sizeof(magic)))) {
      StatusOr<plan::PlanFile> plan = plan::ReadPlanFile(input);
      if (!plan.ok()) return fail(plan.status());
      PrintShow(*plan, input, json, show_buffers);
      return 0;
    }
  }

  plan::MakePlanOptions options;
  StatusOr<plan::PlanScope> parsed_scope = plan::ParsePlanScope(scope);
  if (!parsed_scope.ok()) return fail(parsed_scope.status());
  options.scope = *parsed_scope;
  options.steady_iteration = static_cast<int32_t>(steady_iteration);
  options.include_persistent = persistent;
  StatusOr<plan::Algorithm> parsed = plan::ParseAlgorithm(algorithm);
  if (!parsed.ok()) return fail(parsed.status());
  options.algorithm = *parsed;
  StatusOr<std::vector<plan::TimeWindow>> windows = ParseWindows(windows_text);
  if (!windows.ok()) return fail(windows.status());
  options.windows = *std::move(windows);
  options.time_limit_seconds = time_limit;
  options.capacity = capacity;
  options.minimize = minimize;
  options.size_round = round;
  options.min_alignment = align;
  options.granule_bytes = granule;
  options.period = period;
  options.seed = static_cast<uint64_t>(seed);
  options.progress = true;
  options.source = source;
  // A builtin workload is generated; files are read by plan/'s entry point.
  StatusOr<plan::MadePlan> made = plan::MadePlan{};
  std::optional<plan::Trace> generated;  // a builtin workload's trace
  if (input.starts_with("builtin:")) {
    StatusOr<whatif::Workload> workload = whatif::LoadWorkload(input);
    if (!workload.ok()) return fail(workload.status());
    if (options.source.empty()) options.source = input;
    generated = std::move(workload->trace);
    made = plan::MakePlan(*generated, options);
  } else {
    made = plan::MakePlanFromFile(input, options);
  }
  if (!made.ok()) return fail(made.status());
  const plan::PlanFile& file = made->file;
  // A trace (not a CSV instance): the plan replayed on it, as auto mode
  // does before installing it (whatif/loom/plan_check.h); a check that
  // cannot run is reported and costs the plan nothing.
  std::optional<StatusOr<whatif::PlanCheck>> check;
  if (check_plan && made->requests.has_value()) {
    StatusOr<plan::Trace> trace = generated.has_value()
                                      ? StatusOr<plan::Trace>(*generated)
                                      : plan::ReadTrace(input);
    check = trace.ok()
                ? whatif::CheckPlanOnRecording(*trace, file, file.granule_bytes)
                : StatusOr<whatif::PlanCheck>(trace.status());
    // The verdict travels with the plan (section CHEK): plan mode serves a
    // plan that does not earn its place only when told to.
    if (check->ok()) whatif::RecordPlanCheck(**check, made->file);
  }
  const plan::PlanResult& result = made->result;
  const plan::Verdict& verdict = made->verdict;

  if (!output.empty()) {
    Status written = plan::WritePlanFile(output, file);
    if (!written.ok()) return fail(written);
  }
  if (!offsets_path.empty()) {
    Status written =
        plan::WriteMinimallocCsv(offsets_path, made->instance, result.offsets);
    if (!written.ok()) return fail(written);
  }
  if (json) {
    std::string report = plan::MadePlanJson(*made, options, 2);
    if (check.has_value()) report = whatif::WithPlanCheck(report, *check);
    std::printf("%s\n", report.c_str());
  } else {
    const double ratio =
        result.lower_bound_bytes == 0
            ? 1.0
            : static_cast<double>(result.peak_bytes) /
                  static_cast<double>(result.lower_bound_bytes);
    std::printf("input        %s (%zu buffers%s)\n", input.c_str(),
                made->instance.buffers.size(),
                made->instance.period > 0
                    ? fmt::format(", period {}", made->instance.period).c_str()
                    : "");
    if (!made->note.empty()) {
      std::printf("derived      %s\n", made->note.c_str());
    }
    std::printf("lower bound  %llu bytes (%s)\n",
                static_cast<unsigned long long>(result.lower_bound_bytes),
                FormatBytes(result.lower_bound_bytes).c_str());
    std::printf("peak         %llu bytes (%s) = %.6f x lower bound%s\n",
                static_cast<unsigned long long>(result.peak_bytes),
                FormatBytes(result.peak_bytes).c_str(), ratio,
                result.optimal ? ", optimal" : "");
    std::printf("granules     %llu x %s touched at the peak\n",
                static_cast<unsigned long long>(result.peak_granules),
                FormatBytes(file.granule_bytes).c_str());
    std::printf("algorithm    %s\n", result.algorithm.c_str());
    std::printf("seconds      %.3f (plan found after %.3f)\n", result.seconds,
                result.seconds_to_best);
    std::printf("valid        %s\n", verdict.valid()
                                         ? "yes (independent verifier)"
                                         : verdict.message.c_str());
    if (capacity != 0) {
      std::printf("capacity     %llu bytes: %s\n",
                  static_cast<unsigned long long>(capacity),
                  result.fits ? "fits"
                  : result.capacity_infeasible
                      ? "does not fit (proved impossible)"
                      : "does not fit (none found in the time limit)");
    }
    for (const plan::ReusableSpace& s : file.dynamic_spaces) {
      std::printf(
          "window       [%lld, %lld) %s: %s idle, %llu whole granules\n",
          static_cast<long long>(s.window.start),
          static_cast<long long>(s.window.end),
          s.window.name.empty() ? "-" : s.window.name.c_str(),
          FormatBytes(s.bytes()).c_str(),
          static_cast<unsigned long long>(s.granule_count(file.granule_bytes)));
    }
    if (check.has_value()) {
      const std::string line =
          check->ok() ? (*check)->Summary()
                      : "could not run: " + check->status().ToString();
      std::printf("check        %s\n", line.c_str());
    }
    if (!output.empty()) std::printf("plan file    %s\n", output.c_str());
  }
  if (dump) {
    std::fputs(
        plan::FormatPlanText(file, static_cast<size_t>(show_buffers)).c_str(),
        stdout);
  }
  if (!verdict.valid()) {
    std::fprintf(stderr, "loom plan: the plan is invalid: %s\n",
                 verdict.message.c_str());
    return 1;
  }
  if (!result.fits) {
    std::fprintf(stderr,
                 "loom plan: does not fit in %llu bytes (best peak %llu)\n",
                 static_cast<unsigned long long>(capacity),
                 static_cast<unsigned long long>(result.peak_bytes));
    return 1;
  }
  return 0;
}

}  // namespace loom::cli
