// The stub libcuda's exported symbols: cuGetProcAddress with its table of
// versioned entry points, the error strings, a few entry points tests call
// directly (as ctypes would on the real library), and the stub's own
// functions (cuda_stub.h).
#ifndef LOOM_NO_CUDA_HEADERS  // else the stub is an empty library
#include <cstring>
#include <string>

#include "vmm/testing/cuda_stub.h"
#include "vmm/testing/cuda_stub_entries.h"
#include "vmm/testing/cuda_stub_state.h"

#define LOOM_STUB_EXPORT __attribute__((visibility("default")))

namespace loom::cuda_stub {
namespace {

// One variant of an entry point: handed out for requests of `version` or
// later (until the next variant's), with or without the per-thread default
// stream. The versions are those of cudaTypedefs.h's PFN_<name>_v<version>.
struct Entry {
  const char* name;
  int version;
  bool per_thread;
  void* function;
};

#define E(name, version, function) \
  { name, version, false, reinterpret_cast<void*>(&function) }
#define PT(name, version, function) \
  { name, version, true, reinterpret_cast<void*>(&function) }

CUresult GetErrorName(CUresult error, const char** text);
CUresult GetErrorString(CUresult error, const char** text);

const Entry kEntries[] = {
    E("cuInit", 2000, Init),
    E("cuDriverGetVersion", 2020, DriverGetVersion),
    E("cuGetErrorName", 6000, GetErrorName),
    E("cuGetErrorString", 6000, GetErrorString),
    E("cuDeviceGetCount", 2000, DeviceGetCount),
    E("cuDeviceGet", 2000, DeviceGet),
    E("cuDeviceGetName", 2000, DeviceGetName),
    E("cuDeviceTotalMem", 2000, DeviceTotalMem_v1),
    E("cuDeviceTotalMem", 3020, DeviceTotalMem_v2),
    E("cuDevicePrimaryCtxRetain", 7000, DevicePrimaryCtxRetain),
    E("cuDevicePrimaryCtxRelease", 7000, DevicePrimaryCtxRelease_v1),
    E("cuDevicePrimaryCtxRelease", 11000, DevicePrimaryCtxRelease_v2),
    E("cuCtxGetCurrent", 4000, CtxGetCurrent),
    E("cuCtxSetCurrent", 4000, CtxSetCurrent),
    E("cuCtxGetDevice", 2000, CtxGetDevice_v1),
    E("cuCtxGetDevice", 13000, CtxGetDevice_v2),
    E("cuCtxSynchronize", 2000, CtxSynchronize_v1),
    E("cuCtxSynchronize", 13000, CtxSynchronize_v2),
    E("cuDeviceCanAccessPeer", 4000, DeviceCanAccessPeer),
    E("cuMemGetInfo", 2000, MemGetInfo_v1),
    E("cuMemGetInfo", 3020, MemGetInfo_v2),
    E("cuMemGetAllocationGranularity", 10020, MemGetAllocationGranularity),
    E("cuMemCreate", 10020, MemCreate),
    E("cuMemRelease", 10020, MemRelease),
    E("cuMemAddressReserve", 10020, MemAddressReserve),
    E("cuMemAddressFree", 10020, MemAddressFree),
    E("cuMemMap", 10020, MemMap),
    E("cuMemUnmap", 10020, MemUnmap),
    E("cuMemSetAccess", 10020, MemSetAccess),
    E("cuStreamCreate", 2000, StreamCreate),
    E("cuStreamDestroy", 2000, StreamDestroy_v1),
    E("cuStreamDestroy", 4000, StreamDestroy_v2),
    E("cuStreamSynchronize", 2000, StreamSynchronize),
    PT("cuStreamSynchronize", 7000, StreamSynchronize_ptsz),
    E("cuEventCreate", 2000, EventCreate),
    E("cuEventDestroy", 2000, EventDestroy_v1),
    E("cuEventDestroy", 4000, EventDestroy_v2),
    E("cuEventRecord", 2000, EventRecord),
    PT("cuEventRecord", 7000, EventRecord_ptsz),
    E("cuEventQuery", 2000, EventQuery),
    E("cuEventSynchronize", 2000, EventSynchronize),
    E("cuStreamWaitEvent", 3020, StreamWaitEvent),
    PT("cuStreamWaitEvent", 7000, StreamWaitEvent_ptsz),
    E("cuMemcpyHtoD", 2000, MemcpyHtoD_v1),
    E("cuMemcpyHtoD", 3020, MemcpyHtoD_v2),
    PT("cuMemcpyHtoD", 7000, MemcpyHtoD_v2_ptds),
    E("cuMemcpyDtoH", 2000, MemcpyDtoH_v1),
    E("cuMemcpyDtoH", 3020, MemcpyDtoH_v2),
    PT("cuMemcpyDtoH", 7000, MemcpyDtoH_v2_ptds),
    E("cuMemsetD8", 2000, MemsetD8_v1),
    E("cuMemsetD8", 3020, MemsetD8_v2),
    PT("cuMemsetD8", 7000, MemsetD8_v2_ptds),
    E("cuMemsetD8Async", 3020, MemsetD8Async),
    PT("cuMemsetD8Async", 7000, MemsetD8Async_ptsz),
    E("cuMemcpyDtoHAsync", 2000, MemcpyDtoHAsync_v1),
    E("cuMemcpyDtoHAsync", 3020, MemcpyDtoHAsync_v2),
    PT("cuMemcpyDtoHAsync", 7000, MemcpyDtoHAsync_v2_ptsz),
};

#undef E
#undef PT

// The variant handed out for (name, version, flags), as the driver picks
// it: the newest one not above `version` nor the driver's own version,
// per-thread when asked for and one exists.
CUresult Lookup(const State& s, const char* name, int version, cuuint64_t flags,
                void** out, CUdriverProcAddressQueryResult* status) {
  const int limit = std::min(version, s.config.driver_version);
  const bool want_per_thread =
      (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  const Entry* best = nullptr;
  bool named = false;
  for (const bool per_thread : {want_per_thread, false}) {
    for (const Entry& e : kEntries) {
      if (std::strcmp(e.name, name) != 0) continue;
      named = true;
      if (e.per_thread != per_thread || e.version > limit) continue;
      if (best == nullptr || e.version > best->version) best = &e;
    }
    if (best != nullptr) break;
  }
  *out = best != nullptr ? best->function : nullptr;
  *status = best != nullptr ? CU_GET_PROC_ADDRESS_SUCCESS
            : named         ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                            : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return best != nullptr ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult GetProcAddress(const char* variant, const char* symbol, void** pfn,
                        int version, cuuint64_t flags,
                        CUdriverProcAddressQueryResult* status) {
  State& s = TheState();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.initialised) s.config = ConfigFromEnvironment();
  const std::string args =
      Args("%s, %d, %llu", symbol != nullptr ? symbol : "(null)", version,
           static_cast<unsigned long long>(flags));
  if (symbol == nullptr || pfn == nullptr) {
    return Record(s, variant, args, CUDA_ERROR_INVALID_VALUE);
  }
  CUdriverProcAddressQueryResult found;
  const CUresult result = Lookup(s, symbol, version, flags, pfn, &found);
  if (status != nullptr) *status = found;
  return Record(s, variant, args, result);
}

struct ErrorText {
  CUresult code;
  const char* text;
};
constexpr ErrorText kErrorTexts[] = {
    {CUDA_SUCCESS, "no error"},
    {CUDA_ERROR_INVALID_VALUE, "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "initialization error"},
    {CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "invalid device context"},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed"},
    {CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered"},
    {CUDA_ERROR_NOT_SUPPORTED, "operation not supported"},
};

CUresult GetErrorName(CUresult error, const char** text) {
  if (text == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *text = ResultName(error);
  return *text != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult GetErrorString(CUresult error, const char** text) {
  if (text == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (const ErrorText& e : kErrorTexts) {
    if (e.code == error) {
      *text = e.text;
      return CUDA_SUCCESS;
    }
  }
  *text = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

size_t CopyOut(const std::string& text, char* out, size_t capacity) {
  if (out != nullptr && capacity > 0) {
    const size_t n = std::min(capacity - 1, text.size());
    std::memcpy(out, text.data(), n);
    out[n] = '\0';
  }
  return text.size();
}

template <typename Lines>
std::string Joined(const Lines& lines) {
  std::string text;
  for (const auto& line : lines) text += line + "\n";
  return text;
}

}  // namespace
}  // namespace loom::cuda_stub

// cuda.h renames cuGetProcAddress to its _v2 (five arguments); the library
// exports both, under their own names.
#undef cuGetProcAddress

using loom::cuda_stub::State;
using loom::cuda_stub::TheState;

extern "C" {

LOOM_STUB_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn,
                                           int version, cuuint64_t flags) {
  return loom::cuda_stub::GetProcAddress("cuGetProcAddress", symbol, pfn,
                                         version, flags, nullptr);
}

LOOM_STUB_EXPORT CUresult
cuGetProcAddress_v2(const char* symbol, void** pfn, int version,
                    cuuint64_t flags, CUdriverProcAddressQueryResult* status) {
  return loom::cuda_stub::GetProcAddress("cuGetProcAddress_v2", symbol, pfn,
                                         version, flags, status);
}

LOOM_STUB_EXPORT CUresult cuGetErrorName(CUresult error, const char** text) {
  return loom::cuda_stub::GetErrorName(error, text);
}

LOOM_STUB_EXPORT CUresult cuGetErrorString(CUresult error, const char** text) {
  return loom::cuda_stub::GetErrorString(error, text);
}

// What a test does in PyTorch's place (e.g. make the primary context
// current on its thread), under the names the real library exports.
LOOM_STUB_EXPORT CUresult cuInit(unsigned int flags) {
  return loom::cuda_stub::Init(flags);
}
LOOM_STUB_EXPORT CUresult cuDriverGetVersion(int* version) {
  return loom::cuda_stub::DriverGetVersion(version);
}
LOOM_STUB_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  return loom::cuda_stub::DeviceGet(device, ordinal);
}
LOOM_STUB_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx,
                                                   CUdevice device) {
  return loom::cuda_stub::DevicePrimaryCtxRetain(ctx, device);
}
LOOM_STUB_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice device) {
  return loom::cuda_stub::DevicePrimaryCtxRelease_v2(device);
}
LOOM_STUB_EXPORT CUresult cuCtxGetCurrent(CUcontext* ctx) {
  return loom::cuda_stub::CtxGetCurrent(ctx);
}
LOOM_STUB_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  return loom::cuda_stub::CtxSetCurrent(ctx);
}

LOOM_STUB_EXPORT void loom_stub_set_logging(int on) {
  State& s = TheState();
  std::lock_guard<std::mutex> lock(s.mu);
  s.logging = on != 0;
}

LOOM_STUB_EXPORT void loom_stub_clear(void) {
  State& s = TheState();
  std::lock_guard<std::mutex> lock(s.mu);
  s.log.clear();
  s.counts.clear();
  s.problems.clear();
}

LOOM_STUB_EXPORT size_t loom_stub_read_log(char* out, size_t capacity) {
  State& s = TheState();
  std::lock_guard<std::mutex> lock(s.mu);
  return loom::cuda_stub::CopyOut(loom::cuda_stub::Joined(s.log), out,
                                  capacity);
}

LOOM_STUB_EXPORT size_t loom_stub_read_problems(char* out, size_t capacity) {
  State& s = TheState();
  std::lock_guard<std::mutex> lock(s.mu);
  return loom::cuda_stub::CopyOut(loom::cuda_stub::Joined(s.problems), out,
                                  capacity);
}

LOOM_STUB_EXPORT size_t loom_stub_read_counts(char* out, size_t capacity) {
  State& s = TheState();
  std::lock_guard<std::mutex> lock(s.mu);
  std::string text;
  for (const auto& [variant, n] : s.counts) {
    text += variant + " " + std::to_string(n) + "\n";
  }
  return loom::cuda_stub::CopyOut(text, out, capacity);
}

LOOM_STUB_EXPORT uint64_t loom_stub_faults(void) {
  State& s = TheState();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.faults;
}

LOOM_STUB_EXPORT void loom_stub_live(uint64_t out[6]) {
  State& s = TheState();
  std::lock_guard<std::mutex> lock(s.mu);
  uint64_t streams = 0, events = 0, retains = 0;
  for (const auto& stream : s.streams) {
    bool is_null = false;
    for (const auto& ctx : s.primary)
      is_null |= ctx->null_stream == stream.get();
    streams += !is_null && !stream->destroyed && stream->ctx->active;
  }
  for (const auto& event : s.events) {
    events += !event->destroyed && event->ctx->active;
  }
  for (const auto& ctx : s.primary) retains += ctx->refcount;
  out[0] = s.handles.size();
  out[1] = s.reservations.size();
  out[2] = s.mappings.size();
  out[3] = streams;
  out[4] = events;
  out[5] = retains;
}

}  // extern "C"

#endif  // LOOM_NO_CUDA_HEADERS
