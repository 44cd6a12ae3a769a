// Periodicity of allocation sequences (pure C++): finding the iteration
// length of a trace without iteration markers, and aligning two iterations
// so that one extra request does not shift every later match.
//
// Both work on token sequences: one 64-bit token per alloc or free event,
// a hash of (action, size) (see workload.h). Tokens equal <=> same action and
// same size.
#ifndef LOOM_PLAN_ANALYSIS_PERIODICITY_H_
#define LOOM_PLAN_ANALYSIS_PERIODICITY_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace loom::plan {

struct PeriodOptions {
  // Fraction of aligned positions allowed to differ between consecutive
  // repetitions (MoE buffers whose sizes change, extra or missing requests).
  // Only decides whether anything repeats at all: among the periods that
  // qualify the best-matching one wins, since a wrong period matches worse
  // on top of the same changing sizes.
  double tolerance = 0.3;
  // A divisor of the best-scoring period wins if its score is within this
  // fraction of the best: 2p scores like p up to noise, and with MoE sizes
  // changing every iteration the noise is a few percent.
  double tie = 0.05;
  size_t gram = 4;  // n-gram length used to propose candidate periods
  size_t max_candidates = 32;
  // With byte deltas given: a period qualifies only if, in the median
  // repetition, |allocated - freed bytes| is at most this fraction of the
  // allocated bytes. Training iterations end where they started; the layers
  // of one forward pass keep their activations (and backward frees them), so
  // a layer period of a single step is rejected.
  double max_imbalance = 0.1;
  // With byte deltas given: the repeating part (from the head on) must reach
  // at least this fraction of the trace's peak of live bytes, and so must the
  // median repetition's peak relative to the highest one. Iterations of a
  // steady run all hold about the same peak (activations on top of the
  // weights); the layers of one backward pass, freeing activations as they
  // go, have falling peaks and are not iterations.
  double min_peak_share = 0.9;
};

struct PeriodResult {
  bool found = false;
  size_t period = 0;  // tokens per repetition
  size_t head = 0;    // tokens before the first repetition starts
  double match = 0;   // aligned match fraction at `period`
  // Token index where each repetition starts: starts[0] == head; later ones
  // are resynchronised on the first tokens of the first repetition, so an
  // inserted request moves a boundary by one instead of drifting.
  std::vector<size_t> starts;
};

// Finds the period p (and head h) such that tokens[h..] repeats with period p
// at least twice, with an aligned match fraction (below) of at least
// 1 - tolerance, and the best score = match fraction * (n - h) / n (a period
// that fits only late in the trace explains less of it); the smallest
// divisor of p scoring within a fraction `tie` of it is preferred. Candidates
// come from the distances between repeated n-grams, so it runs in
// O(n * candidates). `found` is false when nothing repeats (the caller treats
// the trace as one iteration). `deltas`, if not empty, holds per token the
// bytes it allocates (> 0) or frees (< 0), for the balance test above.
PeriodResult DetectPeriod(std::span<const uint64_t> tokens,
                          std::span<const int64_t> deltas = {},
                          const PeriodOptions& options = {});

// The aligned match fraction used by DetectPeriod: walks tokens[head..]
// against itself shifted by `period`, skipping up to 32 tokens on either side
// to resynchronise after an insertion or deletion (the shift stays within a
// quarter period of `period`). Exposed for tests.
double AlignedMatchFraction(std::span<const uint64_t> tokens, size_t head,
                            size_t period);

// A longest-common-subsequence alignment of `a` and `b` (Myers' O(ND)
// algorithm after trimming the common prefix and suffix).
struct Alignment {
  std::vector<int64_t> a_to_b;  // per a[i]: matched index in b, or -1
  std::vector<int64_t> b_to_a;  // per b[j]: matched index in a, or -1
  size_t matched = 0;
  // False when the edit distance exceeded `max_edits` and the middle part was
  // matched position by position instead (a lower bound on the LCS).
  bool exact = true;
};
Alignment AlignSequences(std::span<const uint64_t> a,
                         std::span<const uint64_t> b, size_t max_edits = 2000);

}  // namespace loom::plan

#endif  // LOOM_PLAN_ANALYSIS_PERIODICITY_H_
