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
 *   backend=cuda|host|async|fake   driver backend (default cuda)
 *   granularity=BYTES        host/fake granularity (default 2MiB)
 *   device_memory=BYTES      host/fake memory per device (default 80GiB)
 *   devices=N                host/fake device count (default 1)
 *   cap=BYTES                physical memory cap per device (0 = none)
 *   fraction=X               cap as a fraction of device memory (0 = none)
 *   record=EVENTS            record a trace, buffer of EVENTS events (0 = off)
 *   plan=PATH                plan file installed on every device at first use
 *   peers=auto|none          auto (default): every device that can access a
 *                            device's memory (CUDA peer access) is granted
 *                            access to all loom maps there
 *   max_chunk_pages=N        the largest physical handle, in granules
 *                            (1..512, default 512): the layout variant
 *   host_sample_every=N      one call in N of loom_malloc / loom_free /
 *                            loom_record_stream is timed (0 = none, else a
 *                            power of two; default 256)
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

#ifdef __cplusplus
}  /* extern "C" */
#include <functional>
#include <utility>
struct CUstream_st;
extern "C" {
/* CUDA graph capture: the hooks PyTorch's CUDAPluggableAllocator takes
 * through set_begin_allocate_to_pool, set_end_allocate_to_pool_fn and
 * set_release_pool, with PyTorch's C++ signatures (MempoolId_t is a pair of
 * unsigned long long; the filter says which streams the pool serves). They
 * have C linkage but C++ parameter types, so only PyTorch (C++, the same
 * standard library) calls them. Failures are reported on stderr and in
 * loom_last_error(); nothing is thrown. See vmm/allocator.h for what a pool
 * means to loom. */
void loom_begin_allocate_to_pool(
    int device, std::pair<unsigned long long, unsigned long long> pool,
    std::function<bool(CUstream_st*)> filter);
void loom_end_allocate_to_pool(
    int device, std::pair<unsigned long long, unsigned long long> pool);
void loom_release_pool(int device,
                       std::pair<unsigned long long, unsigned long long> pool);
#endif

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

/* ---- Offline tools --------------------------------------------------------
 * The planner, the request fingerprint and trace files, in process, for the
 * Python package (no allocator is involved and no settings are needed): the
 * same C++ code as loom_tool, so Python never parses loom's formats. Calls
 * that produce a result store it as the calling thread's result, read with
 * loom_last_result() (valid until that thread's next such call). */

/* Plans the trace (text or binary) or MiniMalloc CSV at `input` with plan/'s
 * entry point and writes the plan file to `plan_path`. `options` are
 * "key=value" pairs separated by ';' (plan/make_plan.h: time_limit,
 * persistent, algorithm, scope, steady_iteration, granule, capacity, ...;
 * NULL or "" for the defaults). Result: the report as JSON; for a trace it
 * has "check": the plan replayed on that trace with and without it
 * (whatif/loom/plan_check.h: planned_peak_reserved_bytes,
 * unplanned_peak_reserved_bytes, earns_its_place), or "check_error" when
 * the check could not run (the plan is written all the same). A plan that
 * does not fit the capacity is not written: FAILED_PRECONDITION. */
int loom_plan_trace(const char* input, const char* plan_path,
                    const char* options);
/* Result: {"check": C} where C is the check recorded in the plan file at
 * `path` when it was made (section CHEK, as loom_plan_trace's "check"), or
 * null when the file has none. Errors: an unreadable or corrupt plan file,
 * a corrupt CHEK section (DATA_LOSS). */
int loom_plan_file_check(const char* path);
/* Result: the request fingerprint of the trace at `path` as JSON
 * (plan/trace/fingerprint.h). */
int loom_fingerprint_trace(const char* path);
const char* loom_last_result(void);

/* A trace in memory, read from a file or built event by event. Events cross
 * the ABI as records of LOOM_TRACE_FIELDS unsigned 64-bit values: kind
 * (1 alloc, 2 free, 3 iter_begin, 4 iter_end, 5 phase, 6 module_enter,
 * 7 module_exit), flags (1 = dynamic module), device, name (index into the
 * name table), id, size, stream. Every event appended is checked against the
 * trace format's rules (docs/formats.md), so whatever is built can be
 * written and read back. */
#define LOOM_TRACE_FIELDS 7
typedef struct loom_trace loom_trace;

/* A new empty trace; NULL (loom_last_error says why) for a bad header. */
loom_trace* loom_trace_new(int device, unsigned long long granularity,
                           const char* provenance);
/* Reads the trace file at `path` (either form) into `*out`. */
int loom_trace_read(const char* path, loom_trace** out);
void loom_trace_free(loom_trace* trace);
int loom_trace_header(const loom_trace* trace, int* device,
                      unsigned long long* granularity);
const char* loom_trace_provenance(const loom_trace* trace);
long long loom_trace_name_count(const loom_trace* trace);
/* NULL when `index` is out of range. */
const char* loom_trace_name(const loom_trace* trace, long long index);
/* The index of `name`, added when new; -1 on error. */
long long loom_trace_intern_name(loom_trace* trace, const char* name);
long long loom_trace_event_count(const loom_trace* trace);
/* Copies events [first, first + count) into `out` (count records). */
int loom_trace_get_events(const loom_trace* trace, long long first,
                          long long count, unsigned long long* out);
/* Appends `count` records. All or nothing: on error none is kept and the
 * message names the first bad event by its index in the trace. */
int loom_trace_add_events(loom_trace* trace, const unsigned long long* records,
                          long long count);
/* Writes the trace: the text form for a `.ltt` path, binary otherwise. */
int loom_trace_write(const loom_trace* trace, const char* path);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_TORCH_PLUGIN_LOOM_C_API_H_ */
