// The stub libcuda itself (cuda_stub.h): it must hand out distinct functions
// per version where the ABI changed and notice a call through the wrong
// one, and refuse what the H200 refused, or the CUDA backend's tests
// against it prove nothing.
#include <gtest/gtest.h>

#include "vmm/testing/cuda_stub_client.h"

#ifndef LOOM_NO_CUDA_HEADERS
#include <cudaTypedefs.h>
#include <dlfcn.h>

#include <cstring>
#include <vector>

namespace loom::vmm::testing {
namespace {

using GetProc = CUresult (*)(const char*, void**, int, cuuint64_t,
                             CUdriverProcAddressQueryResult*);

class CudaStubTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StatusOr<CudaStub*> stub = CudaStub::Get();
    ASSERT_TRUE(stub.ok()) << stub.status().ToString();
    stub_ = *stub;
    void* library = dlopen(stub_->path().c_str(), RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(library, nullptr);
    get_proc_ =
        reinterpret_cast<GetProc>(dlsym(library, "cuGetProcAddress_v2"));
    ASSERT_NE(get_proc_, nullptr);
    ctx_ = stub_->RetainPrimary(0);
    stub_->SetCurrent(ctx_);
    stub_->Clear();
  }
  void TearDown() override {
    stub_->SetCurrent(nullptr);
    stub_->ReleasePrimary(0);
    const CudaStub::Live live = stub_->live();
    EXPECT_EQ(live.handles, 0u);
    EXPECT_EQ(live.reservations, 0u);
    EXPECT_EQ(live.mappings, 0u);
  }

  // The function handed out for `name` at `version` (legacy streams).
  template <typename F>
  F Resolve(const char* name, int version,
            cuuint64_t flags = CU_GET_PROC_ADDRESS_LEGACY_STREAM) {
    void* function = nullptr;
    CUdriverProcAddressQueryResult found;
    EXPECT_EQ(get_proc_(name, &function, version, flags, &found), CUDA_SUCCESS)
        << name;
    EXPECT_EQ(found, CU_GET_PROC_ADDRESS_SUCCESS) << name;
    return reinterpret_cast<F>(function);
  }

  CudaStub* stub_ = nullptr;
  GetProc get_proc_ = nullptr;
  void* ctx_ = nullptr;
};

TEST_F(CudaStubTest, VersionsWhoseAbiChangedGetDistinctFunctions) {
  void* v1 = reinterpret_cast<void*>(
      Resolve<PFN_cuCtxSynchronize_v2000>("cuCtxSynchronize", 2000));
  EXPECT_EQ(reinterpret_cast<void*>(
                Resolve<PFN_cuCtxSynchronize_v2000>("cuCtxSynchronize", 12080)),
            v1);
  EXPECT_NE(reinterpret_cast<void*>(Resolve<PFN_cuCtxSynchronize_v13000>(
                "cuCtxSynchronize", 13000)),
            v1);
  EXPECT_NE(reinterpret_cast<void*>(
                Resolve<PFN_cuCtxGetDevice_v13000>("cuCtxGetDevice", 13000)),
            reinterpret_cast<void*>(
                Resolve<PFN_cuCtxGetDevice_v2000>("cuCtxGetDevice", 2000)));
  EXPECT_NE(reinterpret_cast<void*>(
                Resolve<PFN_cuMemcpyHtoD_v3020>("cuMemcpyHtoD", 3020)),
            Resolve<void*>("cuMemcpyHtoD", 2000));  // 32-bit sizes
  // The per-thread default stream has its own variants.
  EXPECT_NE(reinterpret_cast<void*>(Resolve<PFN_cuMemcpyHtoD_v7000_ptds>(
                "cuMemcpyHtoD", 13000,
                CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)),
            reinterpret_cast<void*>(
                Resolve<PFN_cuMemcpyHtoD_v3020>("cuMemcpyHtoD", 13000)));
  // Too old a version, and an unknown name.
  void* function = nullptr;
  CUdriverProcAddressQueryResult found;
  EXPECT_EQ(get_proc_("cuMemMap", &function, 10010, 0, &found),
            CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(found, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  EXPECT_EQ(get_proc_("cuCtxSynchronize_v2", &function, 13000, 0, &found),
            CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(found, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
}

TEST_F(CudaStubTest, ACallThroughTheWrongAbiIsNoticed) {
  auto sync_v2 =
      Resolve<PFN_cuCtxSynchronize_v13000>("cuCtxSynchronize", 13000);
  auto sync_v1 = Resolve<PFN_cuCtxSynchronize_v2000>("cuCtxSynchronize", 2000);
  EXPECT_EQ(sync_v1(), CUDA_SUCCESS);
  EXPECT_EQ(sync_v2(static_cast<CUcontext>(ctx_)), CUDA_SUCCESS);
  EXPECT_EQ(sync_v2(nullptr), CUDA_SUCCESS);  // the current context
  EXPECT_TRUE(stub_->Problems().empty());
  // What a v1 call leaves in the argument register: no context.
  EXPECT_EQ(sync_v2(reinterpret_cast<CUcontext>(0x7f3a00001234)),
            CUDA_ERROR_INVALID_CONTEXT);
  auto get_device_v2 =
      Resolve<PFN_cuCtxGetDevice_v13000>("cuCtxGetDevice", 13000);
  CUdevice device = -1;
  EXPECT_EQ(get_device_v2(&device, reinterpret_cast<CUcontext>(0x10)),
            CUDA_ERROR_INVALID_CONTEXT);
  const std::vector<std::string> problems = stub_->Problems();
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_NE(problems[0].find("cuCtxSynchronize_v2 was given 0x7f3a00001234"),
            std::string::npos)
      << problems[0];
  EXPECT_EQ(stub_->Count("cuCtxSynchronize"), 1u);
  EXPECT_EQ(stub_->Count("cuCtxSynchronize_v2"), 3u);
  // Without a current context, the call that needs one refuses.
  stub_->SetCurrent(nullptr);
  EXPECT_EQ(sync_v1(), CUDA_ERROR_INVALID_CONTEXT);
}

struct Vmm {
  PFN_cuMemCreate_v10020 create;
  PFN_cuMemRelease_v10020 release;
  PFN_cuMemAddressReserve_v10020 reserve;
  PFN_cuMemAddressFree_v10020 free;
  PFN_cuMemMap_v10020 map;
  PFN_cuMemUnmap_v10020 unmap;
  PFN_cuMemSetAccess_v10020 set_access;
};

class CudaStubMemoryTest : public CudaStubTest {
 protected:
  void SetUp() override {
    CudaStubTest::SetUp();
    if (HasFatalFailure()) return;
    vmm_.create = Resolve<PFN_cuMemCreate_v10020>("cuMemCreate", 10020);
    vmm_.release = Resolve<PFN_cuMemRelease_v10020>("cuMemRelease", 10020);
    vmm_.reserve =
        Resolve<PFN_cuMemAddressReserve_v10020>("cuMemAddressReserve", 10020);
    vmm_.free = Resolve<PFN_cuMemAddressFree_v10020>("cuMemAddressFree", 10020);
    vmm_.map = Resolve<PFN_cuMemMap_v10020>("cuMemMap", 10020);
    vmm_.unmap = Resolve<PFN_cuMemUnmap_v10020>("cuMemUnmap", 10020);
    vmm_.set_access =
        Resolve<PFN_cuMemSetAccess_v10020>("cuMemSetAccess", 10020);
  }
  CUmemGenericAllocationHandle Create(size_t size) {
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemGenericAllocationHandle h = 0;
    EXPECT_EQ(vmm_.create(&h, size, &prop, 0), CUDA_SUCCESS);
    return h;
  }
  CUresult Access(CUdeviceptr ptr, size_t size) {
    CUmemAccessDesc desc = {};
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = 0;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return vmm_.set_access(ptr, size, &desc, 1);
  }

  static constexpr size_t g = size_t{2} << 20;
  Vmm vmm_;
};

// As measured on the H200 (gpu_runs/2026-11-26/driver_abi_probe.txt).
TEST_F(CudaStubMemoryTest, MapsWholeHandlesOnlyAndUnmapsWholeMappings) {
  CUmemGenericAllocationHandle h = Create(2 * g);
  CUmemGenericAllocationHandle other = Create(g);
  CUdeviceptr va = 0;
  ASSERT_EQ(vmm_.reserve(&va, 4 * g, 0, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(vmm_.map(va, g, g, h, 0), CUDA_ERROR_NOT_SUPPORTED);  // offset
  EXPECT_EQ(vmm_.map(va, g, 0, h, 0), CUDA_ERROR_NOT_SUPPORTED);  // part
  ASSERT_EQ(vmm_.map(va, 2 * g, 0, h, 0), CUDA_SUCCESS);
  EXPECT_EQ(vmm_.map(va + g, g, 0, other, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(vmm_.unmap(va, g), CUDA_ERROR_INVALID_VALUE);  // half of one
  ASSERT_EQ(vmm_.map(va + 2 * g, g, 0, other, 0), CUDA_SUCCESS);
  EXPECT_EQ(Access(va, 4 * g), CUDA_ERROR_INVALID_VALUE);  // a byte unmapped
  EXPECT_EQ(Access(va, 3 * g), CUDA_SUCCESS);              // spans two mappings
  EXPECT_EQ(vmm_.free(va, 4 * g), CUDA_ERROR_INVALID_VALUE);  // still mapped
  // A released handle lives until its last mapping goes.
  EXPECT_EQ(vmm_.release(other), CUDA_SUCCESS);
  EXPECT_EQ(stub_->live().handles, 2u);
  // One unmap takes exactly one mapping ("the entire contiguous address
  // range that was mapped to"): two adjacent ones in one call are refused.
  EXPECT_EQ(vmm_.unmap(va, 3 * g), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(stub_->live().mappings, 2u);
  EXPECT_EQ(vmm_.unmap(va + 2 * g, g), CUDA_SUCCESS);
  EXPECT_EQ(stub_->live().handles, 1u);
  EXPECT_EQ(vmm_.unmap(va, 2 * g), CUDA_SUCCESS);
  EXPECT_EQ(vmm_.release(h), CUDA_SUCCESS);
  EXPECT_EQ(vmm_.free(va, 4 * g), CUDA_SUCCESS);
}

TEST_F(CudaStubMemoryTest, QueuedWorkRunsWhenWaitedForAndFaultsWhenUnmapped) {
  auto stream_create =
      Resolve<PFN_cuStreamCreate_v2000>("cuStreamCreate", 2000);
  auto stream_destroy =
      Resolve<PFN_cuStreamDestroy_v4000>("cuStreamDestroy", 4000);
  auto stream_sync =
      Resolve<PFN_cuStreamSynchronize_v2000>("cuStreamSynchronize", 2000);
  auto event_create = Resolve<PFN_cuEventCreate_v2000>("cuEventCreate", 2000);
  auto event_destroy =
      Resolve<PFN_cuEventDestroy_v4000>("cuEventDestroy", 4000);
  auto record = Resolve<PFN_cuEventRecord_v2000>("cuEventRecord", 2000);
  auto query = Resolve<PFN_cuEventQuery_v2000>("cuEventQuery", 2000);
  auto wait = Resolve<PFN_cuStreamWaitEvent_v3020>("cuStreamWaitEvent", 3020);
  auto memset_async =
      Resolve<PFN_cuMemsetD8Async_v3020>("cuMemsetD8Async", 3020);
  auto copy_async =
      Resolve<PFN_cuMemcpyDtoHAsync_v3020>("cuMemcpyDtoHAsync", 3020);
  CUmemGenericAllocationHandle h = Create(g);
  CUdeviceptr va = 0;
  ASSERT_EQ(vmm_.reserve(&va, g, 0, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(vmm_.map(va, g, 0, h, 0), CUDA_SUCCESS);
  uint8_t byte = 0;
  EXPECT_EQ(memset_async(va, 7, g, nullptr), CUDA_ERROR_INVALID_VALUE)
      << "no access yet";
  ASSERT_EQ(Access(va, g), CUDA_SUCCESS);
  CUstream a = nullptr, b = nullptr;
  CUevent e = nullptr;
  ASSERT_EQ(stream_create(&a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(stream_create(&b, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(event_create(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  // a: memset 7; b waits for it, then copies a byte back.
  ASSERT_EQ(memset_async(va, 7, g, a), CUDA_SUCCESS);
  ASSERT_EQ(record(e, a), CUDA_SUCCESS);
  ASSERT_EQ(wait(b, e, 0), CUDA_SUCCESS);
  ASSERT_EQ(copy_async(&byte, va + g - 1, 1, b), CUDA_SUCCESS);
  ASSERT_EQ(record(e, b), CUDA_SUCCESS);
  EXPECT_EQ(byte, 0) << "queued work ran at once";
  EXPECT_EQ(query(e), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(query(e), CUDA_SUCCESS);
  EXPECT_EQ(byte, 7);
  // Work queued on memory unmapped before it runs: a fault, reported at the
  // next synchronisation.
  const uint64_t faults = stub_->faults();
  ASSERT_EQ(memset_async(va, 9, g, a), CUDA_SUCCESS);
  ASSERT_EQ(vmm_.unmap(va, g), CUDA_SUCCESS);
  EXPECT_EQ(stream_sync(a), CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(stream_sync(a), CUDA_SUCCESS);
  EXPECT_EQ(stub_->faults(), faults + 1);
  EXPECT_EQ(event_destroy(e), CUDA_SUCCESS);
  EXPECT_EQ(stream_destroy(a), CUDA_SUCCESS);
  EXPECT_EQ(stream_destroy(b), CUDA_SUCCESS);
  EXPECT_EQ(stream_destroy(a), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(vmm_.release(h), CUDA_SUCCESS);
  EXPECT_EQ(vmm_.free(va, g), CUDA_SUCCESS);
}

}  // namespace
}  // namespace loom::vmm::testing

#else  // LOOM_NO_CUDA_HEADERS

TEST(CudaStubTest, NeedsCudaHeaders) {
  GTEST_SKIP() << "built without CUDA headers: the stub is empty";
}

#endif  // LOOM_NO_CUDA_HEADERS
