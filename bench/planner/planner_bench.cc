// The planner benchmark: loom's planner next to plain size-descending best
// fit, measured in the same run, on the repository's instances and the
// synthetic training iterations. Prints a Markdown table (results in
// bench/results/planner.md).
//
//   bazel run -c opt //bench/planner:planner_bench -- [--suite=all]
//       [--time-limit=S] [--instance=path.csv]...
//
// Suites and their budgets (the targets of the planner's issue):
//   challenging  MiniMalloc A-F, capacity 1,048,576, 10 s each (minimising)
//   snapshots    the three PyTorch snapshot instances, 10 s each
//   idealloc     G_1, S_1, resnet50, 30 s each
//   synthetic    300,000-buffer training iteration and its cyclic variant,
//                10 s each
// --time-limit overrides every budget; --instance adds CSVs (10 s).
// --gap-index instead times GapIndex best fit against the quadratic scan
// of XLA/TFLite on the chosen suite (the synthetic case is shrunk to about
// 38,000 buffers so that the scan finishes).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "bench/planner/synthetic.h"
#include "base/status.h"
#include "plan/solver/best_fit.h"
#include "plan/solver/deadline.h"
#include "plan/instance_input.h"
#include "plan/solver/planner.h"
#include "plan/solver/problem.h"
#include "plan/solver/verifier.h"

namespace loom::bench {
namespace {

struct Case {
  std::string name;
  std::string path;  // CSV, or empty for synthetic
  bool synthetic_cyclic = false;
  uint64_t capacity = 0;
  double limit = 10;
};

std::vector<Case> Suite(const std::string& suite) {
  std::vector<Case> out;
  const std::string mm = "bench/data/minimalloc/challenging/";
  if (suite == "challenging" || suite == "all") {
    for (const char* c : {"A", "B", "C", "D", "E", "F"}) {
      out.push_back({std::string("minimalloc ") + c, mm + c + ".1048576.csv",
                     false, 1048576, 10});
    }
  }
  if (suite == "snapshots" || suite == "all") {
    const std::string dir = "bench/data/pytorch_snapshots/instances/";
    for (const char* c :
         {"bcrafton_gpt2small_ctx64_b1_train_step",
          "magma27_small_ctx256_b32_fwd_bwd", "nothanmin_large_fwd_fp32"}) {
      out.push_back({c, dir + c + ".csv", false, 0, 10});
    }
  }
  if (suite == "idealloc" || suite == "all") {
    out.push_back(
        {"idealloc G_1", "bench/data/idealloc/iopddl/G_1.csv", false, 0, 30});
    out.push_back(
        {"idealloc S_1", "bench/data/idealloc/iopddl/S_1.csv", false, 0, 30});
    out.push_back({"idealloc resnet50",
                   "bench/data/idealloc/somas_tensors/resnet50.csv", false, 0,
                   30});
  }
  if (suite == "synthetic" || suite == "all") {
    out.push_back({"synthetic 300k", "", false, 0, 10});
    out.push_back({"synthetic 300k cyclic", "", true, 0, 10});
  }
  return out;
}

// Best fit without GapIndex: for each buffer, scan every placed buffer,
// keep those sharing a slot, sort their ranges and take the smallest gap
// (the XLA / TFLite way, O(n^2)). Same choices as GapIndex::Find.
plan::Placement NaiveBestFit(const plan::Problem& p,
                             std::span<const uint32_t> order) {
  plan::Placement out;
  out.offsets.assign(p.num_buffers(), 0);
  std::vector<uint32_t> placed;
  std::vector<std::pair<uint64_t, uint64_t>> used;
  for (uint32_t i : order) {
    used.clear();
    for (uint32_t j : placed) {
      bool meet = false;
      for (const plan::SlotSpan& a : p.spans(i)) {
        for (const plan::SlotSpan& b : p.spans(j))
          meet |= a.lo < b.hi && b.lo < a.hi;
      }
      if (meet) used.push_back({out.offsets[j], out.offsets[j] + p.size(j)});
    }
    std::sort(used.begin(), used.end());
    uint64_t free_from = 0, best = UINT64_MAX, best_gap = UINT64_MAX;
    for (const auto& [lo, hi] : used) {
      if (lo > free_from) {
        const uint64_t at = plan::AlignUp(free_from, p.alignment(i));
        if (at < lo && lo - at >= p.size(i) && lo - free_from < best_gap) {
          best_gap = lo - free_from;
          best = at;
        }
      }
      free_from = std::max(free_from, hi);
    }
    if (best == UINT64_MAX) best = plan::AlignUp(free_from, p.alignment(i));
    out.offsets[i] = best;
    out.peak = std::max(out.peak, best + p.size(i));
    placed.push_back(i);
  }
  return out;
}

// --gap-index: GapIndex best fit against the quadratic scan, same order,
// same offsets required; prints the speed-up.
int GapIndexCheck(const std::vector<Case>& cases) {
  std::printf(
      "| instance | buffers | GapIndex best fit s | quadratic scan s | "
      "speed-up | same offsets |\n");
  std::printf("|---|---:|---:|---:|---:|---|\n");
  for (const Case& c : cases) {
    plan::Instance instance;
    if (c.path.empty()) {
      SyntheticOptions options;
      options.layers = 24;
      options.micro_batches = 40;
      options.cyclic = c.synthetic_cyclic;
      instance = SyntheticTrainingIteration(options);
    } else {
      StatusOr<plan::InstanceInput> input = plan::ReadInstanceInput(c.path);
      if (!input.ok()) return 1;
      instance = std::move(input->instance);
    }
    StatusOr<plan::Problem> p = plan::Problem::Make(instance);
    if (!p.ok()) return 1;
    const std::vector<uint32_t> order = plan::MakeOrder(*p, plan::Order::kSize);
    auto t0 = plan::Deadline::Clock::now();
    const plan::Placement fast = plan::PlaceInOrder(*p, order);
    const double fast_s = plan::SecondsSince(t0);
    t0 = plan::Deadline::Clock::now();
    const plan::Placement slow = NaiveBestFit(*p, order);
    const double slow_s = plan::SecondsSince(t0);
    std::printf("| %s | %zu | %.3f | %.3f | %.1fx | %s |\n",
                c.path.empty() ? (c.synthetic_cyclic ? "synthetic 24x40, cyclic"
                                                     : "synthetic 24x40")
                               : c.name.c_str(),
                instance.buffers.size(), fast_s, slow_s, slow_s / fast_s,
                fast.offsets == slow.offsets ? "yes" : "NO");
    std::fflush(stdout);
  }
  return 0;
}

int Run(int argc, char** argv) {
  std::string suite = "all";
  double limit_override = 0;
  bool gap_index_check = false;
  std::vector<Case> cases;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--suite=", 0) == 0) {
      suite = arg.substr(8);
    } else if (arg.rfind("--time-limit=", 0) == 0) {
      limit_override = std::atof(arg.c_str() + 13);
    } else if (arg == "--gap-index") {
      gap_index_check = true;
    } else if (arg.rfind("--instance=", 0) == 0) {
      cases.push_back({arg.substr(11), arg.substr(11), false, 0, 10});
      suite = "none";
    } else {
      std::fprintf(stderr,
                   "usage: planner_bench [--suite=all|challenging|snapshots|"
                   "idealloc|synthetic] [--time-limit=S] [--instance=x.csv]\n");
      return 2;
    }
  }
  for (Case& c : Suite(suite)) cases.push_back(c);
  // Under `bazel run` the working directory is the runfiles tree; data
  // paths are relative to the workspace.
  if (const char* root = std::getenv("BUILD_WORKSPACE_DIRECTORY")) {
    for (Case& c : cases) {
      if (!c.path.empty() && c.path[0] != '/')
        c.path = std::string(root) + "/" + c.path;
    }
  }
  if (gap_index_check) return GapIndexCheck(cases);
  std::printf(
      "| instance | buffers | lower bound | best fit (size) peak/LB | best fit "
      "s "
      "| loom peak/LB | loom s | found after s | algorithm | valid |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---|---|\n");
  std::fflush(stdout);
  int failures = 0;
  for (const Case& c : cases) {
    plan::Instance instance;
    if (c.path.empty()) {
      SyntheticOptions options;
      options.cyclic = c.synthetic_cyclic;
      instance = SyntheticTrainingIteration(options);
    } else {
      StatusOr<plan::InstanceInput> input = plan::ReadInstanceInput(c.path);
      if (!input.ok()) {
        std::fprintf(stderr, "%s\n", input.status().ToString().c_str());
        return 1;
      }
      instance = std::move(input->instance);
    }
    // Baseline: size-descending best fit (TFLite / XLA spatial order).
    const auto t0 = plan::Deadline::Clock::now();
    StatusOr<plan::Problem> problem = plan::Problem::Make(instance);
    if (!problem.ok()) {
      std::fprintf(stderr, "%s\n", problem.status().ToString().c_str());
      return 1;
    }
    const plan::Placement baseline = plan::PlaceInOrder(
        *problem, plan::MakeOrder(*problem, plan::Order::kSize));
    const double baseline_seconds = plan::SecondsSince(t0);
    const bool baseline_valid =
        plan::VerifyPlacement(instance, baseline.offsets).valid();
    // loom's planner.
    plan::PlannerOptions options;
    options.time_limit_seconds = limit_override > 0 ? limit_override : c.limit;
    options.capacity = c.capacity;
    options.progress = false;
    if (const char* name = std::getenv("LOOM_BENCH_ALGORITHM")) {
      StatusOr<plan::Algorithm> a = plan::ParseAlgorithm(name);
      if (!a.ok()) return 2;
      options.algorithm = *a;
    }
    StatusOr<plan::PlanResult> r = plan::PlanInstance(instance, options);
    if (!r.ok()) {
      std::fprintf(stderr, "%s: %s\n", c.name.c_str(),
                   r.status().ToString().c_str());
      return 1;
    }
    plan::VerifyOptions verify;
    verify.capacity = c.capacity != 0 && r->fits ? c.capacity : 0;
    const bool valid =
        baseline_valid &&
        plan::VerifyPlacement(instance, r->offsets, verify).valid();
    failures += !valid;
    const double lb = static_cast<double>(r->lower_bound_bytes);
    std::printf(
        "| %s | %zu | %llu | %.4f | %.3f | %.4f%s | %.2f | %.2f | %s | %s |\n",
        c.name.c_str(), instance.buffers.size(),
        static_cast<unsigned long long>(r->lower_bound_bytes),
        static_cast<double>(baseline.peak) / lb, baseline_seconds,
        static_cast<double>(r->peak_bytes) / lb, r->optimal ? " (opt)" : "",
        r->seconds, r->seconds_to_best, r->algorithm.c_str(),
        valid ? (c.capacity != 0 ? (r->fits ? "yes, fits" : "yes, does NOT fit")
                                 : "yes")
              : "NO");
    std::fflush(stdout);
    if (std::getenv("LOOM_BENCH_VERBOSE")) {
      for (const plan::Attempt& a : r->attempts) {
        std::fprintf(stderr, "    %-28s %14llu %8.3f s %s\n",
                     a.algorithm.c_str(),
                     static_cast<unsigned long long>(a.peak_bytes), a.seconds,
                     a.note.c_str());
      }
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace loom::bench

int main(int argc, char** argv) { return loom::bench::Run(argc, argv); }
