#include "plan/instance_input.h"

#include <cerrno>
#include <fstream>
#include <sstream>

#include "base/text.h"
#include "plan/solver/minimalloc_csv.h"
#include "plan/trace/trace_binary.h"
#include "plan/trace/trace_io.h"

namespace loom::plan {
namespace {

// A text trace: its first line that is neither blank nor a comment is the
// magic line.
bool LooksLikeTextTrace(std::string_view bytes) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t end = bytes.find('\n', pos);
    std::string_view line = bytes.substr(
        pos, end == std::string_view::npos ? bytes.npos : end - pos);
    size_t first = line.find_first_not_of(" \t\r");
    if (first != std::string_view::npos && line[first] != '#') {
      return line.substr(first).starts_with("loom-trace");
    }
    if (end == std::string_view::npos) break;
    pos = end + 1;
  }
  return false;
}

}  // namespace

StatusOr<InstanceInput> ReadInstanceInput(const std::string& path,
                                          const InstanceInputOptions& options) {
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return NotFoundError("{}: cannot open file: {}", path, OsErrorText(errno));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return DataLossError("{}: read error", path);
  const std::string bytes = text.str();
  if (bytes.starts_with("LOOMPLAN")) {
    return InvalidArgumentError(
        "{}: is a loom plan file, not an instance (MiniMalloc CSV)", path);
  }
  if (bytes.starts_with(kBinaryTraceMagic) || LooksLikeTextTrace(bytes)) {
    LOOM_ASSIGN_OR_RETURN(Trace trace, ParseTrace(bytes, path));
    PlanningProblemOptions problem_options;
    problem_options.scope = options.scope;
    problem_options.steady_iteration = options.steady_iteration;
    problem_options.include_persistent = options.include_persistent;
    StatusOr<PlanningProblem> problem =
        BuildPlanningProblem(trace, problem_options);
    if (!problem.ok()) return problem.status().WithContext(path);
    InstanceInput input;
    input.note = std::move(problem->note);
    input.steady_iteration = problem->steady_iteration;
    input.instance = std::move(problem->instance);
    input.group = std::move(problem->phase_group);
    input.requests = std::move(problem->requests);
    input.windows = std::move(problem->windows);
    input.granularity = trace.header.granularity;
    return input;
  }
  LOOM_ASSIGN_OR_RETURN(CsvInstance csv, ParseMinimallocCsv(bytes, path));
  InstanceInput input;
  input.instance = std::move(csv.instance);
  input.offsets = std::move(csv.offsets);
  return input;
}

}  // namespace loom::plan
