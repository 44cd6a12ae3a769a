// Every entry point of the stub libcuda (cuda_stub.h), one function per
// variant: a name ending _v1 is the ABI of the oldest version, _v2 the
// later one, _ptds/_ptsz the per-thread-default-stream variant. Their
// signatures are those of cudaTypedefs.h's PFN_<name>_v<version>; the table
// in cuda_stub_proc.cc says which version each is handed out for.
#ifndef LOOM_VMM_TESTING_CUDA_STUB_ENTRIES_H_
#define LOOM_VMM_TESTING_CUDA_STUB_ENTRIES_H_

#include <cuda.h>

#include <string>

namespace loom::cuda_stub {

// printf-style formatting of a call's arguments for the record.
std::string Args(const char* format, ...) __attribute__((format(printf, 1, 2)));

// Devices and contexts (cuda_stub_api.cc).
CUresult Init(unsigned int flags);
CUresult DriverGetVersion(int* version);
CUresult DeviceGetCount(int* count);
CUresult DeviceGet(CUdevice* device, int ordinal);
CUresult DeviceGetName(char* name, int length, CUdevice device);
CUresult DeviceTotalMem_v1(unsigned int* bytes, CUdevice device);
CUresult DeviceTotalMem_v2(size_t* bytes, CUdevice device);
CUresult DevicePrimaryCtxRetain(CUcontext* ctx, CUdevice device);
CUresult DevicePrimaryCtxRelease_v1(CUdevice device);
CUresult DevicePrimaryCtxRelease_v2(CUdevice device);
CUresult CtxGetCurrent(CUcontext* ctx);
CUresult CtxSetCurrent(CUcontext ctx);
CUresult CtxGetDevice_v1(CUdevice* device);
CUresult CtxGetDevice_v2(CUdevice* device, CUcontext ctx);
CUresult CtxSynchronize_v1();
CUresult CtxSynchronize_v2(CUcontext ctx);
CUresult DeviceCanAccessPeer(int* can, CUdevice device, CUdevice peer);
CUresult MemGetInfo_v1(unsigned int* free, unsigned int* total);
CUresult MemGetInfo_v2(size_t* free, size_t* total);

// Virtual memory management (cuda_stub_api.cc).
CUresult MemGetAllocationGranularity(size_t* granularity,
                                     const CUmemAllocationProp* prop,
                                     CUmemAllocationGranularity_flags option);
CUresult MemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                   const CUmemAllocationProp* prop, unsigned long long flags);
CUresult MemRelease(CUmemGenericAllocationHandle handle);
CUresult MemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                           CUdeviceptr addr, unsigned long long flags);
CUresult MemAddressFree(CUdeviceptr ptr, size_t size);
CUresult MemMap(CUdeviceptr ptr, size_t size, size_t offset,
                CUmemGenericAllocationHandle handle, unsigned long long flags);
CUresult MemUnmap(CUdeviceptr ptr, size_t size);
CUresult MemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                      size_t count);

// Streams, events and data (cuda_stub_streams.cc).
CUresult StreamCreate(CUstream* stream, unsigned int flags);
CUresult StreamDestroy_v1(CUstream stream);
CUresult StreamDestroy_v2(CUstream stream);
CUresult StreamSynchronize(CUstream stream);
CUresult StreamSynchronize_ptsz(CUstream stream);
CUresult EventCreate(CUevent* event, unsigned int flags);
CUresult EventDestroy_v1(CUevent event);
CUresult EventDestroy_v2(CUevent event);
CUresult EventRecord(CUevent event, CUstream stream);
CUresult EventRecord_ptsz(CUevent event, CUstream stream);
CUresult EventQuery(CUevent event);
CUresult EventSynchronize(CUevent event);
CUresult StreamWaitEvent(CUstream stream, CUevent event, unsigned int flags);
CUresult StreamWaitEvent_ptsz(CUstream stream, CUevent event,
                              unsigned int flags);
CUresult MemcpyHtoD_v1(unsigned int dst, const void* src, unsigned int size);
CUresult MemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t size);
CUresult MemcpyHtoD_v2_ptds(CUdeviceptr dst, const void* src, size_t size);
CUresult MemcpyDtoH_v1(void* dst, unsigned int src, unsigned int size);
CUresult MemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t size);
CUresult MemcpyDtoH_v2_ptds(void* dst, CUdeviceptr src, size_t size);
CUresult MemsetD8_v1(unsigned int dst, unsigned char value, unsigned int size);
CUresult MemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t size);
CUresult MemsetD8_v2_ptds(CUdeviceptr dst, unsigned char value, size_t size);
CUresult MemsetD8Async(CUdeviceptr dst, unsigned char value, size_t size,
                       CUstream stream);
CUresult MemsetD8Async_ptsz(CUdeviceptr dst, unsigned char value, size_t size,
                            CUstream stream);
CUresult MemcpyDtoHAsync_v1(void* dst, unsigned int src, unsigned int size,
                            CUstream stream);
CUresult MemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t size,
                            CUstream stream);
CUresult MemcpyDtoHAsync_v2_ptsz(void* dst, CUdeviceptr src, size_t size,
                                 CUstream stream);

}  // namespace loom::cuda_stub

#endif  // LOOM_VMM_TESTING_CUDA_STUB_ENTRIES_H_
