#include "whatif/loom/plan_source.h"

#include <fmt/format.h>

#include <charconv>

#include "base/text.h"
#include "whatif/workloads/load.h"

namespace loom::whatif {

StatusOr<PlanSource> ParsePlanSource(std::string_view text) {
  PlanSource source;
  text = TrimBlanks(text);
  if (text.empty()) return InvalidArgumentError("--plan-from: empty");
  if (text == "self") return source;
  if (text.starts_with("first:")) {
    const std::string_view k = text.substr(6);
    int64_t iterations = 0;
    auto [ptr, ec] = std::from_chars(k.data(), k.data() + k.size(), iterations);
    if (ec != std::errc() || ptr != k.data() + k.size() || iterations < 1) {
      return InvalidArgumentError(
          "--plan-from {}: first:K needs K >= 1 iterations",
          QuotedForMessage(text, 64));
    }
    source.kind = PlanSource::Kind::kFirstIterations;
    source.iterations = iterations;
    return source;
  }
  source.kind = PlanSource::Kind::kWorkload;
  source.spec = std::string(text);
  return source;
}

uint64_t CountIterations(const plan::Trace& trace) {
  uint64_t n = 0;
  for (const plan::Event& e : trace.events) {
    n += e.kind == plan::EventKind::kIterationBegin;
  }
  return n;
}

PlanSource DefaultPlanSource(uint64_t iterations) {
  PlanSource source;
  if (iterations >= 2) {
    source.kind = PlanSource::Kind::kFirstIterations;
    source.iterations =
        static_cast<int64_t>(std::min<uint64_t>(3, iterations - 1));
  }
  return source;
}

StatusOr<plan::Trace> PlanningTrace(const PlanSource& source,
                                    const plan::Trace& input) {
  switch (source.kind) {
    case PlanSource::Kind::kSelf:
      return input;
    case PlanSource::Kind::kWorkload: {
      StatusOr<Workload> other = LoadWorkload(source.spec);
      if (!other.ok()) return other.status().WithContext("--plan-from");
      return std::move(other->trace);
    }
    case PlanSource::Kind::kFirstIterations:
      break;
  }
  // Everything before the (K+1)-th iteration begins: the set-up and K
  // iterations, as recorded before a switch to the plan.
  int64_t begins = 0;
  plan::Trace out;
  out.header = input.header;
  out.names = input.names;
  for (const plan::Event& e : input.events) {
    if (e.kind == plan::EventKind::kIterationBegin &&
        ++begins > source.iterations) {
      return out;
    }
    out.events.push_back(e);
  }
  return InvalidArgumentError(
      "--plan-from first:{}: the input has only {} iterations (plan from "
      "fewer, so that loom is measured on iterations it did not plan from)",
      source.iterations, begins);
}

std::string DescribePlanSource(const PlanSource& source, bool perturbed) {
  switch (source.kind) {
    case PlanSource::Kind::kSelf:
      return perturbed ? "the input before perturbation" : "own trace (oracle)";
    case PlanSource::Kind::kFirstIterations:
      return source.iterations == 1
                 ? std::string("first iteration")
                 : fmt::format("first {} iterations", source.iterations);
    case PlanSource::Kind::kWorkload:
      return source.spec;
  }
  return "";
}

}  // namespace loom::whatif
