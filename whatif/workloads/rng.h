// The generated workloads' own PRNG: splitmix64 and the few distributions
// they draw from. Internal to whatif/workloads.
//
// Invariant: the same seed gives the same sequence on every platform and
// compiler (integer arithmetic only, plus std::log/sqrt/cos in the
// distributions), so a workload's trace is a function of its config.
#ifndef LOOM_WHATIF_WORKLOADS_RNG_H_
#define LOOM_WHATIF_WORKLOADS_RNG_H_

#include <cmath>
#include <cstdint>

namespace loom::whatif {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in (0, 1).
  double Uniform() { return ((Next() >> 11) + 0.5) * 0x1.0p-53; }
  // Uniform in [0, n) (the modulo bias is below n / 2^64). REQUIRES: n > 0.
  uint64_t Below(uint64_t n) { return Next() % n; }
  double Normal() {  // Box-Muller
    double u = Uniform();
    double v = Uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v);
  }
  double Gumbel() { return -std::log(-std::log(Uniform())); }

 private:
  uint64_t state_;
};

}  // namespace loom::whatif

#endif  // LOOM_WHATIF_WORKLOADS_RNG_H_
