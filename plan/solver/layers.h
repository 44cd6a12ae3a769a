// STAlloc's spatio-temporal grouping: phase groups, memory layers and
// size-descending global placement (pure C++).
//
// From STAlloc (EuroSys '26, section 5.1), generalised to cyclic plans:
//  1. Phase groups (optional, when the caller gives a group key per buffer,
//     e.g. the (start phase, end phase) pair of an activation): each group
//     is packed into a local plan (best fit, size descending) and scored by
//     its time-memory product TMP = sum(size x duration) / (height x span).
//     Groups whose time spans overlap are fused (the smaller one's buffers
//     best-fitted into the larger one's plan) when TMP_new^2 > TMP_a x
//     TMP_b, STAlloc's acceptance test; groups with TMP < 0.7 or fewer than
//     two buffers are dissolved. A surviving group becomes one request (its
//     height over its span); its buffers keep their relative offsets.
//  2. Same-size memory layers (Algorithm 1): requests of one exact size,
//     taken in start order, go on the layer whose last end is the latest
//     one not after the request's start (interval-graph colouring: no idle
//     time is left that a later request of that size could use); on a
//     cyclic instance a wrapping request also has to end before the
//     layer's first start.
//  3. Global placement: sizes in descending order; each request first
//     tries a free gap below the current peak (best fit among the layers
//     placed so far); the rest form layers that are placed as units at
//     their best-fit offset (on top when nothing fits).
// Every placed buffer is recorded individually in a GapIndex, so smaller
// requests also fill the bubbles inside groups and layers.
#ifndef LOOM_PLAN_SOLVER_LAYERS_H_
#define LOOM_PLAN_SOLVER_LAYERS_H_

#include <cstdint>
#include <span>

#include "plan/solver/problem.h"

namespace loom::plan {

inline constexpr uint32_t kNoGroup = UINT32_MAX;

struct LayersOptions {
  // Empty, or one phase-group key per buffer (kNoGroup: no group).
  std::span<const uint32_t> group;
  // Groups with a time-memory product below this are dissolved.
  double min_tmp = 0.7;
};

struct LayersStats {
  size_t groups = 0;      // phase groups kept as units
  size_t fusions = 0;     // accepted group fusions
  size_t layers = 0;      // memory layers opened
  size_t gap_placed = 0;  // requests placed in gaps of larger layers
};

// REQUIRES: options.group empty or one key per buffer.
Placement PlaceByLayers(const Problem& problem,
                        const LayersOptions& options = {},
                        LayersStats* stats = nullptr);

}  // namespace loom::plan

#endif  // LOOM_PLAN_SOLVER_LAYERS_H_
