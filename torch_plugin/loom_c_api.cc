// The C ABI of libloom.so (see loom_c_api.h): thin wrappers over Runtime that
// turn every failure, including a C++ exception, into a code and a message;
// loom_torch_malloc alone turns a failure into an exception, for PyTorch.
#include "torch_plugin/loom_c_api.h"

#include <fmt/format.h>

#include <cstring>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>

#include "torch_plugin/host_timing.h"
#include "torch_plugin/runtime.h"

#define LOOM_EXPORT __attribute__((visibility("default")))

namespace {

using loom::Status;
using loom::StatusCode;
using loom::plugin::Entry;
using loom::plugin::HostTiming;
using loom::plugin::Runtime;
using loom::plugin::SetLastError;

int Code(const Status& status) {
  if (!status.ok()) SetLastError(status);
  return static_cast<int>(status.code());
}

// Runs `body` (returning Status) with no exception escaping.
template <typename Body>
int Guarded(Body&& body) {
  try {
    return Code(body());
  } catch (const std::bad_alloc&) {
    return Code(loom::OutOfMemoryError("host memory exhausted"));
  } catch (const std::exception& e) {
    return Code(loom::InternalError("unexpected exception: {}", e.what()));
  } catch (...) {
    return Code(loom::InternalError("unexpected exception"));
  }
}

loom::vmm::Stream AsStream(void* stream) {
  return static_cast<loom::vmm::Stream>(reinterpret_cast<uintptr_t>(stream));
}

// One allocation for loom_malloc and loom_torch_malloc.
Status Malloc(ssize_t size, int device, void* stream, void** out) {
  if (size < 0) return loom::InvalidArgumentError("negative size {}", size);
  if (size == 0) return loom::OkStatus();  // PyTorch never asks; nullptr
  LOOM_ASSIGN_OR_RETURN(loom::vmm::Allocator * a,
                        Runtime::Get().AllocatorFor(device));
  LOOM_ASSIGN_OR_RETURN(
      loom::vmm::DevicePtr ptr,
      a->Allocate(static_cast<uint64_t>(size), AsStream(stream)));
  *out = reinterpret_cast<void*>(ptr);
  return loom::OkStatus();
}

// What loom_torch_malloc throws for a failure of `code` whose status text is
// `reason` ("OUT_OF_MEMORY: ..."): PyTorch's wording for out of memory, so
// code that recognises PyTorch's OOM recognises loom's.
std::string TorchMallocMessage(int code, std::string_view reason, ssize_t size,
                               int device) {
  if (code == static_cast<int>(StatusCode::kOutOfMemory)) {
    return fmt::format(
        "CUDA out of memory. loom could not allocate {} bytes on device {} "
        "({})",
        size, device, reason);
  }
  return fmt::format("loom: allocation of {} bytes on device {} failed ({})",
                     size, device, reason);
}

}  // namespace

extern "C" {

LOOM_EXPORT int loom_configure(const char* settings) {
  return Guarded([&] {
    if (settings == nullptr) return loom::InvalidArgumentError("null settings");
    return Runtime::Get().Configure(settings);
  });
}

LOOM_EXPORT void* loom_malloc(ssize_t size, int device, void* stream) {
  void* result = nullptr;
  HostTiming::Get().Time(Entry::kMalloc, [&] {
    return Guarded([&] { return Malloc(size, device, stream, &result); });
  });
  return result;
}

LOOM_EXPORT void* loom_torch_malloc(ssize_t size, int device, void* stream) {
  void* result = nullptr;
  const int code = HostTiming::Get().Time(Entry::kMalloc, [&] {
    return Guarded([&] { return Malloc(size, device, stream, &result); });
  });
  if (code == 0) return result;
  // The one exception that crosses the C ABI (see loom_c_api.h): thrown
  // with no lock held and nothing allocated. The guard has recorded the
  // failure (an exception inside it included) as this thread's last error.
  throw std::runtime_error(
      TorchMallocMessage(code, loom::plugin::LastError(), size, device));
}

LOOM_EXPORT void loom_free(void* ptr, ssize_t size, int device, void* stream) {
  (void)size;
  (void)stream;
  HostTiming::Get().Time(Entry::kFree, [&] {
    return Guarded([&]() -> Status {
      if (ptr == nullptr) return loom::OkStatus();
      LOOM_ASSIGN_OR_RETURN(loom::vmm::Allocator * a,
                            Runtime::Get().AllocatorFor(device));
      Status status = a->Free(reinterpret_cast<uintptr_t>(ptr));
      if (!status.ok()) {
        // A free PyTorch believes valid is a bug somewhere: say so loudly, and
        // never release memory we cannot account for.
        fmt::print(stderr, "loom: {}\n", status.ToString());
      }
      return status;
    });
  });
}

LOOM_EXPORT void loom_record_stream(void* ptr, void* stream) {
  HostTiming::Get().Time(Entry::kRecordStream, [&] {
    return Guarded([&]() -> Status {
      for (loom::vmm::Allocator* a : Runtime::Get().Allocators()) {
        Status status =
            a->RecordStream(reinterpret_cast<uintptr_t>(ptr), AsStream(stream));
        if (status.ok()) return status;
      }
      return loom::InvalidArgumentError(
          "record_stream on {}, not a live loom allocation", ptr);
    });
  });
}

LOOM_EXPORT void loom_empty_cache(void) {
  Guarded([&]() -> Status {
    Status result;
    for (loom::vmm::Allocator* a : Runtime::Get().Allocators()) {
      Status status = a->EmptyCache();
      if (!status.ok()) result = status;
    }
    return result;
  });
}

LOOM_EXPORT void loom_set_memory_fraction(double fraction, int device) {
  Guarded([&] { return Runtime::Get().SetMemoryFraction(fraction, device); });
}

namespace {

loom::vmm::Allocator::PoolId AsPoolId(
    std::pair<unsigned long long, unsigned long long> pool) {
  return {pool.first, pool.second};
}

void ReportPoolFailure(const char* hook, int code) {
  if (code != 0) {
    fmt::print(stderr, "loom: {} failed: {}\n", hook,
               loom::plugin::LastError());
  }
}

}  // namespace

LOOM_EXPORT void loom_begin_allocate_to_pool(
    int device, std::pair<unsigned long long, unsigned long long> pool,
    std::function<bool(CUstream_st*)> filter) {
  ReportPoolFailure(
      "begin_allocate_to_pool", Guarded([&]() -> Status {
        LOOM_ASSIGN_OR_RETURN(loom::vmm::Allocator * a,
                              Runtime::Get().AllocatorFor(device));
        auto stream_filter = [filter = std::move(filter)](loom::vmm::Stream s) {
          return filter(reinterpret_cast<CUstream_st*>(s));
        };
        return a->BeginAllocateToPool(AsPoolId(pool), stream_filter);
      }));
}

LOOM_EXPORT void loom_end_allocate_to_pool(
    int device, std::pair<unsigned long long, unsigned long long> pool) {
  ReportPoolFailure("end_allocate_to_pool", Guarded([&]() -> Status {
                      LOOM_ASSIGN_OR_RETURN(
                          loom::vmm::Allocator * a,
                          Runtime::Get().AllocatorFor(device));
                      return a->EndAllocateToPool(AsPoolId(pool));
                    }));
}

LOOM_EXPORT void loom_release_pool(
    int device, std::pair<unsigned long long, unsigned long long> pool) {
  ReportPoolFailure("release_pool", Guarded([&]() -> Status {
                      LOOM_ASSIGN_OR_RETURN(
                          loom::vmm::Allocator * a,
                          Runtime::Get().AllocatorFor(device));
                      return a->ReleasePool(AsPoolId(pool));
                    }));
}

LOOM_EXPORT void loom_iteration_begin(long long iteration) {
  Guarded([&] {
    Runtime::Get().IterationBegin(static_cast<uint64_t>(iteration));
    return loom::OkStatus();
  });
}

LOOM_EXPORT void loom_iteration_end(long long iteration) {
  Guarded([&] {
    Runtime::Get().IterationEnd(static_cast<uint64_t>(iteration));
    return loom::OkStatus();
  });
}

LOOM_EXPORT void loom_phase(const char* name) {
  if (name == nullptr) return;
  Guarded([&] {
    Runtime::Get().Phase(name);
    return loom::OkStatus();
  });
}

LOOM_EXPORT void loom_module_enter(const char* name, int dynamic) {
  if (name == nullptr) return;
  Guarded([&] {
    Runtime::Get().ModuleEnter(name, dynamic != 0);
    return loom::OkStatus();
  });
}

LOOM_EXPORT void loom_module_exit(const char* name) {
  if (name == nullptr) return;
  Guarded([&] {
    Runtime::Get().ModuleExit(name);
    return loom::OkStatus();
  });
}

LOOM_EXPORT int loom_init_device(int device) {
  return Guarded([&] { return Runtime::Get().AllocatorFor(device).status(); });
}

LOOM_EXPORT int loom_stop_recording(void) {
  return Guarded([&] {
    Runtime::Get().StopRecording();
    return loom::OkStatus();
  });
}

LOOM_EXPORT int loom_load_plan(int device, const char* path) {
  return Guarded([&] {
    if (path == nullptr) return loom::InvalidArgumentError("null plan path");
    return Runtime::Get().LoadPlan(device, path);
  });
}

LOOM_EXPORT int loom_write_trace(int device, const char* path) {
  return Guarded([&] {
    if (path == nullptr) return loom::InvalidArgumentError("null trace path");
    return Runtime::Get().WriteTrace(device, path);
  });
}

LOOM_EXPORT long long loom_stats_json(int device, char* buffer,
                                      size_t capacity) {
  long long length = -1;
  Guarded([&]() -> Status {
    if (device < 0) return loom::InvalidArgumentError("bad device {}", device);
    // A device that has served nothing has all-zero stats.
    std::string json = Runtime::Get().StatsJson(device);
    length = static_cast<long long>(json.size());
    if (buffer != nullptr && capacity > 0) {
      size_t n = std::min(capacity - 1, json.size());
      std::memcpy(buffer, json.data(), n);
      buffer[n] = '\0';
    }
    return loom::OkStatus();
  });
  return length;
}

LOOM_EXPORT int loom_reset_peak_stats(int device) {
  return Guarded([&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(loom::vmm::Allocator * a,
                          Runtime::Get().AllocatorFor(device));
    a->ResetPeakStats();
    return loom::OkStatus();
  });
}

LOOM_EXPORT int loom_check_invariants(int device) {
  return Guarded([&]() -> Status {
    LOOM_ASSIGN_OR_RETURN(loom::vmm::Allocator * a,
                          Runtime::Get().AllocatorFor(device));
    a->CheckInvariants();
    return loom::OkStatus();
  });
}

LOOM_EXPORT int loom_shutdown(void) {
  return Guarded([&] { return Runtime::Get().Shutdown(); });
}

LOOM_EXPORT const char* loom_last_error(void) {
  return loom::plugin::LastError();
}

LOOM_EXPORT const char* loom_version(void) { return "0.1.0"; }

}  // extern "C"
