#include "vmm/cuda_driver.h"

#ifndef LOOM_NO_CUDA_HEADERS
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#endif

#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace loom::vmm {

#ifdef LOOM_NO_CUDA_HEADERS

struct CudaDriver::Api {};

StatusOr<std::unique_ptr<CudaDriver>> CudaDriver::Open() {
  return Open(std::string());
}
StatusOr<std::unique_ptr<CudaDriver>> CudaDriver::Open(const std::string&) {
  return UnavailableError(
      "no CUDA driver support: loom was built without CUDA headers "
      "(set LOOM_CUDA_PATH to a CUDA toolkit and rebuild)");
}
CudaDriver::CudaDriver(std::unique_ptr<Api> api) : api_(std::move(api)) {}
CudaDriver::~CudaDriver() = default;
int CudaDriver::driver_version() const { return 0; }
#define LOOM_NO_CUDA(...) return InternalError("CUDA backend unavailable")
StatusOr<int> CudaDriver::DoDeviceCount() { LOOM_NO_CUDA(); }
StatusOr<DeviceProperties> CudaDriver::DoProperties(int) { LOOM_NO_CUDA(); }
StatusOr<uint64_t> CudaDriver::DoGranularity(int, Granularity) {
  LOOM_NO_CUDA();
}
StatusOr<uint64_t> CudaDriver::DoCreate(int, uint64_t) { LOOM_NO_CUDA(); }
Status CudaDriver::DoRelease(uint64_t) { LOOM_NO_CUDA(); }
StatusOr<DevicePtr> CudaDriver::DoReserve(uint64_t, uint64_t) {
  LOOM_NO_CUDA();
}
Status CudaDriver::DoUnreserve(DevicePtr, uint64_t) { LOOM_NO_CUDA(); }
Status CudaDriver::DoMap(DevicePtr, uint64_t, uint64_t, uint64_t) {
  LOOM_NO_CUDA();
}
Status CudaDriver::DoUnmap(DevicePtr, uint64_t) { LOOM_NO_CUDA(); }
Status CudaDriver::DoSetAccess(DevicePtr, uint64_t, int, std::span<const int>) {
  LOOM_NO_CUDA();
}
StatusOr<bool> CudaDriver::DoCanAccessPeer(int, int) { LOOM_NO_CUDA(); }
StatusOr<Stream> CudaDriver::DoCreateStream(int) { LOOM_NO_CUDA(); }
Status CudaDriver::DoDestroyStream(Stream) { LOOM_NO_CUDA(); }
Status CudaDriver::DoSynchronizeStream(Stream) { LOOM_NO_CUDA(); }
StatusOr<uint64_t> CudaDriver::DoCreateEvent(int) { LOOM_NO_CUDA(); }
Status CudaDriver::DoDestroyEvent(uint64_t) { LOOM_NO_CUDA(); }
Status CudaDriver::DoRecordEvent(uint64_t, Stream) { LOOM_NO_CUDA(); }
StatusOr<bool> CudaDriver::DoQueryEvent(uint64_t) { LOOM_NO_CUDA(); }
Status CudaDriver::DoSynchronizeEvent(uint64_t) { LOOM_NO_CUDA(); }
Status CudaDriver::DoStreamWaitEvent(Stream, uint64_t) { LOOM_NO_CUDA(); }
Status CudaDriver::DoSynchronizeDevice(int) { LOOM_NO_CUDA(); }
Status CudaDriver::DoCopyToDevice(DevicePtr, const void*, uint64_t) {
  LOOM_NO_CUDA();
}
Status CudaDriver::DoCopyToHost(void*, DevicePtr, uint64_t) { LOOM_NO_CUDA(); }
Status CudaDriver::DoMemset(DevicePtr, uint8_t, uint64_t) { LOOM_NO_CUDA(); }
Status CudaDriver::DoMemsetAsync(DevicePtr, uint8_t, uint64_t, Stream, int) {
  LOOM_NO_CUDA();
}
Status CudaDriver::DoCopyToHostAsync(void*, DevicePtr, uint64_t, Stream, int) {
  LOOM_NO_CUDA();
}
#undef LOOM_NO_CUDA

#else  // LOOM_NO_CUDA_HEADERS

// Every driver entry point loom uses, each with the CUDA version whose ABI
// the code below calls (docs/driver_contract.md has the table and the
// reasons). cuGetProcAddress hands out the newest variant not above the
// version asked for, and a variant may change the signature without cuda.h
// saying so: asked at 13000, cuCtxSynchronize is cuCtxSynchronize_v2, which
// takes a CUcontext. So every pointer has the type cudaTypedefs.h gives
// that exact version (PFN_<name>_v<version>): asking for one version and
// calling another's signature cannot compile. The name is the API name
// (before cuda.h's _v2 renaming), as cuGetProcAddress expects. Resolved
// for the legacy default stream, as PyTorch's streams are.
#define LOOM_CUDA_ENTRY_POINTS(X)         \
  X(cuInit, 2000)                         \
  X(cuDriverGetVersion, 2020)             \
  X(cuDeviceGetCount, 2000)               \
  X(cuDeviceGet, 2000)                    \
  X(cuDeviceGetName, 2000)                \
  X(cuDeviceTotalMem, 3020)               \
  X(cuDevicePrimaryCtxRetain, 7000)       \
  X(cuDevicePrimaryCtxRelease, 11000)     \
  X(cuCtxGetCurrent, 4000)                \
  X(cuCtxSetCurrent, 4000)                \
  X(cuCtxGetDevice, 2000)                 \
  X(cuCtxSynchronize, 2000)               \
  X(cuDeviceCanAccessPeer, 4000)          \
  X(cuMemGetInfo, 3020)                   \
  X(cuMemGetAllocationGranularity, 10020) \
  X(cuMemCreate, 10020)                   \
  X(cuMemRelease, 10020)                  \
  X(cuMemAddressReserve, 10020)           \
  X(cuMemAddressFree, 10020)              \
  X(cuMemMap, 10020)                      \
  X(cuMemUnmap, 10020)                    \
  X(cuMemSetAccess, 10020)                \
  X(cuStreamCreate, 2000)                 \
  X(cuStreamDestroy, 4000)                \
  X(cuStreamSynchronize, 2000)            \
  X(cuEventCreate, 2000)                  \
  X(cuEventDestroy, 4000)                 \
  X(cuEventRecord, 2000)                  \
  X(cuEventQuery, 2000)                   \
  X(cuEventSynchronize, 2000)             \
  X(cuStreamWaitEvent, 3020)              \
  X(cuMemcpyHtoD, 3020)                   \
  X(cuMemcpyDtoH, 3020)                   \
  X(cuMemsetD8, 3020)                     \
  X(cuMemsetD8Async, 3020)                \
  X(cuMemcpyDtoHAsync, 3020)

struct CudaDriver::Api {
  void* library = nullptr;
  int version = 0;
  PFN_cuGetErrorName_v6000 get_error_name = nullptr;
  PFN_cuGetErrorString_v6000 get_error_string = nullptr;
#define LOOM_DECLARE(name, version) PFN_##name##_v##version name = nullptr;
  LOOM_CUDA_ENTRY_POINTS(LOOM_DECLARE)
#undef LOOM_DECLARE
  std::mutex context_mu;
  std::vector<CUcontext> primary;  // retained primary context per device
  // The device of each event and stream created here, so that every call
  // on them runs in that device's context (docs/driver_contract.md).
  std::mutex objects_mu;
  std::unordered_map<uint64_t, int> event_device;
  std::unordered_map<uint64_t, int> stream_device;

  int EventDevice(uint64_t event) {
    std::lock_guard<std::mutex> lock(objects_mu);
    auto it = event_device.find(event);
    return it == event_device.end() ? kAnyDevice : it->second;
  }
  // Streams PyTorch created are unknown here: any current context serves.
  int StreamDevice(uint64_t stream) {
    std::lock_guard<std::mutex> lock(objects_mu);
    auto it = stream_device.find(stream);
    return it == stream_device.end() ? kAnyDevice : it->second;
  }
  // The same for work on `device`'s memory: stream 0, the legacy default
  // stream, is the one of the context current at the call, so the call
  // must run in `device`'s context to be ordered with that device's
  // default-stream work (a thread may have another device's context
  // current, or none: then device 0's would be used).
  int StreamDevice(uint64_t stream, int device) {
    if (stream == 0) return device;
    return StreamDevice(stream);
  }

  ~Api() {
    if (cuDevicePrimaryCtxRelease != nullptr) {
      for (size_t d = 0; d < primary.size(); ++d) {
        if (primary[d] != nullptr) {
          CUdevice device;
          if (cuDeviceGet(&device, static_cast<int>(d)) == CUDA_SUCCESS) {
            cuDevicePrimaryCtxRelease(device);
          }
        }
      }
    }
    if (library != nullptr) dlclose(library);
  }

  // "CUDA_ERROR_X: description" for a result code.
  std::string Describe(CUresult result) const {
    const char* name = nullptr;
    const char* text = nullptr;
    if (get_error_name == nullptr ||
        get_error_name(result, &name) != CUDA_SUCCESS) {
      name = nullptr;
    }
    if (get_error_string == nullptr ||
        get_error_string(result, &text) != CUDA_SUCCESS) {
      text = nullptr;
    }
    return fmt::format(
        "{}: {}",
        name ? name : fmt::format("CUresult {}", static_cast<int>(result)),
        text ? text : "unknown error");
  }

  // Turns a CUresult into a Status; `call` says what was attempted.
  Status Check(CUresult result, std::string_view call) const {
    if (result == CUDA_SUCCESS) return OkStatus();
    std::string message = fmt::format("{}: {}", call, Describe(result));
    switch (result) {
      case CUDA_ERROR_OUT_OF_MEMORY:
        return Status(StatusCode::kOutOfMemory, message);
      case CUDA_ERROR_INVALID_VALUE:
      case CUDA_ERROR_INVALID_DEVICE:
      case CUDA_ERROR_INVALID_HANDLE:
        return Status(StatusCode::kInvalidArgument, message);
      case CUDA_ERROR_NOT_SUPPORTED:
        return Status(StatusCode::kUnimplemented, message);
      case CUDA_ERROR_NO_DEVICE:
      case CUDA_ERROR_NOT_INITIALIZED:
      case CUDA_ERROR_DEINITIALIZED:
        return Status(StatusCode::kUnavailable, message);
      default:
        return Status(StatusCode::kInternal, message);
    }
  }

  // Makes `device`'s primary context current for the lifetime of the guard,
  // restoring the caller's context afterwards. With kAnyDevice, any current
  // context is kept and device 0's primary context is used only if none is
  // current (for calls on unified addresses that need just some context).
  static constexpr int kAnyDevice = -1;
  class ScopedContext {
   public:
    ScopedContext(Api& api, int device) : api_(api) {
      status_ = api_.Check(api_.cuCtxGetCurrent(&previous_), "cuCtxGetCurrent");
      if (!status_.ok()) return;
      if (previous_ != nullptr) {
        if (device == kAnyDevice) return;
        CUdevice current;
        if (api_.cuCtxGetDevice(&current) == CUDA_SUCCESS &&
            current == device) {
          return;  // already in a context of this device
        }
      }
      if (device == kAnyDevice) device = 0;
      CUcontext context = nullptr;
      {
        std::lock_guard<std::mutex> lock(api_.context_mu);
        if (api_.primary.size() <= static_cast<size_t>(device)) {
          api_.primary.resize(device + 1, nullptr);
        }
        if (api_.primary[device] == nullptr) {
          CUdevice handle;
          status_ = api_.Check(api_.cuDeviceGet(&handle, device),
                               fmt::format("cuDeviceGet({})", device));
          if (!status_.ok()) return;
          status_ = api_.Check(
              api_.cuDevicePrimaryCtxRetain(&api_.primary[device], handle),
              fmt::format("cuDevicePrimaryCtxRetain(device {})", device));
          if (!status_.ok()) return;
        }
        context = api_.primary[device];
      }
      status_ = api_.Check(api_.cuCtxSetCurrent(context), "cuCtxSetCurrent");
      switched_ = status_.ok();
    }
    ~ScopedContext() {
      if (switched_) api_.cuCtxSetCurrent(previous_);
    }
    const Status& status() const { return status_; }

   private:
    Api& api_;
    CUcontext previous_ = nullptr;
    bool switched_ = false;
    Status status_;
  };
};

namespace {

CUmemAllocationProp DeviceAllocationProp(int device) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  return prop;
}

}  // namespace

StatusOr<std::unique_ptr<CudaDriver>> CudaDriver::Open() {
  const char* library = std::getenv("LOOM_LIBCUDA");
  return Open(library != nullptr && *library != '\0' ? library
                                                     : "libcuda.so.1");
}

StatusOr<std::unique_ptr<CudaDriver>> CudaDriver::Open(
    const std::string& library) {
  auto api = std::make_unique<Api>();
  api->library = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (api->library == nullptr) {
    const char* error = dlerror();
    return UnavailableError("no CUDA driver: cannot load {} ({})", library,
                            error ? error : "unknown dlopen error");
  }
  using GetProcV2 = CUresult (*)(const char*, void**, int, cuuint64_t,
                                 CUdriverProcAddressQueryResult*);
  using GetProcV1 = CUresult (*)(const char*, void**, int, cuuint64_t);
  auto get_v2 =
      reinterpret_cast<GetProcV2>(dlsym(api->library, "cuGetProcAddress_v2"));
  auto get_v1 =
      reinterpret_cast<GetProcV1>(dlsym(api->library, "cuGetProcAddress"));
  if (get_v2 == nullptr && get_v1 == nullptr) {
    return UnavailableError(
        "no CUDA driver: {} has no cuGetProcAddress (driver older than CUDA "
        "11.3)",
        library);
  }
  auto resolve = [&](const char* name, int version, void** pointer) -> Status {
    CUresult result;
    if (get_v2 != nullptr) {
      CUdriverProcAddressQueryResult found;
      result = get_v2(name, pointer, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM,
                      &found);
      if (result == CUDA_SUCCESS && found != CU_GET_PROC_ADDRESS_SUCCESS) {
        *pointer = nullptr;
      }
    } else {
      result =
          get_v1(name, pointer, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM);
    }
    if (result != CUDA_SUCCESS || *pointer == nullptr) {
      return UnavailableError("no CUDA driver: {} lacks {} (version {})",
                              library, name, version);
    }
    return OkStatus();
  };
  api->get_error_name = reinterpret_cast<PFN_cuGetErrorName_v6000>(
      dlsym(api->library, "cuGetErrorName"));
  api->get_error_string = reinterpret_cast<PFN_cuGetErrorString_v6000>(
      dlsym(api->library, "cuGetErrorString"));
#define LOOM_RESOLVE(name, version) \
  LOOM_RETURN_IF_ERROR(             \
      resolve(#name, version, reinterpret_cast<void**>(&api->name)));
  LOOM_CUDA_ENTRY_POINTS(LOOM_RESOLVE)
#undef LOOM_RESOLVE
  CUresult init = api->cuInit(0);
  if (init == CUDA_ERROR_NO_DEVICE) {
    return UnavailableError("no CUDA device: cuInit: {}", api->Describe(init));
  }
  LOOM_RETURN_IF_ERROR(api->Check(init, "cuInit"));
  LOOM_RETURN_IF_ERROR(
      api->Check(api->cuDriverGetVersion(&api->version), "cuDriverGetVersion"));
  return std::unique_ptr<CudaDriver>(new CudaDriver(std::move(api)));
}

CudaDriver::CudaDriver(std::unique_ptr<Api> api) : api_(std::move(api)) {}
CudaDriver::~CudaDriver() = default;

int CudaDriver::driver_version() const { return api_->version; }

StatusOr<int> CudaDriver::DoDeviceCount() {
  int count = 0;
  LOOM_RETURN_IF_ERROR(
      api_->Check(api_->cuDeviceGetCount(&count), "cuDeviceGetCount"));
  return count;
}

StatusOr<DeviceProperties> CudaDriver::DoProperties(int device) {
  DeviceProperties p;
  p.ordinal = device;
  CUdevice handle;
  LOOM_RETURN_IF_ERROR(
      api_->Check(api_->cuDeviceGet(&handle, device), "cuDeviceGet"));
  char name[256] = {};
  LOOM_RETURN_IF_ERROR(
      api_->Check(api_->cuDeviceGetName(name, sizeof(name) - 1, handle),
                  "cuDeviceGetName"));
  p.name = name;
  size_t total = 0;
  LOOM_RETURN_IF_ERROR(
      api_->Check(api_->cuDeviceTotalMem(&total, handle), "cuDeviceTotalMem"));
  p.total_bytes = total;
  {
    Api::ScopedContext context(*api_, device);
    LOOM_RETURN_IF_ERROR(context.status());
    size_t free = 0;
    LOOM_RETURN_IF_ERROR(
        api_->Check(api_->cuMemGetInfo(&free, &total), "cuMemGetInfo"));
    p.free_bytes = free;
  }
  LOOM_ASSIGN_OR_RETURN(p.granularity_minimum,
                        DoGranularity(device, Granularity::kMinimum));
  LOOM_ASSIGN_OR_RETURN(p.granularity_recommended,
                        DoGranularity(device, Granularity::kRecommended));
  return p;
}

StatusOr<uint64_t> CudaDriver::DoGranularity(int device, Granularity kind) {
  CUmemAllocationProp prop = DeviceAllocationProp(device);
  size_t granularity = 0;
  LOOM_RETURN_IF_ERROR(api_->Check(
      api_->cuMemGetAllocationGranularity(
          &granularity, &prop,
          kind == Granularity::kMinimum ? CU_MEM_ALLOC_GRANULARITY_MINIMUM
                                        : CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
      "cuMemGetAllocationGranularity"));
  return granularity;
}

StatusOr<uint64_t> CudaDriver::DoCreate(int device, uint64_t size) {
  Api::ScopedContext context(*api_, device);
  LOOM_RETURN_IF_ERROR(context.status());
  CUmemAllocationProp prop = DeviceAllocationProp(device);
  CUmemGenericAllocationHandle handle = 0;
  LOOM_RETURN_IF_ERROR(api_->Check(
      api_->cuMemCreate(&handle, size, &prop, 0),
      fmt::format("cuMemCreate({} bytes, device {})", size, device)));
  return static_cast<uint64_t>(handle);
}

Status CudaDriver::DoRelease(uint64_t handle) {
  Api::ScopedContext context(*api_, Api::kAnyDevice);
  LOOM_RETURN_IF_ERROR(context.status());
  return api_->Check(api_->cuMemRelease(handle),
                     fmt::format("cuMemRelease({:#x})", handle));
}

StatusOr<DevicePtr> CudaDriver::DoReserve(uint64_t size, uint64_t alignment) {
  Api::ScopedContext context(*api_, Api::kAnyDevice);
  LOOM_RETURN_IF_ERROR(context.status());
  CUdeviceptr ptr = 0;
  LOOM_RETURN_IF_ERROR(
      api_->Check(api_->cuMemAddressReserve(&ptr, size, alignment, 0, 0),
                  fmt::format("cuMemAddressReserve({} bytes, alignment {})",
                              size, alignment)));
  return static_cast<DevicePtr>(ptr);
}

Status CudaDriver::DoUnreserve(DevicePtr ptr, uint64_t size) {
  Api::ScopedContext context(*api_, Api::kAnyDevice);
  LOOM_RETURN_IF_ERROR(context.status());
  return api_->Check(
      api_->cuMemAddressFree(ptr, size),
      fmt::format("cuMemAddressFree({:#x}, {} bytes)", ptr, size));
}

Status CudaDriver::DoMap(DevicePtr ptr, uint64_t size, uint64_t handle,
                         uint64_t offset) {
  Api::ScopedContext context(*api_, Api::kAnyDevice);
  LOOM_RETURN_IF_ERROR(context.status());
  return api_->Check(api_->cuMemMap(ptr, size, offset, handle, 0),
                     fmt::format("cuMemMap({:#x}, {} bytes, handle {:#x} + {})",
                                 ptr, size, handle, offset));
}

Status CudaDriver::DoUnmap(DevicePtr ptr, uint64_t size) {
  Api::ScopedContext context(*api_, Api::kAnyDevice);
  LOOM_RETURN_IF_ERROR(context.status());
  return api_->Check(api_->cuMemUnmap(ptr, size),
                     fmt::format("cuMemUnmap({:#x}, {} bytes)", ptr, size));
}

Status CudaDriver::DoSetAccess(DevicePtr ptr, uint64_t size, int device,
                               std::span<const int> peers) {
  Api::ScopedContext context(*api_, device);
  LOOM_RETURN_IF_ERROR(context.status());
  std::vector<CUmemAccessDesc> access(1 + peers.size());
  for (size_t i = 0; i < access.size(); ++i) {
    access[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[i].location.id = i == 0 ? device : peers[i - 1];
    access[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  return api_->Check(
      api_->cuMemSetAccess(ptr, size, access.data(), access.size()),
      fmt::format("cuMemSetAccess({:#x}, {} bytes, device {}, {} peers)", ptr,
                  size, device, peers.size()));
}

StatusOr<bool> CudaDriver::DoCanAccessPeer(int device, int peer) {
  CUdevice a, b;
  LOOM_RETURN_IF_ERROR(api_->Check(api_->cuDeviceGet(&a, device),
                                   fmt::format("cuDeviceGet({})", device)));
  LOOM_RETURN_IF_ERROR(api_->Check(api_->cuDeviceGet(&b, peer),
                                   fmt::format("cuDeviceGet({})", peer)));
  int can = 0;
  LOOM_RETURN_IF_ERROR(
      api_->Check(api_->cuDeviceCanAccessPeer(&can, b, a),
                  fmt::format("cuDeviceCanAccessPeer({}, {})", peer, device)));
  return can != 0;
}

StatusOr<Stream> CudaDriver::DoCreateStream(int device) {
  Api::ScopedContext context(*api_, device);
  LOOM_RETURN_IF_ERROR(context.status());
  CUstream stream = nullptr;
  LOOM_RETURN_IF_ERROR(api_->Check(
      api_->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate"));
  std::lock_guard<std::mutex> lock(api_->objects_mu);
  api_->stream_device[reinterpret_cast<uint64_t>(stream)] = device;
  return reinterpret_cast<Stream>(stream);
}

Status CudaDriver::DoDestroyStream(Stream stream) {
  Api::ScopedContext context(*api_, api_->StreamDevice(stream));
  LOOM_RETURN_IF_ERROR(context.status());
  LOOM_RETURN_IF_ERROR(
      api_->Check(api_->cuStreamDestroy(reinterpret_cast<CUstream>(stream)),
                  "cuStreamDestroy"));
  std::lock_guard<std::mutex> lock(api_->objects_mu);
  api_->stream_device.erase(stream);
  return OkStatus();
}

Status CudaDriver::DoSynchronizeStream(Stream stream) {
  Api::ScopedContext context(*api_, api_->StreamDevice(stream));
  LOOM_RETURN_IF_ERROR(context.status());
  return api_->Check(
      api_->cuStreamSynchronize(reinterpret_cast<CUstream>(stream)),
      "cuStreamSynchronize");
}

StatusOr<uint64_t> CudaDriver::DoCreateEvent(int device) {
  Api::ScopedContext context(*api_, device);
  LOOM_RETURN_IF_ERROR(context.status());
  CUevent event = nullptr;
  LOOM_RETURN_IF_ERROR(api_->Check(
      api_->cuEventCreate(&event, CU_EVENT_DISABLE_TIMING), "cuEventCreate"));
  std::lock_guard<std::mutex> lock(api_->objects_mu);
  api_->event_device[reinterpret_cast<uint64_t>(event)] = device;
  return reinterpret_cast<uint64_t>(event);
}

Status CudaDriver::DoDestroyEvent(uint64_t event) {
  Api::ScopedContext context(*api_, api_->EventDevice(event));
  LOOM_RETURN_IF_ERROR(context.status());
  LOOM_RETURN_IF_ERROR(
      api_->Check(api_->cuEventDestroy(reinterpret_cast<CUevent>(event)),
                  "cuEventDestroy"));
  std::lock_guard<std::mutex> lock(api_->objects_mu);
  api_->event_device.erase(event);
  return OkStatus();
}

Status CudaDriver::DoRecordEvent(uint64_t event, Stream stream) {
  Api::ScopedContext context(*api_, api_->EventDevice(event));
  LOOM_RETURN_IF_ERROR(context.status());
  return api_->Check(api_->cuEventRecord(reinterpret_cast<CUevent>(event),
                                         reinterpret_cast<CUstream>(stream)),
                     "cuEventRecord");
}

StatusOr<bool> CudaDriver::DoQueryEvent(uint64_t event) {
  Api::ScopedContext context(*api_, api_->EventDevice(event));
  LOOM_RETURN_IF_ERROR(context.status());
  CUresult result = api_->cuEventQuery(reinterpret_cast<CUevent>(event));
  if (result == CUDA_ERROR_NOT_READY) return false;
  LOOM_RETURN_IF_ERROR(api_->Check(result, "cuEventQuery"));
  return true;
}

Status CudaDriver::DoSynchronizeEvent(uint64_t event) {
  Api::ScopedContext context(*api_, api_->EventDevice(event));
  LOOM_RETURN_IF_ERROR(context.status());
  return api_->Check(api_->cuEventSynchronize(reinterpret_cast<CUevent>(event)),
                     "cuEventSynchronize");
}

Status CudaDriver::DoStreamWaitEvent(Stream stream, uint64_t event) {
  Api::ScopedContext context(*api_, api_->EventDevice(event));
  LOOM_RETURN_IF_ERROR(context.status());
  return api_->Check(
      api_->cuStreamWaitEvent(reinterpret_cast<CUstream>(stream),
                              reinterpret_cast<CUevent>(event), 0),
      "cuStreamWaitEvent");
}

Status CudaDriver::DoSynchronizeDevice(int device) {
  Api::ScopedContext context(*api_, device);
  LOOM_RETURN_IF_ERROR(context.status());
  return api_->Check(api_->cuCtxSynchronize(),
                     fmt::format("cuCtxSynchronize(device {})", device));
}

Status CudaDriver::DoCopyToDevice(DevicePtr dst, const void* src,
                                  uint64_t size) {
  Api::ScopedContext context(*api_, Api::kAnyDevice);
  LOOM_RETURN_IF_ERROR(context.status());
  return api_->Check(api_->cuMemcpyHtoD(dst, src, size), "cuMemcpyHtoD");
}

Status CudaDriver::DoCopyToHost(void* dst, DevicePtr src, uint64_t size) {
  Api::ScopedContext context(*api_, Api::kAnyDevice);
  LOOM_RETURN_IF_ERROR(context.status());
  return api_->Check(api_->cuMemcpyDtoH(dst, src, size), "cuMemcpyDtoH");
}

Status CudaDriver::DoMemset(DevicePtr dst, uint8_t value, uint64_t size) {
  Api::ScopedContext context(*api_, Api::kAnyDevice);
  LOOM_RETURN_IF_ERROR(context.status());
  return api_->Check(api_->cuMemsetD8(dst, value, size), "cuMemsetD8");
}

Status CudaDriver::DoMemsetAsync(DevicePtr dst, uint8_t value, uint64_t size,
                                 Stream stream, int device) {
  Api::ScopedContext context(*api_, api_->StreamDevice(stream, device));
  LOOM_RETURN_IF_ERROR(context.status());
  return api_->Check(api_->cuMemsetD8Async(dst, value, size,
                                           reinterpret_cast<CUstream>(stream)),
                     "cuMemsetD8Async");
}

Status CudaDriver::DoCopyToHostAsync(void* dst, DevicePtr src, uint64_t size,
                                     Stream stream, int device) {
  Api::ScopedContext context(*api_, api_->StreamDevice(stream, device));
  LOOM_RETURN_IF_ERROR(context.status());
  return api_->Check(api_->cuMemcpyDtoHAsync(
                         dst, src, size, reinterpret_cast<CUstream>(stream)),
                     "cuMemcpyDtoHAsync");
}

#endif  // LOOM_NO_CUDA_HEADERS

}  // namespace loom::vmm
