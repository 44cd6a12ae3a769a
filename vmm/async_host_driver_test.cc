// The async host backend: streams that run later, events with CUDA's
// meaning, and the faults it reports.
#include "vmm/async_host_driver.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <vector>

namespace loom::vmm {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

constexpr uint64_t kG = 64 << 10;

class AsyncHostDriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HostDriverOptions options;
    options.granularity = kG;
    options.capacity_per_device = 64 * kG;
    options.device_count = 2;
    StatusOr<std::unique_ptr<AsyncHostDriver>> d =
        AsyncHostDriver::Open(options);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    driver_ = std::move(d).value();
  }

  // One accessible granule mapped at a fresh address; returns (va, handle).
  std::pair<DevicePtr, PhysicalHandle> MapOne(DevicePtr* reservation) {
    StatusOr<DevicePtr> va = driver_->Reserve(2 * kG);
    EXPECT_TRUE(va.ok());
    *reservation = *va;
    StatusOr<PhysicalHandle> h = driver_->Create(0, kG);
    EXPECT_TRUE(h.ok());
    EXPECT_TRUE(driver_->Map(*va, kG, *h).ok());
    EXPECT_TRUE(driver_->SetAccess(*va, kG, 0).ok());
    return {*va, *h};
  }

  void Unwind(DevicePtr va, PhysicalHandle h, bool mapped = true) {
    if (mapped) ASSERT_TRUE(driver_->Unmap(va, kG).ok());
    ASSERT_TRUE(driver_->Release(h).ok());
    ASSERT_TRUE(driver_->Unreserve(va, 2 * kG).ok());
  }

  std::unique_ptr<AsyncHostDriver> driver_;
};

TEST_F(AsyncHostDriverTest, KernelsRunLaterInStreamOrder) {
  DevicePtr reservation;
  auto [va, h] = MapOne(&reservation);
  StatusOr<Stream> s = driver_->CreateStream(0);
  ASSERT_TRUE(s.ok());
  auto* bytes = reinterpret_cast<uint8_t*>(va);
  std::vector<int> order;
  for (int i = 0; i < 3; ++i) {
    Kernel k;
    k.accesses = {{va, kG}};
    k.delay = microseconds(i == 0 ? 20000 : 0);
    k.body = [&order, bytes, i] {
      order.push_back(i);
      bytes[0] = static_cast<uint8_t>(i + 1);
    };
    ASSERT_TRUE(driver_->Launch(*s, std::move(k)).ok());
  }
  // The first kernel sleeps 20 ms: nothing has run yet.
  EXPECT_EQ(bytes[0], 0);
  StatusOr<Event> e = driver_->CreateEvent(0);
  ASSERT_TRUE(e.ok());
  ASSERT_TRUE(driver_->RecordEvent(*e, *s).ok());
  StatusOr<bool> done = driver_->QueryEvent(*e);
  ASSERT_TRUE(done.ok());
  EXPECT_FALSE(*done);
  ASSERT_TRUE(driver_->SynchronizeEvent(*e).ok());
  EXPECT_TRUE(*driver_->QueryEvent(*e));
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(bytes[0], 3);
  EXPECT_EQ(driver_->counters().kernels_run, 3u);
  EXPECT_EQ(driver_->counters().faults, 0u);
  ASSERT_TRUE(driver_->DestroyEvent(*e).ok());
  ASSERT_TRUE(driver_->DestroyStream(*s).ok());
  Unwind(va, h);
}

TEST_F(AsyncHostDriverTest, StreamWaitEventOrdersTwoStreams) {
  DevicePtr reservation;
  auto [va, h] = MapOne(&reservation);
  auto* bytes = reinterpret_cast<uint8_t*>(va);
  Stream a = *driver_->CreateStream(0), b = *driver_->CreateStream(0);
  Kernel slow;
  slow.accesses = {{va, 1}};
  slow.delay = microseconds(30000);
  slow.body = [bytes] { bytes[0] = 7; };
  ASSERT_TRUE(driver_->Launch(a, std::move(slow)).ok());
  Event e = *driver_->CreateEvent(0);
  ASSERT_TRUE(driver_->RecordEvent(e, a).ok());
  ASSERT_TRUE(driver_->StreamWaitEvent(b, e).ok());
  std::atomic<int> seen{-1};
  Kernel reader;
  reader.accesses = {{va, 1}};
  reader.body = [bytes, &seen] { seen = bytes[0]; };
  ASSERT_TRUE(driver_->Launch(b, std::move(reader)).ok());
  ASSERT_TRUE(driver_->SynchronizeStream(b).ok());
  EXPECT_EQ(seen.load(), 7);  // b waited for a's kernel
  ASSERT_TRUE(driver_->DestroyEvent(e).ok());
  ASSERT_TRUE(driver_->DestroyStream(a).ok());
  ASSERT_TRUE(driver_->DestroyStream(b).ok());
  Unwind(va, h);
}

TEST_F(AsyncHostDriverTest, UnmapUnderAQueuedKernelIsAFault) {
  DevicePtr reservation;
  auto [va, h] = MapOne(&reservation);
  Stream s = *driver_->CreateStream(0);
  std::atomic<bool> ran{false};
  Kernel k;
  k.accesses = {{va, kG}};
  k.delay = microseconds(20000);
  k.body = [&ran] { ran = true; };
  ASSERT_TRUE(driver_->Launch(s, std::move(k)).ok());
  ASSERT_TRUE(driver_->Unmap(va, kG).ok());  // too early
  ASSERT_TRUE(driver_->SynchronizeStream(s).ok());
  EXPECT_FALSE(ran.load());  // skipped: its memory was gone
  AsyncHostDriver::Counters c = driver_->counters();
  EXPECT_EQ(c.kernels_skipped, 1u);
  EXPECT_EQ(c.faults, 2u);  // the unmap, and the kernel that found it gone
  std::vector<std::string> faults = driver_->TakeFaults();
  ASSERT_EQ(faults.size(), 2u);
  EXPECT_NE(faults[0].find("unmap of"), std::string::npos) << faults[0];
  ASSERT_TRUE(driver_->DestroyStream(s).ok());
  Unwind(va, h, /*mapped=*/false);
}

TEST_F(AsyncHostDriverTest, UnmapAfterSynchronizeIsFine) {
  DevicePtr reservation;
  auto [va, h] = MapOne(&reservation);
  Stream s = *driver_->CreateStream(0);
  Kernel k;
  k.accesses = {{va, kG}};
  k.delay = microseconds(5000);
  ASSERT_TRUE(driver_->Launch(s, std::move(k)).ok());
  ASSERT_TRUE(driver_->SynchronizeDevice(0).ok());
  ASSERT_TRUE(driver_->Unmap(va, kG).ok());
  EXPECT_EQ(driver_->counters().faults, 0u);
  ASSERT_TRUE(driver_->DestroyStream(s).ok());
  Unwind(va, h, /*mapped=*/false);
}

TEST_F(AsyncHostDriverTest, HandOutToAnotherStreamWhileInUseIsAFault) {
  DevicePtr reservation;
  auto [va, h] = MapOne(&reservation);
  // The same physical granule through a second address (as loom lends a
  // static page to the arena): the check is physical, not virtual.
  ASSERT_TRUE(driver_->Map(reservation + kG, kG, h).ok());
  ASSERT_TRUE(driver_->SetAccess(reservation + kG, kG, 0).ok());
  Stream a = *driver_->CreateStream(0), b = *driver_->CreateStream(0);
  Kernel k;
  k.accesses = {{va + 4096, 4096}};
  k.delay = microseconds(20000);
  ASSERT_TRUE(driver_->Launch(a, std::move(k)).ok());
  // Same stream: stream order makes it safe. Other bytes: no conflict.
  EXPECT_TRUE(driver_->CheckHandOut(reservation + kG + 4096, 4096, a));
  EXPECT_TRUE(driver_->CheckHandOut(reservation + kG + 8192, 4096, b));
  // The bytes the kernel uses, to another stream: a fault.
  EXPECT_FALSE(driver_->CheckHandOut(reservation + kG, 8192, b));
  EXPECT_EQ(driver_->counters().faults, 1u);
  ASSERT_TRUE(driver_->SynchronizeStream(a).ok());
  EXPECT_TRUE(driver_->CheckHandOut(reservation + kG, 8192, b));
  // Unmapping one address range of the bytes leaves the other mapping, and
  // the kernels that use it, alone: not a fault.
  Kernel later;
  later.accesses = {{va, 64}};
  later.delay = microseconds(10000);
  ASSERT_TRUE(driver_->Launch(a, std::move(later)).ok());
  ASSERT_TRUE(driver_->Unmap(reservation + kG, kG).ok());
  ASSERT_TRUE(driver_->SynchronizeStream(a).ok());
  EXPECT_EQ(driver_->counters().faults, 1u);
  EXPECT_EQ(driver_->counters().kernels_skipped, 0u);
  ASSERT_TRUE(driver_->DestroyStream(a).ok());
  ASSERT_TRUE(driver_->DestroyStream(b).ok());
  Unwind(va, h);
}

TEST_F(AsyncHostDriverTest, ForeignStreamValuesGetAWorker) {
  DevicePtr reservation;
  auto [va, h] = MapOne(&reservation);
  const Stream torch_stream = 0x7f00deadbeef;  // a PyTorch stream, say
  std::atomic<int> runs{0};
  for (Stream s : {Stream{0}, torch_stream}) {
    Kernel k;
    k.accesses = {{va, 8}};
    k.body = [&runs] { ++runs; };
    ASSERT_TRUE(driver_->Launch(s, std::move(k)).ok());
  }
  ASSERT_TRUE(driver_->SynchronizeStream(torch_stream).ok());
  ASSERT_TRUE(driver_->SynchronizeStream(0).ok());
  EXPECT_EQ(runs.load(), 2);
  // Only streams created here can be destroyed.
  EXPECT_FALSE(driver_->DestroyStream(torch_stream).ok());
  Unwind(va, h);
}

TEST_F(AsyncHostDriverTest, LaunchOnUnmappedMemoryIsRefused) {
  StatusOr<DevicePtr> va = driver_->Reserve(kG);
  ASSERT_TRUE(va.ok());
  Kernel k;
  k.accesses = {{*va, 64}};
  EXPECT_EQ(driver_->Launch(0, std::move(k)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(driver_->counters().kernels_launched, 0u);
  ASSERT_TRUE(driver_->Unreserve(*va, kG).ok());
}

// A wait refers to the recording it follows, even when the event is
// recorded again on a faster stream before that recording completes.
TEST_F(AsyncHostDriverTest, WaitFollowsTheRecordingBeforeIt) {
  DevicePtr reservation;
  auto [va, h] = MapOne(&reservation);
  auto* bytes = reinterpret_cast<uint8_t*>(va);
  Stream slow = *driver_->CreateStream(0), fast = *driver_->CreateStream(0),
         reader = *driver_->CreateStream(0);
  Kernel writer;
  writer.accesses = {{va, 1}};
  writer.delay = microseconds(30000);
  writer.body = [bytes] { bytes[0] = 9; };
  ASSERT_TRUE(driver_->Launch(slow, std::move(writer)).ok());
  Event e = *driver_->CreateEvent(0);
  ASSERT_TRUE(driver_->RecordEvent(e, slow).ok());
  ASSERT_TRUE(driver_->StreamWaitEvent(reader, e).ok());
  ASSERT_TRUE(driver_->RecordEvent(e, fast).ok());  // completes at once
  std::atomic<int> seen{-1};
  Kernel check;
  check.accesses = {{va, 1}};
  check.body = [bytes, &seen] { seen = bytes[0]; };
  ASSERT_TRUE(driver_->Launch(reader, std::move(check)).ok());
  ASSERT_TRUE(driver_->SynchronizeStream(reader).ok());
  EXPECT_EQ(seen.load(), 9);
  ASSERT_TRUE(driver_->DestroyEvent(e).ok());
  for (Stream s : {slow, fast, reader}) {
    ASSERT_TRUE(driver_->DestroyStream(s).ok());
  }
  Unwind(va, h);
}

TEST_F(AsyncHostDriverTest, UnrecordedEventIsComplete) {
  Event e = *driver_->CreateEvent(1);
  EXPECT_TRUE(*driver_->QueryEvent(e));
  ASSERT_TRUE(driver_->StreamWaitEvent(0, e).ok());
  ASSERT_TRUE(driver_->SynchronizeStream(0).ok());
  ASSERT_TRUE(driver_->DestroyEvent(e).ok());
}

}  // namespace
}  // namespace loom::vmm
