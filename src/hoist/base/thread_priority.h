// The scheduling priority and name of the calling thread (Linux: both are
// per thread). Background work (writing, hashing, committing, pinning) runs
// below the training loop's threads so that it takes idle cycles first.
#ifndef HOIST_BASE_THREAD_PRIORITY_H_
#define HOIST_BASE_THREAD_PRIORITY_H_

#include <string>

#include "absl/status/status.h"

namespace hoist {

// Lowers the calling thread's priority: `nice` (0-19, added to the
// process's nice value; 0 leaves it), or the SCHED_IDLE policy when `idle`
// (it runs only when a core would otherwise idle). Threads it creates
// afterwards inherit it. Lowering needs no privilege; nothing raises it
// back. Errors: kInvalidArgument for `nice` outside 0-19; the system
// call's error as kInternal (callers may treat it as advice and go on).
absl::Status LowerThisThreadPriority(int nice, bool idle);

// Puts the calling thread under SCHED_BATCH: a CPU-bound thread with the
// same share of the cores as before, but whose wake-ups never preempt the
// thread running on a core (it waits for that thread's slice to end). Any
// thread may set it, and leave it, without privilege. Errors: the system
// call's, as kInternal (callers may treat it as advice and go on).
absl::Status MakeThisThreadBatch();

// Names the calling thread (at most 15 bytes are kept) for `top -H`, gdb
// and /proc/self/task/*/comm. Best effort.
void NameThisThread(const std::string& name);

}  // namespace hoist

#endif  // HOIST_BASE_THREAD_PRIORITY_H_
