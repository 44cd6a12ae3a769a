// The driver contract suite: the same tests on every backend.
//
// CUDA runs only where a driver and a GPU are present; elsewhere it is skipped
// with the reason. Data checks run on backends that hold data (host, cuda).
#include "vmm/driver.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "vmm/async_host_driver.h"
#include "vmm/cuda_driver.h"
#include "vmm/fake_driver.h"
#include "vmm/host_driver.h"

namespace loom::vmm {
namespace {

constexpr uint64_t kTestGranularity = 64 << 10;

struct FakeBackend {
  static StatusOr<std::unique_ptr<Driver>> Make() {
    FakeDriverOptions options;
    options.granularity = kTestGranularity;
    options.capacity_per_device = 64 * kTestGranularity;
    return std::unique_ptr<Driver>(std::make_unique<FakeDriver>(options));
  }
};

struct HostBackend {
  static StatusOr<std::unique_ptr<Driver>> Make() {
    HostDriverOptions options;
    options.granularity = kTestGranularity;
    options.capacity_per_device = 64 * kTestGranularity;
    LOOM_ASSIGN_OR_RETURN(auto driver, HostDriver::Open(options));
    return std::unique_ptr<Driver>(std::move(driver));
  }
};

struct AsyncBackend {
  static StatusOr<std::unique_ptr<Driver>> Make() {
    HostDriverOptions options;
    options.granularity = kTestGranularity;
    options.capacity_per_device = 64 * kTestGranularity;
    LOOM_ASSIGN_OR_RETURN(auto driver, AsyncHostDriver::Open(options));
    return std::unique_ptr<Driver>(std::move(driver));
  }
};

struct CudaBackend {
  static StatusOr<std::unique_ptr<Driver>> Make() {
    LOOM_ASSIGN_OR_RETURN(auto driver, CudaDriver::Open());
    return std::unique_ptr<Driver>(std::move(driver));
  }
};

template <typename Backend>
class DriverContractTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StatusOr<std::unique_ptr<Driver>> driver = Backend::Make();
    if (!driver.ok()) {
      GTEST_SKIP() << "backend unavailable here: "
                   << driver.status().ToString();
    }
    driver_ = std::move(driver).value();
    StatusOr<uint64_t> g = driver_->GetGranularity(0, Granularity::kMinimum);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    g_ = *g;
  }

  void TearDown() override {
    if (driver_ == nullptr) return;
    ContractCounts counts = driver_->contract_counts();
    EXPECT_EQ(counts.handles, 0u) << "test leaked a handle";
    EXPECT_EQ(counts.reservations, 0u) << "test leaked a reservation";
    EXPECT_EQ(counts.mappings, 0u) << "test leaked a mapping";
  }

  // Writes `value` over [ptr, ptr + size) and checks it reads back.
  void Fill(DevicePtr ptr, uint64_t size, uint8_t value) {
    ASSERT_TRUE(driver_->Memset(ptr, value, size).ok());
  }
  uint8_t ReadByte(DevicePtr ptr) {
    uint8_t byte = 0xEE;
    EXPECT_TRUE(driver_->CopyToHost(&byte, ptr, 1).ok());
    return byte;
  }

  std::unique_ptr<Driver> driver_;
  uint64_t g_ = 0;
};

using Backends =
    ::testing::Types<FakeBackend, HostBackend, AsyncBackend, CudaBackend>;
class BackendNames {
 public:
  template <typename T>
  static std::string GetName(int) {
    if (std::is_same_v<T, FakeBackend>) return "fake";
    if (std::is_same_v<T, HostBackend>) return "host";
    if (std::is_same_v<T, AsyncBackend>) return "async";
    return "cuda";
  }
};
TYPED_TEST_SUITE(DriverContractTest, Backends, BackendNames);

TYPED_TEST(DriverContractTest, DescribesItsDevices) {
  Driver& d = *this->driver_;
  StatusOr<int> count = d.DeviceCount();
  ASSERT_TRUE(count.ok());
  EXPECT_GE(*count, 1);
  StatusOr<DeviceProperties> p = d.Properties(0);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->granularity_minimum, this->g_);
  EXPECT_GE(p->granularity_recommended, p->granularity_minimum);
  EXPECT_GE(p->total_bytes, p->free_bytes);
  EXPECT_GT(p->total_bytes, 0u);
  EXPECT_FALSE(d.Properties(*count).ok());
}

TYPED_TEST(DriverContractTest, MapAccessUnmapReleaseRoundTrip) {
  Driver& d = *this->driver_;
  const uint64_t g = this->g_;
  StatusOr<DevicePtr> va = d.Reserve(4 * g);
  ASSERT_TRUE(va.ok()) << va.status().ToString();
  EXPECT_EQ(*va % g, 0u);
  StatusOr<PhysicalHandle> h = d.Create(0, 2 * g);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_TRUE(d.Map(*va + g, 2 * g, *h).ok());
  ASSERT_TRUE(d.SetAccess(*va + g, 2 * g, 0).ok());
  EXPECT_EQ(d.contract_counts().mapped_bytes, 2 * g);
  if (d.holds_data()) {
    this->Fill(*va + g, 2 * g, 0x5A);
    EXPECT_EQ(this->ReadByte(*va + 3 * g - 1), 0x5A);
  }
  ASSERT_TRUE(d.Unmap(*va + g, 2 * g).ok());
  ASSERT_TRUE(d.Release(*h).ok());
  ASSERT_TRUE(d.Unreserve(*va, 4 * g).ok());
  EXPECT_EQ(d.calls(DriverOp::kMap), 1u);
  EXPECT_EQ(d.calls(DriverOp::kUnmap), 1u);
}

TYPED_TEST(DriverContractTest, MemoryCallsAreCountedBySize) {
  Driver& d = *this->driver_;
  const uint64_t g = this->g_;
  DevicePtr va = *d.Reserve(4 * g);
  PhysicalHandle a = *d.Create(0, g);
  PhysicalHandle b = *d.Create(0, 3 * g);
  ASSERT_TRUE(d.Map(va, g, a).ok());
  ASSERT_TRUE(d.Map(va + g, 3 * g, b).ok());
  EXPECT_EQ(d.Map(va, 2 * g, b).code(), StatusCode::kUnimplemented);
  ASSERT_TRUE(d.SetAccess(va, 4 * g, 0).ok());
  ASSERT_TRUE(d.Unmap(va, g).ok());
  ASSERT_TRUE(d.Unmap(va + g, 3 * g).ok());
  ASSERT_TRUE(d.Release(a).ok());
  ASSERT_TRUE(d.Release(b).ok());
  ASSERT_TRUE(d.Unreserve(va, 4 * g).ok());
  using Sizes = std::map<uint64_t, uint64_t>;
  EXPECT_EQ(d.sized_calls(DriverOp::kCreate), (Sizes{{g, 1}, {3 * g, 1}}));
  EXPECT_EQ(d.sized_calls(DriverOp::kMap), (Sizes{{g, 1}, {3 * g, 1}}))
      << "a refused call is not counted";
  EXPECT_EQ(d.sized_calls(DriverOp::kSetAccess), (Sizes{{4 * g, 1}}));
  EXPECT_EQ(d.sized_calls(DriverOp::kUnmap), (Sizes{{g, 1}, {3 * g, 1}}));
  EXPECT_EQ(d.sized_calls(DriverOp::kRelease), (Sizes{{g, 1}, {3 * g, 1}}));
  EXPECT_EQ(d.sized_calls(DriverOp::kReserve), (Sizes{{4 * g, 1}}));
  EXPECT_EQ(d.sized_calls(DriverOp::kUnreserve), (Sizes{{4 * g, 1}}));
  EXPECT_TRUE(d.sized_calls(DriverOp::kRecordEvent).empty());
}

TYPED_TEST(DriverContractTest, TwoMappingsOfOneHandleAlias) {
  Driver& d = *this->driver_;
  const uint64_t g = this->g_;
  DevicePtr a = *d.Reserve(g);
  DevicePtr b = *d.Reserve(g);
  PhysicalHandle h = *d.Create(0, g);
  ASSERT_TRUE(d.Map(a, g, h).ok());
  ASSERT_TRUE(d.Map(b, g, h).ok());
  ASSERT_TRUE(d.SetAccess(a, g, 0).ok());
  ASSERT_TRUE(d.SetAccess(b, g, 0).ok());
  if (d.holds_data()) {
    const char message[] = "written through a, read through b";
    ASSERT_TRUE(d.CopyToDevice(a + 128, message, sizeof(message)).ok());
    char back[sizeof(message)] = {};
    ASSERT_TRUE(d.CopyToHost(back, b + 128, sizeof(back)).ok());
    EXPECT_STREQ(back, message);
  }
  EXPECT_EQ(d.Release(h).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(d.Unmap(a, g).ok());
  EXPECT_EQ(d.Release(h).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(d.Unmap(b, g).ok());
  ASSERT_TRUE(d.Release(h).ok());
  ASSERT_TRUE(d.Unreserve(a, g).ok());
  ASSERT_TRUE(d.Unreserve(b, g).ok());
}

// CUDA: cuMemMap of part of a handle, at an offset or with a smaller size,
// is CUDA_ERROR_NOT_SUPPORTED (801), measured on an H200 (CUDA 13.0,
// gpu_runs/2026-11-26/driver_abi_probe.txt); the documentation says the
// offset "currently must be zero". Every backend refuses it (UNIMPLEMENTED)
// without reaching the driver, and the state is unchanged.
TYPED_TEST(DriverContractTest, MapOfPartOfAHandleIsRefused) {
  Driver& d = *this->driver_;
  const uint64_t g = this->g_;
  DevicePtr va = *d.Reserve(2 * g);
  PhysicalHandle h = *d.Create(0, 2 * g);
  const uint64_t maps = d.calls(DriverOp::kMap);
  EXPECT_EQ(d.Map(va, g, h, g).code(), StatusCode::kUnimplemented);
  EXPECT_EQ(d.Map(va, g, h, 0).code(), StatusCode::kUnimplemented);
  EXPECT_EQ(d.Map(va + g, g, h, g).code(), StatusCode::kUnimplemented);
  EXPECT_EQ(d.Map(va, 2 * g, h, g).code(), StatusCode::kUnimplemented);
  EXPECT_EQ(d.calls(DriverOp::kMap), maps)
      << "a refused map reached the backend";
  EXPECT_EQ(d.contract_counts().mappings, 0u);
  // The whole handle maps.
  ASSERT_TRUE(d.Map(va, 2 * g, h, 0).ok());
  ASSERT_TRUE(d.Unmap(va, 2 * g).ok());
  ASSERT_TRUE(d.Release(h).ok());
  ASSERT_TRUE(d.Unreserve(va, 2 * g).ok());
}

// CUDA: cuMemUnmap of part of a mapping is CUDA_ERROR_INVALID_VALUE (1),
// measured on an H200; the documentation: "The range must be the entire
// contiguous address range that was mapped to".
TYPED_TEST(DriverContractTest, UnmapOfPartOfAMappingIsRefused) {
  Driver& d = *this->driver_;
  const uint64_t g = this->g_;
  DevicePtr va = *d.Reserve(2 * g);
  PhysicalHandle h = *d.Create(0, 2 * g);
  ASSERT_TRUE(d.Map(va, 2 * g, h).ok());
  const uint64_t unmaps = d.calls(DriverOp::kUnmap);
  EXPECT_EQ(d.Unmap(va, g).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d.Unmap(va + g, g).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d.calls(DriverOp::kUnmap), unmaps);
  EXPECT_EQ(d.contract_counts().mapped_bytes, 2 * g);
  ASSERT_TRUE(d.Unmap(va, 2 * g).ok());
  ASSERT_TRUE(d.Release(h).ok());
  ASSERT_TRUE(d.Unreserve(va, 2 * g).ok());
}

// loom's rule, from CUDA's documentation of cuMemUnmap (the range "that was
// mapped to": one cuMemMap's): an unmap never spans two mappings, even
// adjacent ones; each is unmapped alone. Access, in contrast, is granted
// over several consecutive mappings in one call (cuMemSetAccess: "a fully
// mapped address range containing all allocations created by cuMemMap";
// PyTorch's expandable segments do it), but never over a gap or part of a
// mapping.
TYPED_TEST(DriverContractTest, ConsecutiveMappingsShareSetAccessNotUnmap) {
  Driver& d = *this->driver_;
  const uint64_t g = this->g_;
  DevicePtr va = *d.Reserve(4 * g);
  PhysicalHandle a = *d.Create(0, g);
  PhysicalHandle b = *d.Create(0, 2 * g);
  PhysicalHandle c = *d.Create(0, g);
  ASSERT_TRUE(d.Map(va, g, a).ok());
  ASSERT_TRUE(d.Map(va + g, 2 * g, b).ok());
  // A gap at va + 3g: access over it, or over part of b, is refused.
  EXPECT_EQ(d.SetAccess(va, 4 * g, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d.SetAccess(va, 2 * g, 0).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(d.Map(va + 3 * g, g, c).ok());
  const uint64_t set_access = d.calls(DriverOp::kSetAccess);
  ASSERT_TRUE(d.SetAccess(va, 4 * g, 0).ok());
  EXPECT_EQ(d.calls(DriverOp::kSetAccess), set_access + 1);
  if (d.holds_data()) {
    this->Fill(va, 4 * g, 0x33);  // one memset across three mappings
    EXPECT_EQ(this->ReadByte(va + g - 1), 0x33);
    EXPECT_EQ(this->ReadByte(va + 3 * g), 0x33);
  }
  EXPECT_EQ(d.Unmap(va, 2 * g).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d.Unmap(va, 4 * g).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d.contract_counts().mappings, 3u);
  ASSERT_TRUE(d.Unmap(va, g).ok());
  ASSERT_TRUE(d.Unmap(va + g, 2 * g).ok());
  ASSERT_TRUE(d.Unmap(va + 3 * g, g).ok());
  ASSERT_TRUE(d.Release(a).ok());
  ASSERT_TRUE(d.Release(b).ok());
  ASSERT_TRUE(d.Release(c).ok());
  ASSERT_TRUE(d.Unreserve(va, 4 * g).ok());
}

// CUDA: after cuMemUnmap the range is a reservation again, "used for future
// calls to cuMemMap", and a new mapping needs its access granted again.
TYPED_TEST(DriverContractTest, AddressesAreReusedAfterUnmap) {
  Driver& d = *this->driver_;
  const uint64_t g = this->g_;
  DevicePtr va = *d.Reserve(g);
  PhysicalHandle first = *d.Create(0, g);
  PhysicalHandle second = *d.Create(0, g);
  ASSERT_TRUE(d.Map(va, g, first).ok());
  ASSERT_TRUE(d.SetAccess(va, g, 0).ok());
  if (d.holds_data()) this->Fill(va, g, 0x11);
  ASSERT_TRUE(d.Unmap(va, g).ok());
  ASSERT_TRUE(d.Map(va, g, second).ok());
  uint8_t byte = 0;
  EXPECT_EQ(d.CopyToHost(&byte, va, 1).code(), StatusCode::kFailedPrecondition)
      << "a new mapping starts without access";
  ASSERT_TRUE(d.SetAccess(va, g, 0).ok());
  if (d.holds_data()) {
    this->Fill(va, g, 0x22);
    EXPECT_EQ(this->ReadByte(va), 0x22);
  }
  ASSERT_TRUE(d.Unmap(va, g).ok());
  // The first handle kept what was written through its old mapping.
  ASSERT_TRUE(d.Map(va, g, first).ok());
  ASSERT_TRUE(d.SetAccess(va, g, 0).ok());
  if (d.holds_data()) EXPECT_EQ(this->ReadByte(va + g - 1), 0x11);
  ASSERT_TRUE(d.Unmap(va, g).ok());
  ASSERT_TRUE(d.Release(first).ok());
  ASSERT_TRUE(d.Release(second).ok());
  ASSERT_TRUE(d.Unreserve(va, g).ok());
}

// Failure injection is the base class's, so every backend (real memory
// included) can be made to fail as a driver would.
TYPED_TEST(DriverContractTest, InjectedFailureHitsTheNthCallOnly) {
  Driver& d = *this->driver_;
  const uint64_t g = this->g_;
  d.InjectFailure(DriverOp::kCreate, 2, OutOfMemoryError("injected"));
  StatusOr<PhysicalHandle> first = d.Create(0, g);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  StatusOr<PhysicalHandle> second = d.Create(0, g);
  EXPECT_EQ(second.status().ToString(), "OUT_OF_MEMORY: injected");
  StatusOr<PhysicalHandle> third = d.Create(0, g);
  ASSERT_TRUE(third.ok()) << third.status().ToString();
  EXPECT_EQ(d.calls(DriverOp::kCreate), 3u);  // the failed one counts too
  EXPECT_EQ(d.sized_calls(DriverOp::kCreate).at(g), 3u);
  EXPECT_EQ(d.contract_counts().handles, 2u);
  EXPECT_TRUE(d.Release(*first).ok());
  EXPECT_TRUE(d.Release(*third).ok());
}

TYPED_TEST(DriverContractTest, InjectedMapFailureLeavesNothingMapped) {
  Driver& d = *this->driver_;
  const uint64_t g = this->g_;
  DevicePtr va = *d.Reserve(g);
  PhysicalHandle h = *d.Create(0, g);
  d.InjectFailure(DriverOp::kMap, 1, InternalError("map broke"));
  EXPECT_EQ(d.Map(va, g, h).code(), StatusCode::kInternal);
  EXPECT_EQ(d.contract_counts().mappings, 0u);
  // Nothing was mapped: the same map works now, and everything can go.
  ASSERT_TRUE(d.Map(va, g, h).ok());
  ASSERT_TRUE(d.Unmap(va, g).ok());
  EXPECT_TRUE(d.Release(h).ok());
  EXPECT_TRUE(d.Unreserve(va, g).ok());
}

TYPED_TEST(DriverContractTest, FailAlwaysUntilCleared) {
  Driver& d = *this->driver_;
  const uint64_t g = this->g_;
  d.FailAlways(DriverOp::kReserve, UnavailableError("gone"));
  EXPECT_EQ(d.Reserve(g).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(d.Reserve(g).status().code(), StatusCode::kUnavailable);
  d.ClearFailures();
  StatusOr<DevicePtr> va = d.Reserve(g);
  ASSERT_TRUE(va.ok()) << va.status().ToString();
  EXPECT_TRUE(d.Unreserve(*va, g).ok());
}

TYPED_TEST(DriverContractTest, MisuseIsRejectedAndChangesNothing) {
  Driver& d = *this->driver_;
  const uint64_t g = this->g_;
  DevicePtr va = *d.Reserve(4 * g);
  PhysicalHandle h = *d.Create(0, 2 * g);
  ASSERT_TRUE(d.Map(va, 2 * g, h).ok());
  const ContractCounts before = d.contract_counts();
  const uint64_t maps_before = d.calls(DriverOp::kMap);

  // Sizes and alignment.
  EXPECT_EQ(d.Create(0, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d.Create(0, g + 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d.Reserve(g / 2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d.Reserve(g, 3 * g).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d.Map(va + 2 * g + 1, 2 * g, h).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(d.Map(va + 2 * g, 2 * g + 1, h).code(),
            StatusCode::kInvalidArgument);
  // Map outside any reservation, and across the end of one.
  EXPECT_EQ(d.Map(va + 64 * g, 2 * g, h).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d.Map(va + 3 * g, 2 * g, h).code(), StatusCode::kInvalidArgument);
  // Beyond the handle, and part of it (CUDA maps whole handles only).
  EXPECT_EQ(d.Map(va + 2 * g, 2 * g, h, g).code(), StatusCode::kUnimplemented);
  EXPECT_EQ(d.Map(va + 2 * g, 4 * g, h).code(), StatusCode::kUnimplemented);
  // An unknown handle.
  EXPECT_EQ(d.Map(va + 2 * g, 2 * g, PhysicalHandle{h.value + 977}).code(),
            StatusCode::kInvalidArgument);
  // Double map (overlapping an existing mapping).
  EXPECT_EQ(d.Map(va + g, 2 * g, h).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(d.Map(va, 2 * g, h).code(), StatusCode::kAlreadyExists);
  // Release of a mapped handle; unknown handle.
  EXPECT_EQ(d.Release(h).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.Release(PhysicalHandle{h.value + 977}).code(),
            StatusCode::kInvalidArgument);
  // Unmap of a part of a mapping, of a range with unmapped bytes, of nothing.
  EXPECT_EQ(d.Unmap(va, g).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d.Unmap(va + g, g).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d.Unmap(va, 3 * g).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d.Unmap(va + 3 * g, g).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d.SetAccess(va, g, 0).code(), StatusCode::kInvalidArgument);
  // Unreserve with a live mapping, or not exactly a reservation.
  EXPECT_EQ(d.Unreserve(va, 4 * g).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.Unreserve(va, 2 * g).code(), StatusCode::kInvalidArgument);
  // Data access before SetAccess, and to unmapped addresses.
  uint8_t byte = 0;
  EXPECT_EQ(d.CopyToHost(&byte, va, 1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.CopyToHost(&byte, va + 3 * g, 1).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(d.Memset(va + 2 * g - 1, 0, 2).code(),
            StatusCode::kFailedPrecondition);

  const ContractCounts after = d.contract_counts();
  EXPECT_EQ(after.handles, before.handles);
  EXPECT_EQ(after.mappings, before.mappings);
  EXPECT_EQ(after.mapped_bytes, before.mapped_bytes);
  EXPECT_EQ(after.reservations, before.reservations);
  EXPECT_EQ(d.calls(DriverOp::kMap), maps_before)
      << "rejected calls reached the backend";

  ASSERT_TRUE(d.Unmap(va, 2 * g).ok());
  ASSERT_TRUE(d.Release(h).ok());
  ASSERT_TRUE(d.Unreserve(va, 4 * g).ok());
}

TYPED_TEST(DriverContractTest, StreamsAndEvents) {
  Driver& d = *this->driver_;
  StatusOr<Stream> stream = d.CreateStream(0);
  ASSERT_TRUE(stream.ok()) << stream.status().ToString();
  StatusOr<Event> event = d.CreateEvent(0);
  ASSERT_TRUE(event.ok()) << event.status().ToString();
  ASSERT_TRUE(d.RecordEvent(*event, *stream).ok());
  ASSERT_TRUE(d.SynchronizeEvent(*event).ok());
  StatusOr<bool> done = d.QueryEvent(*event);
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done);
  ASSERT_TRUE(d.RecordEvent(*event, 0).ok());  // the default stream works too
  ASSERT_TRUE(d.SynchronizeStream(0).ok());
  ASSERT_TRUE(d.SynchronizeStream(*stream).ok());
  ASSERT_TRUE(d.DestroyEvent(*event).ok());
  ASSERT_TRUE(d.DestroyStream(*stream).ok());
  EXPECT_FALSE(d.DestroyEvent(Event{}).ok());
  EXPECT_FALSE(d.DestroyStream(0).ok());
}

TYPED_TEST(DriverContractTest, ConcurrentMappingFromManyThreads) {
  Driver& d = *this->driver_;
  const uint64_t g = this->g_;
  constexpr int kThreads = 4;
  constexpr int kRounds = 25;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        StatusOr<DevicePtr> va = d.Reserve(g);
        StatusOr<PhysicalHandle> h = d.Create(0, g);
        if (!va.ok() || !h.ok() || !d.Map(*va, g, *h).ok() ||
            !d.SetAccess(*va, g, 0).ok()) {
          ++failures;
          return;
        }
        if (d.holds_data()) {
          uint8_t value = static_cast<uint8_t>(t * 31 + r);
          uint8_t back = 0;
          if (!d.Memset(*va, value, g).ok() ||
              !d.CopyToHost(&back, *va + g - 1, 1).ok() || back != value) {
            ++failures;
          }
        }
        if (!d.Unmap(*va, g).ok() || !d.Release(*h).ok() ||
            !d.Unreserve(*va, g).ok()) {
          ++failures;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace loom::vmm
