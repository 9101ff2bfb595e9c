/* libcupool: cupool's C API. Generated from capi/src by cbindgen; do not edit. */

#ifndef CUPOOL_H
#define CUPOOL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

// The version of this C API: incremented when a function changes meaning or signature.
#define CUPOOL_API_VERSION 1

// What a call did. 0 is success; every other value comes with an error text.
typedef enum cupool_status {
  // Done.
  CUPOOL_STATUS_OK = 0,
  // An argument is out of range (a device, a size, a null pointer, a configuration value).
  CUPOOL_STATUS_INVALID_ARGUMENT = 1,
  // The device has no memory for the request.
  CUPOOL_STATUS_OUT_OF_MEMORY = 2,
  // The library is not initialised (or was shut down).
  CUPOOL_STATUS_NOT_INITIALIZED = 3,
  // A pointer cupool did not hand out on that device and stream, or one already freed.
  CUPOOL_STATUS_UNKNOWN_POINTER = 4,
  // A pointer freed with another size than it was allocated with.
  CUPOOL_STATUS_SIZE_MISMATCH = 5,
  // A driver call failed.
  CUPOOL_STATUS_DRIVER = 6,
  // A bug in cupool (a caught panic); the text says where.
  CUPOOL_STATUS_INTERNAL = 7,
} cupool_status;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

// The version of the C API this library implements ([`CUPOOL_API_VERSION`]).
uint32_t cupool_api_version(void);

// Opens the library. `config` is a string of `NAME=VALUE` pairs (the environment variables'
// names, e.g. `"GGML_POOL=vmm GGML_CUDA_ALLOC_FALLBACK_MANAGED=1"`), or null to read the
// environment. Fails if already open.
//
// # Safety
// `config` is null or a NUL-terminated string.
enum cupool_status cupool_init(const char *config);

// Closes the library and gives all its memory back, what every thread's cache holds included.
// Refused while blocks are live: their memory stays valid until they are freed. The blocks are
// counted with no allocation or free in flight (those on other threads end first, later ones
// wait), so no block's memory goes back under its owner.
enum cupool_status cupool_shutdown(void);

// How many devices the open library has, or -1 (with the error text set).
int32_t cupool_device_count(void);

// Every setting libcupool, the Rust library, `repro-prefill`, llama.cpp's shim and the Python
// package read, as a NUL-terminated JSON object: `{"front_ends": [...], "settings": [{"name",
// "accepts", "choices", "defaults", "read_by", "keyword", "env_only", "doc"}, ...]}`, one
// entry per environment variable with what it accepts, each front end's default, and what it
// does. The string is static: valid for the life of the process, never to be freed. Needs no
// `cupool_init`. Returns null on failure.
const char *cupool_settings_json(void);

// Allocates `size` bytes on `device` for `stream` (an opaque stream handle; one pool per
// device × stream). Writes the usable bytes to `actual` if it is not null. Returns null on
// failure.
//
// # Safety
// `actual` is null or points to writable memory for one `size_t`.
void *cupool_alloc(int32_t device, uint64_t stream, size_t size, size_t *actual);

// `cupool_alloc`, naming what is allocated: a recording writes `name` beside the allocation
// (null: no name). llama.cpp's shim passes the ggml op or buffer the memory is for.
//
// # Safety
// `actual` is null or points to writable memory for one `size_t`; `name` is null or a
// NUL-terminated string.
void *cupool_alloc_named(int32_t device,
                         uint64_t stream,
                         size_t size,
                         size_t *actual,
                         const char *name);

// Returns `ptr`, allocated on `device` for `stream` with `size` bytes (the size asked for, or
// the usable size the allocation wrote to `actual`). A pointer cupool did not hand out there,
// a second free or another size is refused and changes nothing.
enum cupool_status cupool_free(int32_t device, uint64_t stream, void *ptr, size_t size);

// Synchronizes `device`, then returns its pools' idle memory to the driver: every idle
// buffer smaller than `smaller_than` bytes, or everything idle when it is 0 (for VMM pools,
// the mapped memory above the live top). Writes the bytes released to `released` if not null.
//
// # Safety
// `released` is null or points to writable memory for one `size_t`.
enum cupool_status cupool_purge(int32_t device, size_t smaller_than, size_t *released);

// Synchronizes `device` and returns everything its pools hold idle to the driver (for VMM
// pools, the mapped memory above the live top): `cupool_purge(device, 0, released)`.
//
// # Safety
// `released` is null or points to writable memory for one `size_t`.
enum cupool_status cupool_trim(int32_t device, size_t *released);

// Ends a prefill ubatch of an inference engine on `device` (every device when -1), for
// llama.cpp's shim and any engine that calls it after each prefill ubatch. Each pool of the
// device applies `CUPOOL_PURGE`: `never` keeps its cache; `always` synchronizes the device and
// returns every idle buffer; `auto` (the default) returns the idle buffers that the ubatch just
// ended would not reuse (for each request size, as many as it held at once), synchronizing
// only when there are any. Then the ubatch's peaks are logged (`CUPOOL_LOG=info`) and the next
// ubatch's accounting starts afresh (the peaks `cupool_stats_json` reports go on until
// `cupool_reset_peaks`), and a recording closes the ubatch's phase. Writes the bytes returned
// to the driver to `released` if not null: when nonzero, anything that captured pool addresses
// (CUDA graphs) must be dropped.
//
// # Safety
// `released` is null or points to writable memory for one `size_t`.
enum cupool_status cupool_ubatch_end(int32_t device, size_t *released);

// Writes to `count` how many times memory of `device`'s pools has gone back to the driver
// since `cupool_init` (device frees, unmaps and managed frees: ubatch-boundary purges, trims,
// the trim before an out-of-memory retry, and pools that keep no cache). Anything that
// captured pool addresses (a CUDA graph) and was captured before the count last changed may
// hold freed memory: compare a remembered count before replaying it.
//
// # Safety
// `count` points to writable memory for one `uint64_t`.
enum cupool_status cupool_releases(int32_t device, uint64_t *count);

// Sets the peaks of `device`'s statistics (every device when -1) to the current values. Only
// this call restarts them (ubatch boundaries do not), as `torch.cuda.reset_peak_memory_stats`.
enum cupool_status cupool_reset_peaks(int32_t device);

// Writes `device`'s statistics (every device when -1) as a NUL-terminated JSON object into
// `buf` (`cap` bytes; truncated if too small) and returns the JSON's length without the NUL,
// so a call with a null `buf` asks for the size. Returns 0 on failure.
//
// # Safety
// `buf` is null or points to `cap` writable bytes.
size_t cupool_stats_json(int32_t device, char *buf, size_t cap);

// Starts recording every allocation and free (all devices and streams) as a trace in `path`,
// the JSON-lines format `repro-prefill replay` reads. Blocks allocated before the start are
// not in it. Fails if a recording is open or the file cannot be created.
//
// # Safety
// `path` is a NUL-terminated string.
enum cupool_status cupool_record_start(const char *path);

// Stops the recording and flushes its file. Writes the number of allocations recorded to
// `allocations` if not null. Fails if nothing records or a write failed.
//
// # Safety
// `allocations` is null or points to writable memory for one `uint64_t`.
enum cupool_status cupool_record_stop(uint64_t *allocations);

// Marks the start of a phase named `name` in the recording (a no-op when nothing records),
// closing an open one: a replay reports each phase's high-water mark.
//
// # Safety
// `name` is a NUL-terminated string.
enum cupool_status cupool_phase_begin(const char *name);

// Marks the end of the open phase in the recording; a nonzero `prefill` makes it a purge
// boundary for the replay (as a prefill ubatch is).
enum cupool_status cupool_phase_end(int32_t prefill);

// Turns the memory history on (`enabled` nonzero) or off, as PyTorch's
// `torch.cuda.memory._record_memory_history`: while on, the last `max_entries` events of each
// device (allocations, frees, segments mapped or allocated from the driver and given back,
// out-of-memory failures, with address, size, stream and time) are kept for
// `cupool_memory_snapshot_json`. Turning it on while on keeps the history and sets the new
// bound; turning it off forgets it. Needs no `cupool_init` and outlives `cupool_shutdown`.
// `max_entries` is at least 1 when turning it on (ignored when turning it off). While off,
// the cost is one atomic load per allocation and free.
enum cupool_status cupool_memory_history(int32_t enabled, uint64_t max_entries);

// Writes the memory snapshot of `device` (every device when -1) as a NUL-terminated JSON object
// into `buf` (`cap` bytes) and returns the JSON's length without the NUL; a call with a null
// `buf` asks for the size. When the return is `cap` or more, `buf` holds a truncated prefix:
// the snapshot grew since the size was asked, so call again with a larger buffer. Returns 0
// on failure.
//
// The JSON is PyTorch's `torch.cuda.memory._snapshot()`: `{"segments": [...],
// "device_traces": [[...], ...]}`. Each segment (`device`, `address`, `total_size`,
// `allocated_size`, `active_size`, `requested_size`, `stream`, `segment_type`,
// `segment_pool_id`, `is_expandable`, `frames`, `blocks`) is memory a pool holds from the
// driver (mapped VMM memory is `is_expandable`), its `blocks` (`address`, `size`,
// `requested_size`, `state`: `active_allocated` or `inactive`, `frames`) tiling it. The traces
// hold one list per device of the history's events (`action`, `addr`, `size`, `stream`,
// `time_us`, `frames`; an `oom` has `device_free` instead of `addr`), oldest first, empty
// while the history is off. Frames name what `cupool_alloc_named` named and the tag in force.
//
// # Safety
// `buf` is null or points to `cap` writable bytes.
size_t cupool_memory_snapshot_json(int32_t device, char *buf, size_t cap);

// Sets the tag of this thread's later allocations: a name of 1 to 64 bytes ("weights",
// "kv_cache"), or null or "" for none. Each tag's memory lies in pools of its own, so
// `cupool_sleep` can release it alone. Frees need no tag: a block is found under any.
//
// # Safety
// `tag` is null or a NUL-terminated string.
enum cupool_status cupool_set_tag(const char *tag);

// The tag of this thread's allocations ("" for none). The string stays valid for the life
// of the process.
const char *cupool_tag(void);

// Puts the memory tagged `tag` (null or "": the untagged memory) on `device` (-1: every
// device) to sleep: synchronizes the device, returns its cached memory and the physical
// memory under every live block to the driver, keeping every address; with `offload` nonzero
// the contents are copied to page-locked host memory first, for `cupool_wake` to restore.
// The synchronize lets kernels already queued finish first; work queued after this call must
// not touch the memory until `cupool_wake` (it would fault). Allocations under the tag fail
// while it sleeps; frees are taken. Writes the bytes released to `released` if not null.
// Only the vmm pool (the default) can sleep; refused while memory of the device is registered
// (`cupool_register`). A failure leaves part of the tag asleep: call
// `cupool_wake` (or sleep again).
//
// # Safety
// `tag` is null or a NUL-terminated string; `released` is null or points to writable memory
// for one `size_t`.
enum cupool_status cupool_sleep(int32_t device, const char *tag, int32_t offload, size_t *released);

// Wakes the memory tagged `tag` (null or "": untagged) on `device` (-1: every device): new
// physical memory at every address the sleep released, offloaded contents copied back (the
// copies are done when this returns). Waking what is awake does nothing. Writes the bytes
// mapped again to `mapped` if not null.
//
// # Safety
// `tag` is null or a NUL-terminated string; `mapped` is null or points to writable memory for
// one `size_t`.
enum cupool_status cupool_wake(int32_t device, const char *tag, size_t *mapped);

// Writes to `asleep` the bytes of `tag`'s memory on `device` (-1: every device) that are
// asleep now (0 when awake).
//
// # Safety
// `tag` is null or a NUL-terminated string; `asleep` points to writable memory for one
// `size_t`.
enum cupool_status cupool_asleep_bytes(int32_t device, const char *tag, size_t *asleep);

// Tells cupool that the block cupool handed out at `ptr` on `device` (its start; `bytes` at
// most its usable size) is registered with NCCL (`ncclCommRegister`, PyTorch's
// `register_mem_pool`) or otherwise shared by its physical memory: until `cupool_deregister`,
// that memory stays mapped at that address. A free of it is checked as `cupool_free` checks
// one and, if right, taken but done only at deregistration; a sleep of the device is refused.
// A range that is empty, not the start of a live block, longer than it, or registered already
// is refused.
enum cupool_status cupool_register(int32_t device, void *ptr, size_t bytes);

// Ends the registration made at `ptr` on `device`. A free that arrived while it was
// registered is done now (its failure, if any, is this call's).
enum cupool_status cupool_deregister(int32_t device, void *ptr);

// Writes the bytes registered on `device` to `bytes`.
//
// # Safety
// `bytes` points to writable memory for one `size_t`.
enum cupool_status cupool_registered_bytes(int32_t device, size_t *bytes);

// The text of the last failure on this thread ("" after a success). The text stays valid
// until this thread's next failed call, or its exit: successful calls, `cupool_shutdown`
// included, leave it in place.
const char *cupool_last_error(void);

// PyTorch's allocation entry point.
void *cupool_torch_alloc(size_t size, int32_t device, void *stream);

// PyTorch's free entry point. Errors cannot be returned to PyTorch: they are logged and
// readable through `cupool_last_error`.
void cupool_torch_free(void *ptr, size_t size, int32_t device, void *stream);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* CUPOOL_H */
