// OpenDriver: picks a Driver backend by name ("cuda", "host", "async",
// "fake").
#ifndef LOOM_VMM_DRIVER_FACTORY_H_
#define LOOM_VMM_DRIVER_FACTORY_H_

#include <memory>
#include <string_view>

#include "vmm/driver.h"

namespace loom::vmm {

struct DriverOptions {
  // host and fake only; the CUDA driver reports its own values.
  uint64_t granularity = uint64_t{2} << 20;
  int device_count = 1;
  uint64_t capacity_per_device = uint64_t{80} << 30;
};

// Errors: INVALID_ARGUMENT for an unknown backend name; whatever the backend's
// constructor reports (e.g. UNAVAILABLE "no CUDA driver ...").
StatusOr<std::unique_ptr<Driver>> OpenDriver(std::string_view backend,
                                             const DriverOptions& options = {});

}  // namespace loom::vmm

#endif  // LOOM_VMM_DRIVER_FACTORY_H_
