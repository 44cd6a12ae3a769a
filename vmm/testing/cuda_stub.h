/* A stub libcuda.so.1 for tests: enough of the CUDA driver, on host memory,
 * for loom's CudaDriver to be exercised without a GPU (vmm/testing/BUILD
 * builds it as libcuda_stub.so; CudaDriver loads it when LOOM_LIBCUDA names
 * it, docs/driver_contract.md).
 *
 * What it is for: catching a call made through the wrong ABI. Like the real
 * driver, cuGetProcAddress hands out the function of the newest version not
 * above the one requested, and the stub has a DISTINCT function for every
 * version whose ABI changed (cuCtxSynchronize at 2000 takes nothing, at
 * 13000 it is cuCtxSynchronize_v2 taking a CUcontext; cuDeviceTotalMem,
 * cuMemGetInfo and the copies and memsets at 2000 take 32-bit sizes; the
 * per-thread-default-stream variants are handed out for
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM). Every call is counted by
 * the name of the variant that ran (e.g. "cuCtxSynchronize_v2"), and, while
 * logging is on, recorded with its arguments and result. A function taking
 * a CUcontext that is given something that is no context (what a caller
 * passing no argument leaves in the register) reports a "problem".
 *
 * The driver it models (CUDA 13.0 by default, as measured on an H200):
 *  - devices: LOOM_STUB_DEVICES (1), LOOM_STUB_DEVICE_MEMORY bytes each
 *    (80 GiB), granularity LOOM_STUB_GRANULARITY (2 MiB, minimum and
 *    recommended), driver version LOOM_STUB_DRIVER_VERSION (13000); read at
 *    the first cuInit. Nothing works before cuInit (NOT_INITIALIZED).
 *  - contexts: one primary context per device (retain/release counted; a
 *    released one is destroyed), a current context per thread. Calls that
 *    need a current context fail with INVALID_CONTEXT without one.
 *  - physical memory: cuMemCreate backs a handle with lazily committed host
 *    memory; cuMemMap maps a WHOLE handle only (offset 0, size = the
 *    handle's; else 801 CUDA_ERROR_NOT_SUPPORTED), inside one reservation,
 *    overlapping no mapping; one handle may be mapped at several addresses
 *    (they alias); cuMemUnmap takes exactly one whole mapping (part of one:
 *    1 CUDA_ERROR_INVALID_VALUE, measured; several adjacent ones in one
 *    call: refused too, as loom's contract does, never measured);
 *    cuMemSetAccess needs every byte mapped; a released handle's
 *    memory goes when its last mapping does.
 *  - streams and events: work queued on a stream (async memset and copy,
 *    waits) runs LATER, in order, when something waits for it: a stream,
 *    event or context synchronisation, a stream waiting on an event, or the
 *    second query of a pending event (the first one says NOT_READY). Work
 *    that finds its memory unmapped or inaccessible when it runs is a fault
 *    (counted, described) and the next synchronisation on that stream or
 *    context returns CUDA_ERROR_ILLEGAL_ADDRESS. The synchronous copies and
 *    memsets run on the context's NULL stream after its earlier work. All
 *    streams behave as non-blocking ones.
 *  - data: device addresses are not host addresses (they start at 2^45);
 *    copies and memsets move real bytes through the mappings.
 * Thread-safe (one lock); nothing blocks: waiting means running the work.
 *
 * The functions below are the stub's own, for tests (dlsym them). */
#ifndef LOOM_VMM_TESTING_CUDA_STUB_H_
#define LOOM_VMM_TESTING_CUDA_STUB_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Turns the detailed record of calls on (1) or off (0); off at start. */
void loom_stub_set_logging(int on);
/* Forgets the record of calls, the counts and the problems (faults stay). */
void loom_stub_clear(void);
/* The record, one call per line: "variant(args) -> CUDA_RESULT". Copies at
 * most `capacity` bytes (NUL-terminated) and returns the full length. The
 * same for the problems (one per line) and the counts ("variant N"). */
size_t loom_stub_read_log(char* out, size_t capacity);
size_t loom_stub_read_problems(char* out, size_t capacity);
size_t loom_stub_read_counts(char* out, size_t capacity);
/* Faults of queued work since the process started. */
uint64_t loom_stub_faults(void);
/* Live objects: handles (not released, or released and still mapped),
 * reservations, mappings, streams, events, primary-context retains. */
void loom_stub_live(uint64_t out[6]);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_VMM_TESTING_CUDA_STUB_H_ */
