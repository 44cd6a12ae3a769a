// Deadline: a wall-clock time budget shared by the planner's searches.
//
// Cheap to poll (a steady_clock read); searches poll it every few thousand
// nodes. A Deadline made with no budget (Infinite) never expires.
#ifndef LOOM_PLAN_SOLVER_DEADLINE_H_
#define LOOM_PLAN_SOLVER_DEADLINE_H_

#include <algorithm>
#include <chrono>

namespace loom::plan {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  static Deadline Infinite() { return Deadline(Clock::time_point::max()); }
  // `seconds` from now; <= 0 is already expired.
  static Deadline In(double seconds) {
    if (seconds >= 1e9) return Infinite();
    return Deadline(Clock::now() +
                    std::chrono::duration_cast<Clock::duration>(
                        std::chrono::duration<double>(std::max(seconds, 0.0))));
  }

  bool Expired() const { return Clock::now() >= at_; }
  // Seconds left (0 when expired; a huge number when infinite).
  double SecondsLeft() const {
    if (at_ == Clock::time_point::max()) return 1e18;
    return std::max(0.0,
                    std::chrono::duration<double>(at_ - Clock::now()).count());
  }
  // The earlier of this deadline and `seconds` from now.
  Deadline Within(double seconds) const {
    Deadline other = In(seconds);
    return other.at_ < at_ ? other : *this;
  }

 private:
  explicit Deadline(Clock::time_point at) : at_(at) {}
  Clock::time_point at_;
};

// Seconds since `start`.
inline double SecondsSince(Deadline::Clock::time_point start) {
  return std::chrono::duration<double>(Deadline::Clock::now() - start).count();
}

}  // namespace loom::plan

#endif  // LOOM_PLAN_SOLVER_DEADLINE_H_
