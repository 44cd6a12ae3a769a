#include "whatif/loom/loom_factory.h"

#include <chrono>

#include "plan/solver/minimalloc_csv.h"
#include "whatif/loom/loom_sim_allocator.h"
#include "whatif/loom/plan_check.h"

namespace loom::whatif {
namespace {

// Forwards to a LoomSimAllocator and adds the planning figures to its
// counters.
class PlannedLoom final : public SimAllocator {
 public:
  PlannedLoom(std::unique_ptr<LoomSimAllocator> inner,
              std::vector<std::pair<std::string, uint64_t>> extra)
      : inner_(std::move(inner)), extra_(std::move(extra)) {}
  std::string_view name() const override { return "loom"; }
  StatusOr<uint64_t> Malloc(uint64_t size, uint64_t stream) override {
    return inner_->Malloc(size, stream);
  }
  Status Free(uint64_t address) override { return inner_->Free(address); }
  void EmptyCache() override { inner_->EmptyCache(); }
  void OnMarker(const plan::Event& event) override { inner_->OnMarker(event); }
  const MemoryStats& stats() const override { return inner_->stats(); }
  const DriverCalls& driver_calls() const override {
    return inner_->driver_calls();
  }
  std::vector<std::pair<std::string, uint64_t>> Counters() const override {
    std::vector<std::pair<std::string, uint64_t>> out = inner_->Counters();
    out.insert(out.end(), extra_.begin(), extra_.end());
    return out;
  }
  std::vector<AddressRange> MappedRanges() const override {
    return inner_->MappedRanges();
  }
  Status CheckInvariants() const override { return inner_->CheckInvariants(); }

 private:
  std::unique_ptr<LoomSimAllocator> inner_;
  std::vector<std::pair<std::string, uint64_t>> extra_;
};

}  // namespace

AllocatorFactory LoomAllocatorFactory(const LoomRowOptions& row) {
  const SelfPlanOptions options = row.planning;
  const bool plan = row.plan;
  const std::string plan_csv = row.plan_csv;
  const std::shared_ptr<const plan::Trace> plan_trace = row.plan_trace;
  const bool stitch = row.stitch;
  return AllocatorFactory{
      plan ? "loom" : "loom_unplanned",
      [options, plan, plan_csv, plan_trace, stitch](
          const plan::Trace& trace,
          const SimOptions& sim) -> StatusOr<std::unique_ptr<SimAllocator>> {
        LoomSimOptions loom;
        loom.backend = "fake";
        loom.granularity = options.granularity;
        loom.capacity = sim.capacity;
        loom.names = trace.names;
        loom.stitch = stitch;
        std::vector<std::pair<std::string, uint64_t>> extra;
        if (plan) {
          auto start = std::chrono::steady_clock::now();
          StatusOr<SelfPlan> planned = PlanTraceForRuntime(
              plan_trace != nullptr ? *plan_trace : trace, options);
          if (!planned.ok())
            return planned.status().WithContext("planning for loom");
          auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
          extra = {
              {"planning_ms", static_cast<uint64_t>(ms)},
              {"plan_peak_bytes", planned->result.peak_bytes},
              {"plan_lower_bound_bytes", planned->result.lower_bound_bytes}};
          if (!plan_csv.empty()) {
            LOOM_RETURN_IF_ERROR(plan::WriteMinimallocCsv(
                plan_csv, planned->instance, planned->result.offsets));
          }
          // As the product does before serving a plan: replayed on the
          // recording it was made from, with and without it
          // (plan_check.h).
          StatusOr<PlanCheck> check = CheckPlanOnRecording(
              plan_trace != nullptr ? *plan_trace : trace, planned->runtime,
              options.granularity, stitch);
          if (!check.ok()) return check.status();
          extra.push_back(
              {"plan_check_planned_bytes", check->planned_peak_reserved});
          extra.push_back(
              {"plan_check_unplanned_bytes", check->unplanned_peak_reserved});
          extra.push_back({"plan_not_served", check->earns_its_place ? 0 : 1});
          if (check->earns_its_place) {
            loom.plan = std::move(planned->runtime);
            // As auto mode at run time: shapes the plan does not fit are
            // recorded and planned as variants.
            loom.replan = ReplanOptionsFor(options);
          }
        }
        LOOM_ASSIGN_OR_RETURN(std::unique_ptr<LoomSimAllocator> inner,
                              LoomSimAllocator::Create(std::move(loom)));
        return std::unique_ptr<SimAllocator>(
            std::make_unique<PlannedLoom>(std::move(inner), std::move(extra)));
      },
      plan ? row.plan_from : std::string()};
}

}  // namespace loom::whatif
