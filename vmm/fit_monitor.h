// FitMonitor: does the installed plan fit the requests coming now?
//
// A plan fits a run that repeats the requests it was made from; a foreign
// plan (another model, another batch size), a new shape of iteration (a
// sequence length or an evaluation step the plan never saw) or a heavily
// perturbed run misses most of its requests, and then the static region
// only holds memory the dynamic space needs. The monitor sees every request
// the matcher routes (a hit: served at its planned range; a miss: anything
// else) and judges the plan over a sliding window of the last kWindow of
// them: once at least kMinRecords requests of the current iteration were
// seen, fewer than kMinHitRate of the window hit and at least kMinMisses
// of it missed (a few misses early on are a perturbation's, not another
// shape's), the plan is suspended
// until the next iteration begins (the allocator then serves everything
// from its dynamic space and lends it every idle static page). Counts of
// suspended iterations tell the re-planner (autoplan/) when to record the
// new shape. Not thread-safe: the allocator serialises access.
#ifndef LOOM_VMM_FIT_MONITOR_H_
#define LOOM_VMM_FIT_MONITOR_H_

#include <bit>
#include <cstdint>

namespace loom::vmm {

class FitMonitor {
 public:
  static constexpr uint32_t kWindow = 64;       // requests judged together
  static constexpr uint32_t kMinRecords = 16;   // seen before judging
  static constexpr double kMinHitRate = 0.875;  // of the window
  // Misses in the window before it may suspend (a few misses among the
  // first requests are a perturbation's, not another shape's).
  static constexpr uint32_t kMinMisses = 5;

  // A new iteration: the plan gets another chance.
  void IterationBegin() {
    if (suspended_) ++suspended_iterations_;
    // (The first call ends the set-up, not an iteration.)
    if (!suspended_ && records_ > 0 && begun_) ++fitted_iterations_;
    begun_ = true;
    last_iteration_suspended_ = suspended_;
    suspended_ = false;
    window_ = 0;
    records_ = 0;
  }
  // Records a hit (never suspends: a hit cannot lower the window's rate).
  void RecordHit() {
    window_ = (window_ << 1) | 1;
    ++records_;
  }
  // Records one routed request; returns true when it suspends the plan.
  bool Record(bool hit) {
    window_ = (window_ << 1) | (hit ? 1 : 0);
    ++records_;
    if (suspended_ || records_ < kMinRecords) return false;
    const uint32_t seen = records_ < kWindow ? records_ : kWindow;
    const uint64_t mask = seen == 64 ? ~uint64_t{0} : (uint64_t{1} << seen) - 1;
    const int hits = std::popcount(window_ & mask);
    if (hits >= kMinHitRate * seen || seen - hits < kMinMisses) return false;
    SuspendNow();
    return true;
  }
  // Suspends now (also when a trial of the iteration's first requests
  // failed).
  void SuspendNow() {
    if (suspended_) return;
    suspended_ = true;
    ++suspensions_;
  }
  bool suspended() const { return suspended_; }
  bool last_iteration_suspended() const { return last_iteration_suspended_; }
  // Iterations that ended suspended, and suspensions in all.
  uint64_t suspended_iterations() const { return suspended_iterations_; }
  uint64_t suspensions() const { return suspensions_; }
  // Iterations that ended with the plan serving (some request judged).
  uint64_t fitted_iterations() const { return fitted_iterations_; }

 private:
  uint64_t window_ = 0;  // bit i: the i-th latest request hit
  uint32_t records_ = 0;
  bool suspended_ = false;
  bool last_iteration_suspended_ = false;
  uint64_t suspended_iterations_ = 0;
  uint64_t suspensions_ = 0;
  uint64_t fitted_iterations_ = 0;
  bool begun_ = false;
};

}  // namespace loom::vmm

#endif  // LOOM_VMM_FIT_MONITOR_H_
