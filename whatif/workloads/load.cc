#include "whatif/workloads/load.h"

#include <algorithm>
#include <cctype>
#include <tuple>

#include "whatif/workloads/transformer.h"
#include "plan/solver/minimalloc_csv.h"
#include "plan/trace/trace_io.h"
#include "plan/analysis/workload.h"

namespace loom::whatif {
namespace {

constexpr std::string_view kBuiltinPrefix = "builtin:";

bool EndsWithCsv(std::string_view path) {
  if (path.size() < 4) return false;
  std::string tail(path.substr(path.size() - 4));
  std::transform(tail.begin(), tail.end(), tail.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return tail == ".csv";
}

StatusOr<TransformerConfig> BuiltinConfig(std::string_view name) {
  if (name == "moe") return MoeConfig();
  if (name == "dense") return DenseConfig();
  if (name == "moe_dropless") return MoeDroplessConfig();
  if (name == "moe_capacity") return MoeCapacityConfig();
  if (name == "varlen") return VarlenConfig();
  if (name == "eval") return EvalConfig();
  if (name == "moe_comm") {
    TransformerConfig config = MoeConfig();
    config.name = "moe_comm";
    config.comm_stream = true;
    return config;
  }
  std::string known;
  for (const std::string& n : BuiltinWorkloadNames()) {
    known += (known.empty() ? "" : ", ") + n;
  }
  return InvalidArgumentError("unknown builtin workload '{}' (known: {})", name,
                              known);
}

StatusOr<plan::Trace> LoadBuiltin(std::string_view spec) {
  std::string_view rest = spec.substr(kBuiltinPrefix.size());
  size_t colon = rest.find(':');
  std::string_view name = rest.substr(0, colon);
  LOOM_ASSIGN_OR_RETURN(TransformerConfig config, BuiltinConfig(name));
  if (colon != std::string_view::npos) {
    std::string_view options = rest.substr(colon + 1);
    while (!options.empty()) {
      size_t comma = options.find(',');
      std::string_view item = options.substr(0, comma);
      size_t eq = item.find('=');
      if (eq == std::string_view::npos || eq == 0) {
        return InvalidArgumentError("'{}': option '{}' is not key=value", spec,
                                    item);
      }
      Status status =
          SetTransformerOption(config, item.substr(0, eq), item.substr(eq + 1));
      if (!status.ok()) return status.WithContext(spec);
      if (comma == std::string_view::npos) break;
      options.remove_prefix(comma + 1);
    }
  }
  StatusOr<plan::Trace> trace = GenerateTransformerTrace(config);
  if (!trace.ok()) return trace.status().WithContext(spec);
  return trace;
}

}  // namespace

std::vector<std::string> BuiltinWorkloadNames() {
  return {"moe",          "dense",  "moe_comm", "moe_dropless",
          "moe_capacity", "varlen", "eval"};
}

StatusOr<Workload> LoadWorkload(std::string_view spec) {
  Workload workload;
  workload.name = std::string(spec);
  if (spec.substr(0, kBuiltinPrefix.size()) == kBuiltinPrefix) {
    LOOM_ASSIGN_OR_RETURN(workload.trace, LoadBuiltin(spec));
    return workload;
  }
  if (EndsWithCsv(spec)) {
    std::string path(spec);
    LOOM_ASSIGN_OR_RETURN(plan::CsvInstance csv, plan::ReadMinimallocCsv(path));
    Status valid = plan::ValidateInstance(csv.instance);
    if (!valid.ok()) return valid.WithContext(path);
    workload.trace = plan::TraceFromInstance(csv.instance);
    workload.trace.header.provenance =
        "MiniMalloc CSV " + path + " (alloc at lower, free at upper)";
    return workload;
  }
  // A loom trace, text or binary.
  LOOM_ASSIGN_OR_RETURN(workload.trace, plan::ReadTrace(std::string(spec)));
  return workload;
}

}  // namespace loom::whatif
