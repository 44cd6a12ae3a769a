// The stub libcuda's devices, contexts and virtual memory management
// (cuda_stub.h says what is modelled).
#ifndef LOOM_NO_CUDA_HEADERS  // else the stub is an empty library
#include <sys/mman.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "vmm/testing/cuda_stub_entries.h"
#include "vmm/testing/cuda_stub_state.h"

namespace loom::cuda_stub {
namespace {

bool ValidDevice(const State& s, CUdevice device) {
  return device >= 0 && device < s.config.devices;
}

// The device memory described by `prop`, or -1.
int PropDevice(const State& s, const CUmemAllocationProp* prop) {
  if (prop == nullptr || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      !ValidDevice(s, prop->location.id)) {
    return -1;
  }
  return prop->location.id;
}

CUresult PrimaryRelease(State& s, CUdevice device) {
  if (!ValidDevice(s, device)) return CUDA_ERROR_INVALID_DEVICE;
  CUctx_st* ctx = s.primary[device].get();
  if (ctx->refcount == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (--ctx->refcount == 0) {
    RunContext(s, ctx);  // its work finishes; its streams and events go
    ctx->active = false;
    for (const auto& stream : s.streams) {
      if (stream->ctx == ctx && stream.get() != ctx->null_stream) {
        stream->destroyed = true;
      }
    }
    for (const auto& event : s.events) {
      if (event->ctx == ctx) event->destroyed = true;
    }
  }
  return CUDA_SUCCESS;
}

CUresult GetDevice(CUdevice* device, CUctx_st* ctx) {
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *device = ctx->device;
  return CUDA_SUCCESS;
}

void ReleaseBacking(Handle& h) {
  if (h.bytes != nullptr) munmap(h.bytes, h.size);
  h.bytes = nullptr;
}

}  // namespace

std::string Args(const char* format, ...) {
  char buffer[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buffer, sizeof(buffer), format, args);
  va_end(args);
  return buffer;
}

CUresult Init(unsigned int flags) {
  State& s = TheState();
  std::lock_guard<std::mutex> lock(s.mu);
  const std::string args = Args("%u", flags);
  if (flags != 0) return Record(s, "cuInit", args, CUDA_ERROR_INVALID_VALUE);
  if (!s.initialised) {
    s.config = ConfigFromEnvironment();
    for (int d = 0; d < s.config.devices; ++d) {
      s.primary.push_back(std::make_unique<CUctx_st>());
      CUctx_st* ctx = s.primary.back().get();
      ctx->device = d;
      s.known.insert(ctx);
      ctx->null_stream = NewStream(s, ctx);
    }
    s.created.assign(s.config.devices, 0);
    s.initialised = true;
  }
  return Record(s, "cuInit", args, CUDA_SUCCESS);
}

CUresult DriverGetVersion(int* version) {
  State& s = TheState();
  std::lock_guard<std::mutex> lock(s.mu);
  if (version == nullptr) {
    return Record(s, "cuDriverGetVersion", "null", CUDA_ERROR_INVALID_VALUE);
  }
  *version = s.initialised ? s.config.driver_version
                           : ConfigFromEnvironment().driver_version;
  return Record(s, "cuDriverGetVersion", "", CUDA_SUCCESS);
}

CUresult DeviceGetCount(int* count) {
  STUB_ENTER0("cuDeviceGetCount");
  if (count == nullptr) STUB_RETURN(CUDA_ERROR_INVALID_VALUE);
  *count = s.config.devices;
  STUB_RETURN(CUDA_SUCCESS);
}

CUresult DeviceGet(CUdevice* device, int ordinal) {
  STUB_ENTER("cuDeviceGet", "%d", ordinal);
  if (device == nullptr) STUB_RETURN(CUDA_ERROR_INVALID_VALUE);
  if (!ValidDevice(s, ordinal)) STUB_RETURN(CUDA_ERROR_INVALID_DEVICE);
  *device = ordinal;
  STUB_RETURN(CUDA_SUCCESS);
}

CUresult DeviceGetName(char* name, int length, CUdevice device) {
  STUB_ENTER("cuDeviceGetName", "%d, %d", length, device);
  if (name == nullptr || length <= 0) STUB_RETURN(CUDA_ERROR_INVALID_VALUE);
  if (!ValidDevice(s, device)) STUB_RETURN(CUDA_ERROR_INVALID_DEVICE);
  std::snprintf(name, length, "loom stub GPU %d", device);
  STUB_RETURN(CUDA_SUCCESS);
}

CUresult DeviceTotalMem_v1(unsigned int* bytes, CUdevice device) {
  STUB_ENTER("cuDeviceTotalMem", "%d", device);
  if (bytes == nullptr) STUB_RETURN(CUDA_ERROR_INVALID_VALUE);
  if (!ValidDevice(s, device)) STUB_RETURN(CUDA_ERROR_INVALID_DEVICE);
  *bytes = static_cast<unsigned int>(
      std::min<uint64_t>(s.config.memory, 0xFFFFFFFFu));
  STUB_RETURN(CUDA_SUCCESS);
}

CUresult DeviceTotalMem_v2(size_t* bytes, CUdevice device) {
  STUB_ENTER("cuDeviceTotalMem_v2", "%d", device);
  if (bytes == nullptr) STUB_RETURN(CUDA_ERROR_INVALID_VALUE);
  if (!ValidDevice(s, device)) STUB_RETURN(CUDA_ERROR_INVALID_DEVICE);
  *bytes = s.config.memory;
  STUB_RETURN(CUDA_SUCCESS);
}

CUresult DevicePrimaryCtxRetain(CUcontext* ctx, CUdevice device) {
  STUB_ENTER("cuDevicePrimaryCtxRetain", "%d", device);
  if (ctx == nullptr) STUB_RETURN(CUDA_ERROR_INVALID_VALUE);
  if (!ValidDevice(s, device)) STUB_RETURN(CUDA_ERROR_INVALID_DEVICE);
  CUctx_st* primary = s.primary[device].get();
  ++primary->refcount;
  primary->active = true;
  *ctx = primary;
  STUB_RETURN(CUDA_SUCCESS);
}

CUresult DevicePrimaryCtxRelease_v1(CUdevice device) {
  STUB_ENTER("cuDevicePrimaryCtxRelease", "%d", device);
  STUB_RETURN(PrimaryRelease(s, device));
}

CUresult DevicePrimaryCtxRelease_v2(CUdevice device) {
  STUB_ENTER("cuDevicePrimaryCtxRelease_v2", "%d", device);
  STUB_RETURN(PrimaryRelease(s, device));
}

CUresult CtxGetCurrent(CUcontext* ctx) {
  STUB_ENTER0("cuCtxGetCurrent");
  if (ctx == nullptr) STUB_RETURN(CUDA_ERROR_INVALID_VALUE);
  *ctx = Current();
  STUB_RETURN(CUDA_SUCCESS);
}

CUresult CtxSetCurrent(CUcontext ctx) {
  STUB_ENTER("cuCtxSetCurrent", "%p", static_cast<void*>(ctx));
  if (ctx != nullptr) {
    const CUresult checked = CheckContext(s, ctx, "cuCtxSetCurrent");
    if (checked != CUDA_SUCCESS) STUB_RETURN(checked);
  }
  Current() = ctx;
  STUB_RETURN(CUDA_SUCCESS);
}

CUresult CtxGetDevice_v1(CUdevice* device) {
  STUB_ENTER0("cuCtxGetDevice");
  CUresult error;
  CUctx_st* ctx = CurrentContext(s, &error);
  if (ctx == nullptr) STUB_RETURN(error);
  STUB_RETURN(GetDevice(device, ctx));
}

CUresult CtxGetDevice_v2(CUdevice* device, CUcontext ctx) {
  STUB_ENTER("cuCtxGetDevice_v2", "%p", static_cast<void*>(ctx));
  CUresult error = CUDA_SUCCESS;
  if (ctx == nullptr) {
    ctx = CurrentContext(s, &error);
  } else {
    error = CheckContext(s, ctx, kVariant);
  }
  if (error != CUDA_SUCCESS) STUB_RETURN(error);
  STUB_RETURN(GetDevice(device, ctx));
}

CUresult CtxSynchronize_v1() {
  STUB_ENTER0("cuCtxSynchronize");
  CUresult error;
  CUctx_st* ctx = CurrentContext(s, &error);
  if (ctx == nullptr) STUB_RETURN(error);
  STUB_RETURN(RunContext(s, ctx));
}

CUresult CtxSynchronize_v2(CUcontext ctx) {
  STUB_ENTER("cuCtxSynchronize_v2", "%p", static_cast<void*>(ctx));
  CUresult error = CUDA_SUCCESS;
  if (ctx == nullptr) {
    ctx = CurrentContext(s, &error);
  } else {
    error = CheckContext(s, ctx, kVariant);
  }
  if (error != CUDA_SUCCESS) STUB_RETURN(error);
  STUB_RETURN(RunContext(s, ctx));
}

CUresult DeviceCanAccessPeer(int* can, CUdevice device, CUdevice peer) {
  STUB_ENTER("cuDeviceCanAccessPeer", "%d, %d", device, peer);
  if (can == nullptr) STUB_RETURN(CUDA_ERROR_INVALID_VALUE);
  if (!ValidDevice(s, device) || !ValidDevice(s, peer)) {
    STUB_RETURN(CUDA_ERROR_INVALID_DEVICE);
  }
  *can = device != peer ? 1 : 0;
  STUB_RETURN(CUDA_SUCCESS);
}

CUresult MemGetInfo_v1(unsigned int* free, unsigned int* total) {
  STUB_ENTER0("cuMemGetInfo");
  CUresult error;
  CUctx_st* ctx = CurrentContext(s, &error);
  if (ctx == nullptr) STUB_RETURN(error);
  if (free == nullptr || total == nullptr)
    STUB_RETURN(CUDA_ERROR_INVALID_VALUE);
  const uint64_t left = s.config.memory - s.created[ctx->device];
  *free = static_cast<unsigned int>(std::min<uint64_t>(left, 0xFFFFFFFFu));
  *total = static_cast<unsigned int>(
      std::min<uint64_t>(s.config.memory, 0xFFFFFFFFu));
  STUB_RETURN(CUDA_SUCCESS);
}

CUresult MemGetInfo_v2(size_t* free, size_t* total) {
  STUB_ENTER0("cuMemGetInfo_v2");
  CUresult error;
  CUctx_st* ctx = CurrentContext(s, &error);
  if (ctx == nullptr) STUB_RETURN(error);
  if (free == nullptr || total == nullptr)
    STUB_RETURN(CUDA_ERROR_INVALID_VALUE);
  *free = s.config.memory - s.created[ctx->device];
  *total = s.config.memory;
  STUB_RETURN(CUDA_SUCCESS);
}

CUresult MemGetAllocationGranularity(size_t* granularity,
                                     const CUmemAllocationProp* prop,
                                     CUmemAllocationGranularity_flags option) {
  STUB_ENTER("cuMemGetAllocationGranularity", "%d", static_cast<int>(option));
  if (granularity == nullptr || PropDevice(s, prop) < 0 ||
      (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
       option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)) {
    STUB_RETURN(CUDA_ERROR_INVALID_VALUE);
  }
  *granularity = s.config.granularity;
  STUB_RETURN(CUDA_SUCCESS);
}

CUresult MemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                   const CUmemAllocationProp* prop, unsigned long long flags) {
  STUB_ENTER("cuMemCreate", "%zu, %llu", size, flags);
  const int device = PropDevice(s, prop);
  if (handle == nullptr || device < 0 || flags != 0 || size == 0 ||
      size % s.config.granularity != 0) {
    STUB_RETURN(CUDA_ERROR_INVALID_VALUE);
  }
  if (size > s.config.memory - s.created[device]) {
    STUB_RETURN(CUDA_ERROR_OUT_OF_MEMORY);
  }
  void* bytes = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (bytes == MAP_FAILED) STUB_RETURN(CUDA_ERROR_OUT_OF_MEMORY);
  const uint64_t id = s.next_handle++;
  Handle& h = s.handles[id];
  h.device = device;
  h.size = size;
  h.bytes = static_cast<uint8_t*>(bytes);
  s.created[device] += size;
  *handle = id;
  STUB_RETURN(CUDA_SUCCESS);
}

CUresult MemRelease(CUmemGenericAllocationHandle handle) {
  STUB_ENTER("cuMemRelease", "%#llx", handle);
  auto it = s.handles.find(handle);
  if (it == s.handles.end() || it->second.released) {
    STUB_RETURN(CUDA_ERROR_INVALID_VALUE);
  }
  Handle& h = it->second;
  h.released = true;
  s.created[h.device] -= h.size;
  if (h.mappings == 0) {  // else freed with its last mapping
    ReleaseBacking(h);
    s.handles.erase(it);
  }
  STUB_RETURN(CUDA_SUCCESS);
}

CUresult MemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                           CUdeviceptr addr, unsigned long long flags) {
  STUB_ENTER("cuMemAddressReserve", "%zu, %zu, %#llx, %llu", size, alignment,
             addr, flags);
  const uint64_t g = s.config.granularity;
  if (ptr == nullptr || size == 0 || size % g != 0 || flags != 0 ||
      (alignment != 0 &&
       (alignment % g != 0 || (alignment & (alignment - 1)) != 0))) {
    STUB_RETURN(CUDA_ERROR_INVALID_VALUE);
  }
  const uint64_t align = alignment == 0 ? g : alignment;
  const CUdeviceptr base = (s.next_va + align - 1) / align * align;
  s.next_va = base + size + g;  // a hole between reservations
  s.reservations[base] = size;
  *ptr = base;
  STUB_RETURN(CUDA_SUCCESS);
}

CUresult MemAddressFree(CUdeviceptr ptr, size_t size) {
  STUB_ENTER("cuMemAddressFree", "%#llx, %zu", ptr, size);
  auto it = s.reservations.find(ptr);
  if (it == s.reservations.end() || it->second != size) {
    STUB_RETURN(CUDA_ERROR_INVALID_VALUE);
  }
  auto mapped = s.mappings.lower_bound(ptr);
  if (mapped != s.mappings.end() && mapped->first < ptr + size) {
    Problem(s, Args("cuMemAddressFree(%#llx) with memory still mapped", ptr));
    STUB_RETURN(CUDA_ERROR_INVALID_VALUE);
  }
  s.reservations.erase(it);
  STUB_RETURN(CUDA_SUCCESS);
}

CUresult MemMap(CUdeviceptr ptr, size_t size, size_t offset,
                CUmemGenericAllocationHandle handle, unsigned long long flags) {
  STUB_ENTER("cuMemMap", "%#llx, %zu, %zu, %#llx, %llu", ptr, size, offset,
             handle, flags);
  const uint64_t g = s.config.granularity;
  auto h = s.handles.find(handle);
  if (h == s.handles.end() || h->second.released || flags != 0 || size == 0 ||
      ptr % g != 0 || size % g != 0 || offset % g != 0 ||
      offset + size > h->second.size) {
    STUB_RETURN(CUDA_ERROR_INVALID_VALUE);
  }
  // As measured on the H200: only whole handles are mapped.
  if (offset != 0 || size != h->second.size) {
    STUB_RETURN(CUDA_ERROR_NOT_SUPPORTED);
  }
  auto r = s.reservations.upper_bound(ptr);
  if (r == s.reservations.begin()) STUB_RETURN(CUDA_ERROR_INVALID_VALUE);
  --r;
  if (ptr + size > r->first + r->second) STUB_RETURN(CUDA_ERROR_INVALID_VALUE);
  auto next = s.mappings.lower_bound(ptr);
  if (next != s.mappings.end() && next->first < ptr + size) {
    STUB_RETURN(CUDA_ERROR_INVALID_VALUE);
  }
  if (next != s.mappings.begin()) {
    auto previous = std::prev(next);
    if (previous->first + previous->second.size > ptr) {
      STUB_RETURN(CUDA_ERROR_INVALID_VALUE);
    }
  }
  Mapping& m = s.mappings[ptr];
  m.size = size;
  m.handle = handle;
  m.offset = offset;
  m.access.assign(size / g, false);
  ++h->second.mappings;
  STUB_RETURN(CUDA_SUCCESS);
}

CUresult MemUnmap(CUdeviceptr ptr, size_t size) {
  STUB_ENTER("cuMemUnmap", "%#llx, %zu", ptr, size);
  // Exactly one whole mapping: "the entire contiguous address range that
  // was mapped to" (part of one: INVALID_VALUE, measured on the H200; two
  // adjacent ones in one call were never measured, and are refused too).
  auto it = s.mappings.find(ptr);
  if (size == 0 || it == s.mappings.end() || it->second.size != size) {
    STUB_RETURN(CUDA_ERROR_INVALID_VALUE);
  }
  std::vector<CUdeviceptr> covered = {ptr};
  for (CUdeviceptr base : covered) {
    auto m = s.mappings.find(base);
    auto h = s.handles.find(m->second.handle);
    if (--h->second.mappings == 0 && h->second.released) {
      ReleaseBacking(h->second);
      s.handles.erase(h);
    }
    s.mappings.erase(m);
  }
  STUB_RETURN(CUDA_SUCCESS);
}

CUresult MemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                      size_t count) {
  STUB_ENTER("cuMemSetAccess", "%#llx, %zu, %zu descriptors", ptr, size, count);
  const uint64_t g = s.config.granularity;
  if (desc == nullptr || count == 0 || size == 0 || ptr % g != 0 ||
      size % g != 0) {
    STUB_RETURN(CUDA_ERROR_INVALID_VALUE);
  }
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        !ValidDevice(s, desc[i].location.id) ||
        desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
      STUB_RETURN(CUDA_ERROR_INVALID_VALUE);
    }
  }
  if (!Translate(s, ptr, size, /*need_access=*/false)) {
    STUB_RETURN(CUDA_ERROR_INVALID_VALUE);  // some byte is not mapped
  }
  for (CUdeviceptr at = ptr; at < ptr + size; at += g) {
    auto m = std::prev(s.mappings.upper_bound(at));
    m->second.access[(at - m->first) / g] = true;
  }
  STUB_RETURN(CUDA_SUCCESS);
}

}  // namespace loom::cuda_stub

#endif  // LOOM_NO_CUDA_HEADERS
