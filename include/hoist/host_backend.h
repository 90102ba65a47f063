// The host backend: N logical devices over host RAM. Each device has its own
// copy queue served by `copy_engines` worker threads of its own (its "copy
// engines"); a dispatch is one push onto that queue, and the engines of a
// device share the ops of the dispatch at its head, so a batch uses every
// engine. It stands in for accelerators in tests, benchmarks and the demo,
// and makes the cost of a dispatch real: a queue push, a wake-up and a
// completion per dispatch.
#ifndef HOIST_HOST_BACKEND_H_
#define HOIST_HOST_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "hoist/device.h"

namespace hoist {

struct HostBackendOptions {
  // Logical devices (default 8), >= 1.
  int num_devices = 8;
  // Global id of the first device (default 0); the others follow in order.
  // Process p of a job of uniform processes uses p * num_devices.
  DeviceId first_device_id = 0;
  // Worker threads per device serving its copy queue (default 1), >= 1.
  int copy_engines = 1;
  // Ops larger than this are split into pieces that the device's engines
  // copy in parallel (default 4 MiB), >= 4096.
  int64_t copy_chunk_bytes = int64_t{4} << 20;
  // The copy engines' scheduling, which matters where the host has fewer
  // cores than engines (the CPU copies stand in for an accelerator's copy
  // engine, which takes no cycles from the host's threads):
  // - kBatch (the default): SCHED_BATCH. The engines get the same share of
  //   the cores as any thread, but a dispatch waking them never preempts
  //   the thread running on a core, so Save returns before its copies take
  //   the caller's core (measured on 2 cores, `hoist demo`: a
  //   dispatched-mode dispatch 0.24-0.39 ms against 0.29-3.3 ms with
  //   kNormal).
  // - kNormal: like any thread; the copies a dispatch wakes can take the
  //   caller's core for a time slice before Save returns.
  // - kIdle: SCHED_IDLE, only cycles no other thread wants. Where the
  //   host's cores stay busy (a CPU training loop, data loader processes,
  //   the save's own writers) the copies wait for them, so staging and
  //   restores slow down (the restore onto the demo's mesh measured 0-35%
  //   slower on 2 cores). Unprivileged processes cannot leave SCHED_IDLE,
  //   so the engines keep it for the backend's life.
  enum class CopyPriority { kNormal, kBatch, kIdle };
  CopyPriority copy_priority = CopyPriority::kBatch;
};

// Starts the devices' copy engines. kInvalidArgument for bad options. The
// backend joins its threads on destruction; destroy it only after every
// future of its devices has completed.
absl::StatusOr<std::unique_ptr<Backend>> MakeHostBackend(
    const HostBackendOptions& options = {});

}  // namespace hoist

#endif  // HOIST_HOST_BACKEND_H_
