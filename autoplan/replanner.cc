#include "autoplan/replanner.h"

#include <unordered_set>

#include "vmm/plan_loader.h"

namespace loom::autoplan {
namespace {

const char* StateName(int state) {
  static const char* const kNames[] = {"waiting", "watching", "extending",
                                       "planning", "done"};
  return kNames[state];
}

}  // namespace

Replanner::Replanner(vmm::Allocator& allocator, ReplanOptions options)
    : allocator_(allocator), options_(std::move(options)) {
  stats_.state = StateName(0);
}

Replanner::~Replanner() {
  if (planner_.joinable()) planner_.join();
  if (state_ != State::kWaiting) allocator_.StopRecording();
}

void Replanner::SetState(State state) {
  state_ = state;
  std::lock_guard<std::mutex> lock(mu_);
  stats_.state = StateName(static_cast<int>(state));
}

ReplanStats Replanner::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

StatusOr<vmm::RuntimePlan> Replanner::PlanIteration(
    const plan::Trace& trace, const plan::MakePlanOptions& options,
    uint64_t granularity) {
  plan::MakePlanOptions make = options;
  // The recording holds the iteration to plan, and the one after it (where
  // the requests that outlive it are freed) when requests of this workload
  // cross an iteration's end. An iteration runs from one begin marker to
  // the next: what comes after its end marker (evaluation steps) is part
  // of it, so end markers are left out.
  // A request still live at the recording's end (it lived through the
  // next iteration too, or, recorded alone, nothing crosses an iteration's
  // end) is state made once (the optimizer state of a run's first step),
  // not a request the iterations to come will make again. It stays where
  // it is; planning it would reserve its bytes in every iteration of the
  // variant.
  std::unordered_set<uint64_t> freed;
  for (const plan::Event& e : trace.events) {
    if (e.kind == plan::EventKind::kFree) freed.insert(e.id);
  }
  plan::Trace iterations;
  iterations.header = trace.header;
  iterations.names = trace.names;
  iterations.events.reserve(trace.events.size());
  for (const plan::Event& e : trace.events) {
    if (e.kind == plan::EventKind::kIterationEnd) continue;
    if (e.kind == plan::EventKind::kAlloc && !freed.contains(e.id)) continue;
    iterations.events.push_back(e);
  }
  make.scope = plan::PlanScope::kIteration;
  make.steady_iteration = 0;
  make.include_persistent = false;
  make.granule_bytes = granularity;
  if (make.source.empty()) make.source = "re-plan";
  LOOM_ASSIGN_OR_RETURN(plan::MadePlan made, plan::MakePlan(iterations, make));
  if (!made.verdict.valid()) {
    return InternalError("the planner's placement failed verification");
  }
  if (!made.result.fits) {
    return OutOfMemoryError(
        "the plan needs {} bytes, more than the {} bytes allowed",
        made.result.peak_bytes, make.capacity);
  }
  return vmm::ToRuntimePlan(made.file, make.source, granularity);
}

void Replanner::Install(StatusOr<vmm::RuntimePlan> plan) {
  Status installed = plan.status();
  bool refused = false;
  if (plan.ok()) {
    // A variant is installed only if it does not raise the most memory
    // loom has held (its iteration, served dynamically, included).
    installed = allocator_.has_plan()
                    ? allocator_.AddPlanVariant(std::move(plan).value(),
                                                /*never_raise_peak=*/true)
                    : allocator_.LoadPlan(std::move(plan).value());
    refused = installed.code() == StatusCode::kOutOfMemory;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (installed.ok()) {
    ++stats_.replans;
  } else if (refused) {  // counted by the allocator (not a failure)
    stats_.last_error = installed.ToString();
  } else if (installed.code() == StatusCode::kAlreadyExists) {
    ++stats_.duplicates;  // a variant already covers that shape
  } else {
    ++stats_.failures;
    stats_.last_error = installed.ToString();
  }
}

void Replanner::PlanRecording() {
  plan::Trace trace = allocator_.RecordedTrace();
  const uint64_t g = allocator_.granularity();
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.attempts;
  }
  if (options_.background) {
    SetState(State::kPlanning);
    planner_ = std::thread([this, g, trace = std::move(trace)]() {
      StatusOr<vmm::RuntimePlan> plan =
          PlanIteration(trace, options_.plan_options, g);
      std::lock_guard<std::mutex> lock(mu_);
      result_.emplace(std::move(plan));
    });
  } else {
    Install(PlanIteration(trace, options_.plan_options, g));
  }
}

void Replanner::BeforeIterationBegin() {
  if (state_ == State::kPlanning) {
    std::optional<StatusOr<vmm::RuntimePlan>> result;
    {
      std::lock_guard<std::mutex> lock(mu_);
      result.swap(result_);
    }
    if (result.has_value()) {
      planner_.join();
      Install(std::move(*result));
      SetState(State::kWatching);
    }
  }
  if (state_ == State::kDone) return;
  if (state_ == State::kWaiting) {
    // Nothing to compare iterations with before a plan is installed (auto
    // mode makes the first one; record mode records for itself).
    if (!allocator_.has_plan() || allocator_.recording()) return;
    allocator_.StartRecording(options_.record_capacity);
    SetState(State::kWatching);
    return;
  }
  const vmm::AllocatorStats s = allocator_.stats();
  if (state_ == State::kExtending) {
    // The recording now holds the iteration that did not fit and the one
    // after it: plan the first.
    SetState(State::kWatching);
    if (!s.trace_truncated) PlanRecording();
  } else if (state_ == State::kWatching && allocator_.PlanSuspended() &&
             !s.trace_truncated) {
    // The iteration ending now did not fit any plan. If requests live
    // past an iteration's end in this workload (the iteration freed some
    // made before it, or a plan installed has one: a gradient freed by the
    // next step), keep recording one more iteration: its frees end the
    // lifetimes that cross over. Otherwise the next iteration's frees
    // would end none (what is live now was made for good): planned now,
    // one iteration sooner.
    if (s.trace_earlier_frees > 0 || allocator_.PlansCrossIterations()) {
      SetState(State::kExtending);
      return;
    }
    PlanRecording();
  }
  allocator_.ClearRecording();  // the next iteration's recording
  std::lock_guard<std::mutex> lock(mu_);
  if (static_cast<int>(stats_.attempts) >= options_.max_replans &&
      state_ == State::kWatching) {
    state_ = State::kDone;
    stats_.state = StateName(static_cast<int>(State::kDone));
  }
}

}  // namespace loom::autoplan
