#include "plan/solver/testing/instances.h"

namespace loom::plan::testing {

Instance ReadmeInstance() {
  Instance inst;
  inst.buffers = {
      {0, 0, 3, 4}, {1, 3, 9, 4}, {2, 0, 9, 4}, {3, 9, 21, 4}, {4, 0, 21, 4}};
  return inst;
}

std::vector<uint64_t> ReadmeOffsets() { return {8, 8, 4, 4, 0}; }

Instance GapInstance() {
  Instance inst;
  inst.buffers = {{0, 1, 2, 4}, {1, 3, 6, 2}, {2, 3, 5, 2}, {3, 0, 4, 2},
                  {4, 6, 9, 3}, {5, 5, 7, 3}, {6, 4, 6, 1}};
  return inst;
}

}  // namespace loom::plan::testing
