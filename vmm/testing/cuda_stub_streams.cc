// The stub libcuda's streams, events and data transfers (cuda_stub.h says
// what is modelled: queued work runs when something waits for it).
#ifndef LOOM_NO_CUDA_HEADERS  // else the stub is an empty library
#include <cstring>

#include "vmm/testing/cuda_stub_entries.h"
#include "vmm/testing/cuda_stub_state.h"

namespace loom::cuda_stub {
namespace {

// A fault of `stream`'s work so far: returned once, then cleared.
CUresult TakeError(CUstream_st* stream) {
  const CUresult error = stream->error;
  stream->error = CUDA_SUCCESS;
  return error;
}

// A synchronous copy or memset: on the current context's NULL stream, after
// its earlier work. `to_host` null: a memset (or a copy to the device from
// `from_host`).
CUresult Synchronous(State& s, CUdeviceptr device, void* to_host,
                     const void* from_host, uint8_t value, size_t size) {
  CUresult error;
  CUctx_st* ctx = CurrentContext(s, &error);
  if (ctx == nullptr) return error;
  Run(s, ctx->null_stream, UINT64_MAX);
  error = TakeError(ctx->null_stream);
  if (error != CUDA_SUCCESS) return error;
  std::optional<std::vector<Piece>> pieces =
      Translate(s, device, size, /*need_access=*/true);
  if (!pieces) return CUDA_ERROR_INVALID_VALUE;
  auto* out = static_cast<uint8_t*>(to_host);
  auto* in = static_cast<const uint8_t*>(from_host);
  for (const Piece& p : *pieces) {
    if (out != nullptr) {
      std::memcpy(out, p.bytes, p.size);
      out += p.size;
    } else if (in != nullptr) {
      std::memcpy(p.bytes, in, p.size);
      in += p.size;
    } else {
      std::memset(p.bytes, value, p.size);
    }
  }
  return CUDA_SUCCESS;
}

// Queues a memset (`host` null) or a copy to `host` on `stream`.
CUresult Queue(State& s, CUstream stream, CUdeviceptr device, void* host,
               uint8_t value, size_t size) {
  CUresult error;
  CUstream_st* target = ResolveStream(s, stream, &error);
  if (target == nullptr) return error;
  if (!Translate(s, device, size, /*need_access=*/true)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  StubOp op;
  op.kind = host == nullptr ? StubOp::Kind::kMemset : StubOp::Kind::kCopyToHost;
  op.device = device;
  op.host = host;
  op.value = value;
  op.size = size;
  Enqueue(target, op);
  return CUDA_SUCCESS;
}

CUresult Destroy(State& s, CUstream stream) {
  CUresult error;
  if (stream == nullptr || stream == CU_STREAM_LEGACY ||
      stream == CU_STREAM_PER_THREAD) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  CUstream_st* target = ResolveStream(s, stream, &error);
  if (target == nullptr) return error;
  Run(s, target, UINT64_MAX);  // its work completes, then it goes
  target->destroyed = true;
  return CUDA_SUCCESS;
}

CUresult SynchronizeStream(State& s, CUstream stream) {
  CUresult error;
  CUstream_st* target = ResolveStream(s, stream, &error);
  if (target == nullptr) return error;
  Run(s, target, UINT64_MAX);
  return TakeError(target);
}

CUresult DestroyEvent(State& s, CUevent event) {
  CUresult error;
  CUevent_st* e = ResolveEvent(s, event, &error);
  if (e == nullptr) return error;
  e->destroyed = true;
  return CUDA_SUCCESS;
}

CUresult RecordEvent(State& s, CUevent event, CUstream stream) {
  CUresult error;
  CUevent_st* e = ResolveEvent(s, event, &error);
  if (e == nullptr) return error;
  CUstream_st* target = ResolveStream(s, stream, &error);
  if (target == nullptr) return error;
  if (target->ctx != e->ctx) return CUDA_ERROR_INVALID_HANDLE;
  e->stream = target;
  e->target = target->enqueued;
  ++e->recording;
  return CUDA_SUCCESS;
}

CUresult WaitEvent(State& s, CUstream stream, CUevent event,
                   unsigned int flags) {
  CUresult error;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  CUevent_st* e = ResolveEvent(s, event, &error);
  if (e == nullptr) return error;
  CUstream_st* target = ResolveStream(s, stream, &error);
  if (target == nullptr) return error;
  if (e->stream != nullptr && e->stream != target) {
    StubOp op;
    op.kind = StubOp::Kind::kWait;
    op.wait_stream = e->stream;
    op.wait_target = e->target;
    Enqueue(target, op);
  }
  return CUDA_SUCCESS;
}

CUresult HostToDevice(State& s, CUdeviceptr dst, const void* src, size_t size) {
  if (src == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return Synchronous(s, dst, nullptr, src, 0, size);
}

CUresult DeviceToHost(State& s, void* dst, CUdeviceptr src, size_t size) {
  if (dst == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return Synchronous(s, src, dst, nullptr, 0, size);
}

CUresult AsyncToHost(State& s, void* dst, CUdeviceptr src, size_t size,
                     CUstream stream) {
  if (dst == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return Queue(s, stream, src, dst, 0, size);
}

void ThirtyTwoBit(State& s, const char* variant) {
  Problem(s, std::string(variant) +
                 ": the 32-bit ABI (CUDA 2.0) called by a 64-bit program");
}

}  // namespace

CUresult StreamCreate(CUstream* stream, unsigned int flags) {
  STUB_ENTER("cuStreamCreate", "%u", flags);
  CUresult error;
  CUctx_st* ctx = CurrentContext(s, &error);
  if (ctx == nullptr) STUB_RETURN(error);
  if (stream == nullptr ||
      (flags != CU_STREAM_DEFAULT && flags != CU_STREAM_NON_BLOCKING)) {
    STUB_RETURN(CUDA_ERROR_INVALID_VALUE);
  }
  *stream = NewStream(s, ctx);
  STUB_RETURN(CUDA_SUCCESS);
}

CUresult StreamDestroy_v1(CUstream stream) {
  STUB_ENTER("cuStreamDestroy", "%p", static_cast<void*>(stream));
  STUB_RETURN(Destroy(s, stream));
}

CUresult StreamDestroy_v2(CUstream stream) {
  STUB_ENTER("cuStreamDestroy_v2", "%p", static_cast<void*>(stream));
  STUB_RETURN(Destroy(s, stream));
}

CUresult StreamSynchronize(CUstream stream) {
  STUB_ENTER("cuStreamSynchronize", "%p", static_cast<void*>(stream));
  STUB_RETURN(SynchronizeStream(s, stream));
}

CUresult StreamSynchronize_ptsz(CUstream stream) {
  STUB_ENTER("cuStreamSynchronize_ptsz", "%p", static_cast<void*>(stream));
  STUB_RETURN(SynchronizeStream(s, stream));
}

CUresult EventCreate(CUevent* event, unsigned int flags) {
  STUB_ENTER("cuEventCreate", "%u", flags);
  CUresult error;
  CUctx_st* ctx = CurrentContext(s, &error);
  if (ctx == nullptr) STUB_RETURN(error);
  if (event == nullptr ||
      (flags & ~(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING)) != 0) {
    STUB_RETURN(CUDA_ERROR_INVALID_VALUE);
  }
  s.events.push_back(std::make_unique<CUevent_st>());
  CUevent_st* e = s.events.back().get();
  e->ctx = ctx;
  s.known.insert(e);
  *event = e;
  STUB_RETURN(CUDA_SUCCESS);
}

CUresult EventDestroy_v1(CUevent event) {
  STUB_ENTER("cuEventDestroy", "%p", static_cast<void*>(event));
  STUB_RETURN(DestroyEvent(s, event));
}

CUresult EventDestroy_v2(CUevent event) {
  STUB_ENTER("cuEventDestroy_v2", "%p", static_cast<void*>(event));
  STUB_RETURN(DestroyEvent(s, event));
}

CUresult EventRecord(CUevent event, CUstream stream) {
  STUB_ENTER("cuEventRecord", "%p, %p", static_cast<void*>(event),
             static_cast<void*>(stream));
  STUB_RETURN(RecordEvent(s, event, stream));
}

CUresult EventRecord_ptsz(CUevent event, CUstream stream) {
  STUB_ENTER("cuEventRecord_ptsz", "%p, %p", static_cast<void*>(event),
             static_cast<void*>(stream));
  STUB_RETURN(RecordEvent(s, event, stream));
}

CUresult EventQuery(CUevent event) {
  STUB_ENTER("cuEventQuery", "%p", static_cast<void*>(event));
  CUresult error;
  CUevent_st* e = ResolveEvent(s, event, &error);
  if (e == nullptr) STUB_RETURN(error);
  if (e->stream == nullptr || e->stream->executed >= e->target) {
    STUB_RETURN(CUDA_SUCCESS);
  }
  // The first query of a pending recording: not yet; the next one: done.
  if (e->answered != e->recording) {
    e->answered = e->recording;
    STUB_RETURN(CUDA_ERROR_NOT_READY);
  }
  Run(s, e->stream, e->target);
  STUB_RETURN(TakeError(e->stream));
}

CUresult EventSynchronize(CUevent event) {
  STUB_ENTER("cuEventSynchronize", "%p", static_cast<void*>(event));
  CUresult error;
  CUevent_st* e = ResolveEvent(s, event, &error);
  if (e == nullptr) STUB_RETURN(error);
  if (e->stream == nullptr) STUB_RETURN(CUDA_SUCCESS);
  Run(s, e->stream, e->target);
  STUB_RETURN(TakeError(e->stream));
}

CUresult StreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
  STUB_ENTER("cuStreamWaitEvent", "%p, %p, %u", static_cast<void*>(stream),
             static_cast<void*>(event), flags);
  STUB_RETURN(WaitEvent(s, stream, event, flags));
}

CUresult StreamWaitEvent_ptsz(CUstream stream, CUevent event,
                              unsigned int flags) {
  STUB_ENTER("cuStreamWaitEvent_ptsz", "%p, %p, %u", static_cast<void*>(stream),
             static_cast<void*>(event), flags);
  STUB_RETURN(WaitEvent(s, stream, event, flags));
}

CUresult MemcpyHtoD_v1(unsigned int dst, const void* src, unsigned int size) {
  STUB_ENTER("cuMemcpyHtoD", "%#x, %u", dst, size);
  ThirtyTwoBit(s, kVariant);
  STUB_RETURN(HostToDevice(s, dst, src, size));
}

CUresult MemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t size) {
  STUB_ENTER("cuMemcpyHtoD_v2", "%#llx, %zu", dst, size);
  STUB_RETURN(HostToDevice(s, dst, src, size));
}

CUresult MemcpyHtoD_v2_ptds(CUdeviceptr dst, const void* src, size_t size) {
  STUB_ENTER("cuMemcpyHtoD_v2_ptds", "%#llx, %zu", dst, size);
  STUB_RETURN(HostToDevice(s, dst, src, size));
}

CUresult MemcpyDtoH_v1(void* dst, unsigned int src, unsigned int size) {
  STUB_ENTER("cuMemcpyDtoH", "%#x, %u", src, size);
  ThirtyTwoBit(s, kVariant);
  STUB_RETURN(DeviceToHost(s, dst, src, size));
}

CUresult MemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t size) {
  STUB_ENTER("cuMemcpyDtoH_v2", "%#llx, %zu", src, size);
  STUB_RETURN(DeviceToHost(s, dst, src, size));
}

CUresult MemcpyDtoH_v2_ptds(void* dst, CUdeviceptr src, size_t size) {
  STUB_ENTER("cuMemcpyDtoH_v2_ptds", "%#llx, %zu", src, size);
  STUB_RETURN(DeviceToHost(s, dst, src, size));
}

CUresult MemsetD8_v1(unsigned int dst, unsigned char value, unsigned int size) {
  STUB_ENTER("cuMemsetD8", "%#x, %u, %u", dst, value, size);
  ThirtyTwoBit(s, kVariant);
  STUB_RETURN(Synchronous(s, dst, nullptr, nullptr, value, size));
}

CUresult MemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t size) {
  STUB_ENTER("cuMemsetD8_v2", "%#llx, %u, %zu", dst, value, size);
  STUB_RETURN(Synchronous(s, dst, nullptr, nullptr, value, size));
}

CUresult MemsetD8_v2_ptds(CUdeviceptr dst, unsigned char value, size_t size) {
  STUB_ENTER("cuMemsetD8_v2_ptds", "%#llx, %u, %zu", dst, value, size);
  STUB_RETURN(Synchronous(s, dst, nullptr, nullptr, value, size));
}

CUresult MemsetD8Async(CUdeviceptr dst, unsigned char value, size_t size,
                       CUstream stream) {
  STUB_ENTER("cuMemsetD8Async", "%#llx, %u, %zu, %p", dst, value, size,
             static_cast<void*>(stream));
  STUB_RETURN(Queue(s, stream, dst, nullptr, value, size));
}

CUresult MemsetD8Async_ptsz(CUdeviceptr dst, unsigned char value, size_t size,
                            CUstream stream) {
  STUB_ENTER("cuMemsetD8Async_ptsz", "%#llx, %u, %zu, %p", dst, value, size,
             static_cast<void*>(stream));
  STUB_RETURN(Queue(s, stream, dst, nullptr, value, size));
}

CUresult MemcpyDtoHAsync_v1(void* dst, unsigned int src, unsigned int size,
                            CUstream stream) {
  STUB_ENTER("cuMemcpyDtoHAsync", "%#x, %u, %p", src, size,
             static_cast<void*>(stream));
  ThirtyTwoBit(s, kVariant);
  STUB_RETURN(AsyncToHost(s, dst, src, size, stream));
}

CUresult MemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t size,
                            CUstream stream) {
  STUB_ENTER("cuMemcpyDtoHAsync_v2", "%#llx, %zu, %p", src, size,
             static_cast<void*>(stream));
  STUB_RETURN(AsyncToHost(s, dst, src, size, stream));
}

CUresult MemcpyDtoHAsync_v2_ptsz(void* dst, CUdeviceptr src, size_t size,
                                 CUstream stream) {
  STUB_ENTER("cuMemcpyDtoHAsync_v2_ptsz", "%#llx, %zu, %p", src, size,
             static_cast<void*>(stream));
  STUB_RETURN(AsyncToHost(s, dst, src, size, stream));
}

}  // namespace loom::cuda_stub

#endif  // LOOM_NO_CUDA_HEADERS
