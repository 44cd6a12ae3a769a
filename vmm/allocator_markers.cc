// The allocator's markers and recording (record mode's trace).
#include <algorithm>

#include "vmm/allocator.h"

namespace loom::vmm {

void Allocator::IterationBegin(uint64_t number) {
  std::lock_guard<FutexMutex> lock(mu_);
  Record(plan::Event::IterationBegin(number));
  if (stats_.iterations > 0 && iteration_hits_ + iteration_misses_ > 0) {
    stats_.last_iteration_hit_rate = static_cast<double>(iteration_hits_) /
                                     (iteration_hits_ + iteration_misses_);
  } else if (stats_.iterations > 0 && iteration_unrouted_ > 0) {
    // A plan is installed but served none of the iteration's requests (it
    // lost to the dynamic space, or was suspended from its first request):
    // not the last served iteration's rate.
    stats_.last_iteration_hit_rate = 0;
  }
  ++stats_.iterations;
  fit_.IterationBegin();
  probed_ = variants_.size() > 1 ? 0 : kProbeRequests;
  referee_.IterationBegin();
  // A plan that lost to the dynamic space serves no more (plan_referee.h).
  serving_ = referee_.lost() ? nullptr : active_;
  // An early iteration of the recording did not fit: the prologue replays
  // one run's beginning (its order of shapes: varlen's sequence lengths,
  // eval's steps), which this run does not follow, and while a plan is in
  // its prologue no other variant is probed. From now on every iteration
  // is matched as a steady one (each variant's, the re-plans' included).
  const bool leave_prologue =
      active_ != nullptr && active_->matcher.in_prologue() &&
      !active_->matcher.in_setup() && fit_.last_iteration_suspended();
  for (const std::unique_ptr<Variant>& v : variants_) {
    v->matcher.IterationBegin();
    if (leave_prologue && v->matcher.in_prologue())
      v->matcher.JumpToIteration();
    v->probe_hits = 0;
  }
  // The prologue is over for every plan: nothing is placed as persistent
  // any more, nor offered again.
  if (!persistent_.served.empty() &&
      std::none_of(variants_.begin(), variants_.end(),
                   [](const auto& v) { return v->matcher.in_prologue(); })) {
    persistent_ = PersistentQueue();
  }
  if (active_ != nullptr) active_->last_used = stats_.iterations;
  iteration_hits_ = 0;
  iteration_misses_ = 0;
  iteration_unrouted_ = 0;
  window_cursors_.clear();
  trial_hits_ = 0;
  trial_left_ = 0;
  // A plan that has not fitted one iteration yet, after one it did not fit
  // (another batch size, another model): the next iteration's first
  // requests are a trial, served dynamically while the matcher follows.
  if (serving_ != nullptr && variants_.size() == 1 && stats_.iterations > 1 &&
      fit_.last_iteration_suspended() && fit_.fitted_iterations() == 0) {
    trial_left_ = kTrialRequests;
  }
}

void Allocator::IterationEnd(uint64_t number) {
  std::lock_guard<FutexMutex> lock(mu_);
  Record(plan::Event::IterationEnd(number));
}

void Allocator::Phase(std::string_view name) {
  std::lock_guard<FutexMutex> lock(mu_);
  if (recording_) Record(plan::Event::Phase(trace_.InternName(name)));
  phase_ = std::string(name);
  FindWindow();
}

void Allocator::ModuleEnter(std::string_view name, bool dynamic) {
  std::lock_guard<FutexMutex> lock(mu_);
  if (recording_)
    Record(plan::Event::ModuleEnter(trace_.InternName(name), dynamic));
  if (!dynamic) return;
  dynamic_modules_.emplace_back(name);
  FindWindow();
  if (window_ != nullptr) StartWindowCall();
}

void Allocator::ModuleExit(std::string_view name) {
  std::lock_guard<FutexMutex> lock(mu_);
  if (recording_) Record(plan::Event::ModuleExit(trace_.InternName(name)));
  auto it = std::find(dynamic_modules_.rbegin(), dynamic_modules_.rend(), name);
  if (it == dynamic_modules_.rend()) return;
  dynamic_modules_.erase(std::next(it).base());
  FindWindow();
}

void Allocator::FindWindow() {
  window_ = nullptr;
  if (active_ == nullptr || dynamic_modules_.empty()) return;
  // The window of the innermost dynamic module in the current phase (where
  // its requests open: a forward request lives until the backward, a
  // backward one briefly), else of the module in any phase (plans without
  // phase keys).
  const std::string& module = dynamic_modules_.back();
  const std::string keyed = module + "@" + phase_;
  for (const DynamicWindow& w : active_->plan.windows) {
    if (w.module == keyed) {
      window_ = &w;
      return;
    }
    if (w.module == module) window_ = &w;
  }
}

int64_t Allocator::DynamicUntil(uint32_t position, DynamicBirth* birth) {
  // A request of a dynamic module the plan has no window for may live for
  // ever (an expert's activation kept for the backward pass): unknown, so
  // it gets no planned byte and no page the plan uses.
  if (window_ == nullptr || active_ == nullptr) return -1;
  birth->window = window_;
  birth->ordinal = position;
  birth->time = active_->matcher.now();
  birth->iteration = stats_.iterations;
  auto it = lifetimes_.find(window_);
  if (it != lifetimes_.end() && birth->ordinal < it->second.size() &&
      it->second[birth->ordinal] > 0) {
    return birth->time + it->second[birth->ordinal];
  }
  return window_->end;
}

const WindowRequests* Allocator::WindowSequence() const {
  if (!active_->matcher.in_prologue()) return &window_->steady;
  // An early iteration's own requests; none in the set-up.
  const int64_t j = active_->matcher.prologue_iteration();
  if (j < 0 || static_cast<size_t>(j) >= window_->early.size()) return nullptr;
  return &window_->early[j];
}

void Allocator::StartWindowCall() {
  WindowCursor& cursor = window_cursors_[window_];
  const uint32_t call = ++cursor.calls;
  const WindowRequests* sequence = WindowSequence();
  if (sequence == nullptr || sequence->calls.empty()) return;
  // The call's first request; a call the plan never saw takes no slot.
  const auto first =
      std::find(sequence->calls.begin(), sequence->calls.end(), call);
  cursor.requests = static_cast<uint32_t>(first - sequence->calls.begin());
}

const PlannedRequest* Allocator::DynamicSlot(uint32_t* position) {
  if (window_ == nullptr) return nullptr;
  *position = window_cursors_[window_].requests++;
  if (serving_ == nullptr || trial_left_ > 0) return nullptr;
  // The slot at the request's position in its window this iteration.
  const WindowRequests* sequence = WindowSequence();
  if (sequence == nullptr || *position >= sequence->requests.size())
    return nullptr;
  const PlannedRequest& slot = sequence->requests[*position];
  return slot.offset == kUnplanned ? nullptr : &slot;
}

void Allocator::LearnDynamicLifetime(const DynamicBirth& birth) {
  if (active_ == nullptr || active_->plan.period <= 0) return;
  // Only within the variant the request was born in (times are its own).
  bool same = false;
  for (const DynamicWindow& w : active_->plan.windows)
    same |= &w == birth.window;
  if (!same) return;
  const int64_t period = active_->plan.period;
  const int64_t lifetime =
      static_cast<int64_t>(stats_.iterations - birth.iteration) * period +
      active_->matcher.now() - birth.time;
  if (lifetime <= 0 || lifetime > period) return;  // not comparable
  std::vector<int64_t>& known = lifetimes_[birth.window];
  if (known.size() <= birth.ordinal) known.resize(birth.ordinal + 1, 0);
  known[birth.ordinal] = lifetime;
}

void Allocator::Record(const plan::Event& event) {
  if (!recording_) return;
  // A request made before recording began: its free is not recorded
  // (only counted).
  if (event.kind == plan::EventKind::kFree && event.id < record_from_id_) {
    ++stats_.trace_earlier_frees;
    return;
  }
  if (trace_.events.size() >= record_capacity_) {
    stats_.trace_truncated = true;
    return;
  }
  trace_.events.push_back(event);
  stats_.trace_events = trace_.events.size();
}

plan::Trace Allocator::TakeTrace() {
  std::lock_guard<FutexMutex> lock(mu_);
  plan::Trace out = std::move(trace_);
  trace_ = plan::Trace();
  trace_.header = out.header;
  trace_.names = out.names;  // later events keep using the same name ids
  if (recording_) trace_.events.reserve(record_capacity_);
  return out;
}

plan::Trace Allocator::RecordedTrace() const {
  std::lock_guard<FutexMutex> lock(mu_);
  return trace_;
}

void Allocator::StartRecording(size_t capacity) {
  std::lock_guard<FutexMutex> lock(mu_);
  if (recording_ || capacity == 0) return;
  recording_ = true;
  record_capacity_ = capacity;
  record_from_id_ = next_request_id_;
  stats_.trace_truncated = false;
  plan::Trace fresh;
  fresh.header = trace_.header;
  fresh.header.provenance = "loom re-recording";
  trace_ = std::move(fresh);
  trace_.events.reserve(capacity);
  stats_.trace_events = 0;
  stats_.trace_earlier_frees = 0;
}

void Allocator::ClearRecording() {
  std::lock_guard<FutexMutex> lock(mu_);
  trace_.events.clear();
  record_from_id_ = next_request_id_;
  stats_.trace_events = 0;
  stats_.trace_earlier_frees = 0;
  stats_.trace_truncated = false;
}

bool Allocator::recording() const {
  std::lock_guard<FutexMutex> lock(mu_);
  return recording_;
}

void Allocator::StopRecording() {
  std::lock_guard<FutexMutex> lock(mu_);
  recording_ = false;
  plan::Trace empty;
  empty.header = trace_.header;
  trace_ = std::move(empty);
}

}  // namespace loom::vmm
