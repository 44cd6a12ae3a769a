// CudaDriver: the Driver backend for real NVIDIA GPUs.
//
// libcuda.so.1 is loaded at run time (dlopen) and every entry point is
// resolved through cuGetProcAddress, each at the CUDA version whose
// signature loom calls (docs/driver_contract.md); nothing links libcuda, so
// every loom binary starts on a machine without a GPU and Open() reports
// "no CUDA driver" there. Every CUresult becomes a Status carrying the
// driver's own error name and string (e.g. "cuMemCreate(2097152 bytes,
// device 0): CUDA_ERROR_OUT_OF_MEMORY: out of memory"). Physical memory is
// pinned device memory (CU_MEM_ALLOCATION_TYPE_PINNED) without shareable
// handle types.
// Calls run in the device's primary context: if the calling thread has
// another context current (or none), it is switched for the call and
// restored after; a thread with the device's primary context current (as
// PyTorch's are) keeps it.
// Built without CUDA headers (LOOM_NO_CUDA_HEADERS), Open() always fails.
#ifndef LOOM_VMM_CUDA_DRIVER_H_
#define LOOM_VMM_CUDA_DRIVER_H_

#include <memory>
#include <string>

#include "vmm/driver.h"

namespace loom::vmm {

class CudaDriver final : public Driver {
 public:
  // Loads the driver and initialises it: the library $LOOM_LIBCUDA names if
  // set (tests point it at vmm/testing's stub libcuda), else libcuda.so.1.
  // Errors: UNAVAILABLE with a message starting "no CUDA driver" when the
  // library cannot be loaded or lacks entry points; UNAVAILABLE "no CUDA
  // device" when cuInit finds none.
  static StatusOr<std::unique_ptr<CudaDriver>> Open();
  // The same with the library named (a path, or a name dlopen searches).
  static StatusOr<std::unique_ptr<CudaDriver>> Open(const std::string& library);
  ~CudaDriver() override;

  std::string_view name() const override { return "cuda"; }
  bool holds_data() const override { return true; }

  // The driver's version (e.g. 13000), as cuDriverGetVersion reports it.
  int driver_version() const;

  struct Api;  // the resolved entry points (cuda_driver.cc)

 protected:
  StatusOr<int> DoDeviceCount() override;
  StatusOr<DeviceProperties> DoProperties(int device) override;
  StatusOr<uint64_t> DoGranularity(int device, Granularity kind) override;
  StatusOr<uint64_t> DoCreate(int device, uint64_t size) override;
  Status DoRelease(uint64_t handle) override;
  StatusOr<DevicePtr> DoReserve(uint64_t size, uint64_t alignment) override;
  Status DoUnreserve(DevicePtr ptr, uint64_t size) override;
  Status DoMap(DevicePtr ptr, uint64_t size, uint64_t handle,
               uint64_t offset) override;
  Status DoUnmap(DevicePtr ptr, uint64_t size) override;
  Status DoSetAccess(DevicePtr ptr, uint64_t size, int device,
                     std::span<const int> peers) override;
  StatusOr<bool> DoCanAccessPeer(int device, int peer) override;
  StatusOr<Stream> DoCreateStream(int device) override;
  Status DoDestroyStream(Stream stream) override;
  Status DoSynchronizeStream(Stream stream) override;
  StatusOr<uint64_t> DoCreateEvent(int device) override;
  Status DoDestroyEvent(uint64_t event) override;
  Status DoRecordEvent(uint64_t event, Stream stream) override;
  StatusOr<bool> DoQueryEvent(uint64_t event) override;
  Status DoSynchronizeEvent(uint64_t event) override;
  Status DoStreamWaitEvent(Stream stream, uint64_t event) override;
  Status DoSynchronizeDevice(int device) override;
  Status DoCopyToDevice(DevicePtr dst, const void* src, uint64_t size) override;
  Status DoCopyToHost(void* dst, DevicePtr src, uint64_t size) override;
  Status DoMemset(DevicePtr dst, uint8_t value, uint64_t size) override;
  Status DoMemsetAsync(DevicePtr dst, uint8_t value, uint64_t size,
                       Stream stream, int device) override;
  Status DoCopyToHostAsync(void* dst, DevicePtr src, uint64_t size,
                           Stream stream, int device) override;

 private:
  explicit CudaDriver(std::unique_ptr<Api> api);
  std::unique_ptr<Api> api_;
};

}  // namespace loom::vmm

#endif  // LOOM_VMM_CUDA_DRIVER_H_
