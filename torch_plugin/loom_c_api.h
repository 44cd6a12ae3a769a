/* libloom.so: the C ABI that PyTorch and the `loom` Python package load.
 *
 * loom_malloc / loom_free have the signatures that
 * torch.cuda.memory.CUDAPluggableAllocator(path, "loom_malloc", "loom_free")
 * expects; loom_record_stream, loom_empty_cache and loom_set_memory_fraction
 * match the optional hooks of its `_allocator` object. Everything else is
 * control for the Python package (configure, markers, plans, stats).
 *
 * No C++ exception crosses this boundary. Calls that can fail return 0 on
 * success or a non-zero loom::StatusCode; loom_malloc returns NULL (PyTorch
 * turns that into OutOfMemoryError). loom_last_error() gives the message of
 * the calling thread's last failure. Streams are passed as `void*`
 * (cudaStream_t / CUstream: the same pointer type). All functions are
 * thread-safe.
 */
#ifndef LOOM_TORCH_PLUGIN_LOOM_C_API_H_
#define LOOM_TORCH_PLUGIN_LOOM_C_API_H_

#include <stddef.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Settings, as "key=value" pairs separated by ';' (or newlines). Keys:
 *   backend=cuda|host|fake   driver backend (default cuda)
 *   granularity=BYTES        host/fake granularity (default 2MiB)
 *   device_memory=BYTES      host/fake memory per device (default 80GiB)
 *   devices=N                host/fake device count (default 1)
 *   cap=BYTES                physical memory cap per device (0 = none)
 *   fraction=X               cap as a fraction of device memory (0 = none)
 *   record=EVENTS            record a trace, buffer of EVENTS events (0 = off)
 *   plan=PATH                plan file installed on every device at first use
 * Must come before the first allocation; returns FAILED_PRECONDITION after.
 * Unknown keys and bad values are INVALID_ARGUMENT and change nothing. */
int loom_configure(const char* settings);

void* loom_malloc(ssize_t size, int device, void* stream);
void loom_free(void* ptr, ssize_t size, int device, void* stream);

/* PyTorch's optional allocator hooks. */
void loom_record_stream(void* ptr, void* stream);
void loom_empty_cache(void);
void loom_set_memory_fraction(double fraction, int device);

/* Markers, for every device. */
void loom_iteration_begin(long long iteration);
void loom_iteration_end(long long iteration);
void loom_phase(const char* name);
void loom_module_enter(const char* name, int dynamic);
void loom_module_exit(const char* name);

/* Installs a plan on `device` now (the `auto` mode's switch). */
int loom_load_plan(int device, const char* path);
/* Writes the trace recorded on `device` so far (binary or text by the
 * extension: .ltt is text) and forgets it. */
int loom_write_trace(int device, const char* path);

/* Stats of `device` as JSON (torch.cuda.memory_stats() keys plus "loom.*").
 * Writes at most `capacity` bytes (NUL-terminated) into `buffer` and returns
 * the full length, so a caller can retry with a larger buffer; -1 on error. */
long long loom_stats_json(int device, char* buffer, size_t capacity);
int loom_reset_peak_stats(int device);
/* Checks every invariant of `device`'s allocator (aborts if one is broken):
 * for tests. */
int loom_check_invariants(int device);

/* Destroys every allocator and the driver; FAILED_PRECONDITION (and nothing
 * is destroyed) while allocations are live. Settings may be changed after. */
int loom_shutdown(void);

const char* loom_last_error(void);
const char* loom_version(void);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_TORCH_PLUGIN_LOOM_C_API_H_ */
