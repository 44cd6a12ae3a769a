// CudaStub: a test's handle on the stub libcuda (cuda_stub.h) that loom's
// CudaDriver loads when LOOM_LIBCUDA names it: the stub's record of calls,
// its counters and problems, and the calls a test makes in PyTorch's place
// (retain a device's primary context, make it current on this thread).
//
// The library is opened with dlopen on the same path as the CudaDriver, so
// both see the one copy. Thread-safe (the stub is).
#ifndef LOOM_VMM_TESTING_CUDA_STUB_CLIENT_H_
#define LOOM_VMM_TESTING_CUDA_STUB_CLIENT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/status.h"

namespace loom::vmm::testing {

class CudaStub {
 public:
  // The stub $LOOM_LIBCUDA names (the test targets set it), opened once.
  // UNAVAILABLE if the variable is unset or the library is not the stub.
  static StatusOr<CudaStub*> Get();

  const std::string& path() const { return path_; }

  void SetLogging(bool on);
  // Forgets the record, the counts and the problems (not the faults).
  void Clear();
  // "variant(args) -> CUDA_RESULT", one per call while logging was on.
  std::vector<std::string> Log() const;
  // Misuse the stub noticed (an argument that is no context, a 32-bit entry
  // point called, queued work that faulted), one line each.
  std::vector<std::string> Problems() const;
  // Calls per variant ("cuCtxSynchronize", "cuCtxSynchronize_v2", ...).
  std::map<std::string, uint64_t> Counts() const;
  uint64_t Count(const std::string& variant) const;
  uint64_t faults() const;

  struct Live {
    uint64_t handles = 0, reservations = 0, mappings = 0, streams = 0,
             events = 0, primary_retains = 0;
  };
  Live live() const;

  // PyTorch's side of the process: cuInit, then the primary context of
  // `device` retained (as the CUDA runtime does) or released.
  void* RetainPrimary(int device);
  void ReleasePrimary(int device);
  // This thread's current context (cuCtxGetCurrent / cuCtxSetCurrent).
  void* Current() const;
  void SetCurrent(void* ctx);

 private:
  CudaStub() = default;
  std::string Read(size_t (*reader)(char*, size_t)) const;

  std::string path_;
  void* library_ = nullptr;
  void (*set_logging_)(int) = nullptr;
  void (*clear_)() = nullptr;
  size_t (*read_log_)(char*, size_t) = nullptr;
  size_t (*read_problems_)(char*, size_t) = nullptr;
  size_t (*read_counts_)(char*, size_t) = nullptr;
  uint64_t (*faults_)() = nullptr;
  void (*live_)(uint64_t*) = nullptr;
  int (*init_)(unsigned) = nullptr;
  int (*device_get_)(int*, int) = nullptr;
  int (*retain_)(void**, int) = nullptr;
  int (*release_)(int) = nullptr;
  int (*get_current_)(void**) = nullptr;
  int (*set_current_)(void*) = nullptr;
};

}  // namespace loom::vmm::testing

#endif  // LOOM_VMM_TESTING_CUDA_STUB_CLIENT_H_
