// `loom_tool verify`: checks a plan file or an offsets CSV against an
// instance with the independent verifier (plan/solver/verifier.h). Exit 0 when
// valid, 1 when invalid (the first violation is named) or unreadable.
#include <cstdio>
#include <string>
#include <vector>

#include "base/flags.h"
#include "base/json.h"
#include "cli/commands.h"
#include "plan/instance_input.h"
#include "plan/planfile/plan_file.h"
#include "plan/solver/minimalloc_csv.h"
#include "plan/solver/verifier.h"

namespace loom::cli {
namespace {

struct Checked {
  std::vector<uint64_t> offsets;
  plan::VerifyOptions options;
  std::string kind;      // "plan" or "offsets"
  std::string mismatch;  // the plan/CSV describes other buffers
  bool fingerprint_match = true;
};

// Offsets CSVs carry no alignment: compare ids, lifetimes and sizes.
Status SameCsvBuffers(const plan::Instance& csv, const plan::Instance& inst) {
  if (csv.buffers.size() != inst.buffers.size()) {
    return InvalidArgumentError(
        "the offsets file has {} buffers, the instance {}", csv.buffers.size(),
        inst.buffers.size());
  }
  for (size_t i = 0; i < csv.buffers.size(); ++i) {
    const plan::Buffer& a = csv.buffers[i];
    const plan::Buffer& b = inst.buffers[i];
    if (a.id != b.id || a.start != b.start || a.end != b.end ||
        a.size != b.size) {
      return InvalidArgumentError(
          "buffer {}: the offsets file has id {} [{}, {}) size {}, the "
          "instance "
          "id {} [{}, {}) size {}",
          i, a.id, a.start, a.end, a.size, b.id, b.start, b.end, b.size);
    }
  }
  return OkStatus();
}

// True when `path` starts with a plan file's magic (false if unreadable).
bool IsPlanFile(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  char magic[8] = {};
  const size_t got = file ? std::fread(magic, 1, sizeof(magic), file) : 0;
  if (file) std::fclose(file);
  return got == sizeof(magic) &&
         plan::LooksLikePlanFile(std::string_view(magic, sizeof(magic)));
}

}  // namespace

int RunVerify(const Args& args) {
  std::string solution_path, instance_path;
  uint64_t capacity = 0, round = 1, align = 1;
  int64_t period = 0;
  bool json = false;
  FlagParser flags(
      "verify", "<plan | offsets.csv> <trace | instance.csv> [options]",
      "Checks offsets against an instance with the independent verifier: "
      "every buffer placed, aligned, inside the capacity (or the plan's "
      "region), and no two buffers with intersecting lifetimes (cyclic when "
      "the plan or --period says so) sharing a byte. Exit 0 valid, 1 invalid.");
  flags.AddPositional("solution", &solution_path,
                      "plan file, or CSV with an offset column");
  flags.AddPositional("instance", &instance_path,
                      "the trace or instance (CSV) planned");
  flags.AddBool("json", &json, "print JSON instead of text");
  flags.AddSize("capacity", &capacity,
                "bytes every buffer must fit in (default: the plan's region)");
  flags.AddSize("round", &round, "offsets CSV: sizes were rounded up to this");
  flags.AddSize("align", &align, "offsets CSV: offsets aligned to this");
  flags.AddInt("period", &period,
               "offsets CSV: the instance is cyclic with this period");
  if (std::optional<int> exit = flags.Parse(args)) return *exit;
  auto fail = [](const Status& status) {
    std::fprintf(stderr, "loom verify: %s\n", status.message().c_str());
    return 1;
  };
  // The plan comes first: name the right order when it came second.
  const bool solution_is_plan = IsPlanFile(solution_path);
  if (!solution_is_plan && IsPlanFile(instance_path)) {
    std::fprintf(stderr,
                 "loom verify: %s is a plan file and %s is not: the plan "
                 "comes first (loom verify %s %s)\n",
                 instance_path.c_str(), solution_path.c_str(),
                 instance_path.c_str(), solution_path.c_str());
    return 2;
  }

  StatusOr<plan::InstanceInput> loaded = plan::ReadInstanceInput(instance_path);
  if (!loaded.ok()) return fail(loaded.status());
  plan::Instance& instance = loaded->instance;
  instance.period = period;

  Checked checked;
  if (solution_is_plan) {
    StatusOr<plan::PlanFile> plan = plan::ReadPlanFile(solution_path);
    if (!plan.ok()) return fail(plan.status());
    checked.kind = "plan";
    if (period == 0) instance.period = plan->period;
    checked.fingerprint_match =
        plan->fingerprint == plan::InstanceFingerprint(instance);
    Status same = plan::CheckSameBuffers(plan::PlanAsInstance(*plan), instance);
    if (!same.ok()) checked.mismatch = same.message();
    checked.offsets = plan::PlanOffsets(*plan);
    checked.options.capacity = capacity != 0 ? capacity : plan->region_size;
    checked.options.size_round = plan->size_round;
    checked.options.min_alignment = plan->min_alignment;
  } else {
    StatusOr<plan::CsvInstance> csv = plan::ReadMinimallocCsv(solution_path);
    if (!csv.ok()) return fail(csv.status());
    if (csv->offsets.empty()) {
      return fail(InvalidArgumentError("{}: no offset column", solution_path));
    }
    checked.kind = "offsets";
    Status same = SameCsvBuffers(csv->instance, instance);
    if (!same.ok()) checked.mismatch = same.message();
    checked.offsets = std::move(csv->offsets);
    checked.options.capacity = capacity;
    checked.options.size_round = round;
    checked.options.min_alignment = align;
  }
  if (checked.options.min_alignment == 0 ||
      (checked.options.min_alignment & (checked.options.min_alignment - 1)) !=
          0) {
    return fail(InvalidArgumentError("--align {} is not a power of two",
                                     checked.options.min_alignment));
  }
  if (checked.options.size_round == 0) {
    return fail(InvalidArgumentError("--round must be positive"));
  }
  if (Status valid = plan::ValidateInstance(instance); !valid.ok()) {
    return fail(valid.WithContext(instance_path));
  }
  plan::Verdict verdict;
  if (checked.mismatch.empty()) {
    verdict = plan::VerifyPlacement(instance, checked.offsets, checked.options);
  }
  const bool valid = checked.mismatch.empty() && verdict.valid();
  const std::string violation =
      !checked.mismatch.empty() ? checked.mismatch : verdict.message;
  if (json) {
    JsonWriter w(2);
    w.BeginObject();
    w.Key("valid").Bool(valid);
    w.Key("kind").String(checked.kind);
    w.Key("buffers").Uint(instance.buffers.size());
    w.Key("peak_bytes").Uint(verdict.peak_bytes);
    w.Key("capacity").Uint(checked.options.capacity);
    w.Key("period").Int(instance.period);
    w.Key("fingerprint_match").Bool(checked.fingerprint_match);
    if (valid) {
      w.Key("violation").Null();
    } else {
      w.Key("violation").String(violation);
    }
    w.EndObject();
    std::printf("%s\n", w.str().c_str());
  } else if (valid) {
    std::printf(
        "valid: %zu buffers, peak %llu bytes%s%s\n", instance.buffers.size(),
        static_cast<unsigned long long>(verdict.peak_bytes),
        checked.options.capacity != 0
            ? fmt::format(" (capacity {})", checked.options.capacity).c_str()
            : "",
        checked.fingerprint_match
            ? ""
            : "; note: the plan's instance fingerprint differs");
  } else {
    std::printf("invalid: %s\n", violation.c_str());
  }
  return valid ? 0 : 1;
}

}  // namespace loom::cli
