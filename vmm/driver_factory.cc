#include "vmm/driver_factory.h"

#include "vmm/async_host_driver.h"
#include "vmm/cuda_driver.h"
#include "vmm/fake_driver.h"
#include "vmm/host_driver.h"

namespace loom::vmm {

StatusOr<std::unique_ptr<Driver>> OpenDriver(std::string_view backend,
                                             const DriverOptions& options) {
  if (backend == "cuda") {
    LOOM_ASSIGN_OR_RETURN(std::unique_ptr<CudaDriver> driver,
                          CudaDriver::Open());
    return std::unique_ptr<Driver>(std::move(driver));
  }
  if (backend == "host" || backend == "async") {
    HostDriverOptions host;
    host.granularity = options.granularity;
    host.device_count = options.device_count;
    host.capacity_per_device = options.capacity_per_device;
    if (backend == "async") {
      LOOM_ASSIGN_OR_RETURN(std::unique_ptr<AsyncHostDriver> driver,
                            AsyncHostDriver::Open(host));
      return std::unique_ptr<Driver>(std::move(driver));
    }
    LOOM_ASSIGN_OR_RETURN(std::unique_ptr<HostDriver> driver,
                          HostDriver::Open(host));
    return std::unique_ptr<Driver>(std::move(driver));
  }
  if (backend == "fake") {
    if (options.granularity == 0 || options.granularity % 4096 != 0 ||
        options.device_count <= 0) {
      return InvalidArgumentError(
          "fake driver: granularity {} must be a positive multiple of 4096 and "
          "device count {} positive",
          options.granularity, options.device_count);
    }
    FakeDriverOptions fake;
    fake.granularity = options.granularity;
    fake.device_count = options.device_count;
    fake.capacity_per_device = options.capacity_per_device;
    return std::unique_ptr<Driver>(std::make_unique<FakeDriver>(fake));
  }
  return InvalidArgumentError(
      "unknown driver backend '{}' (cuda, host, async or fake)", backend);
}

}  // namespace loom::vmm
