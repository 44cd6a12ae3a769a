/* libloom.so: the C ABI that PyTorch and the `loom` Python package load.
 *
 * loom_malloc / loom_free have the signatures that
 * torch.cuda.memory.CUDAPluggableAllocator(path, "loom_malloc", "loom_free")
 * expects; loom_record_stream, loom_empty_cache and loom_set_memory_fraction
 * match the optional hooks of its `_allocator` object. Everything else is
 * control for the Python package (configure, markers, plans, stats).
 *
 * No C++ exception crosses this boundary, with one deliberate exception:
 * loom_torch_malloc (below). Calls that can fail return 0 on success or a
 * non-zero loom::StatusCode; loom_malloc returns NULL. loom_last_error()
 * gives the message of the calling thread's last failure. Streams are passed as `void*`
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
#ifdef __cplusplus
/* loom_malloc for PyTorch's CUDAPluggableAllocator, the one function that
 * throws. PyTorch calls its malloc from C++ through a std::function and does
 * not check the result for NULL: a NULL data pointer faults later on the
 * device. Its pluggable allocators report failure by throwing (as RMM's
 * does), which PyTorch turns into a Python RuntimeError. So on any failure
 * of a positive-size request this throws a std::runtime_error whose message
 * starts "CUDA out of memory." for out-of-memory (the text PyTorch's own
 * allocator uses, which batch-size finders look for), "loom: " otherwise,
 * and names the request and loom's reason. Size 0 returns NULL. Only for
 * C++ callers that catch std::exception. */
void* loom_torch_malloc(ssize_t size, int device, void* stream);
#endif
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

/* Creates `device`'s allocator now (installing the configured plan, if any)
 * instead of at its first allocation, so a bad plan fails here. */
int loom_init_device(int device);

/* Stops recording on every device and frees the record buffers (what was
 * recorded and not written is lost). */
int loom_stop_recording(void);

/* Installs a plan on `device` now (the `auto` mode's switch). */
int loom_load_plan(int device, const char* path);
/* Writes everything recorded on `device` so far as a trace file (text form
 * for a `.ltt` path, binary otherwise). */
int loom_write_trace(int device, const char* path);

/* Stats of `device` as JSON (torch.cuda.memory_stats() keys plus "loom.*");
 * all zero for a device that has served nothing (reading stats never creates
 * an allocator). Writes at most `capacity` bytes (NUL-terminated) into
 * `buffer` and returns the full length, so a caller can retry with a larger
 * buffer; -1 on error. */
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
