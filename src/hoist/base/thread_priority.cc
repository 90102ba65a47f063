#include "hoist/base/thread_priority.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"

namespace hoist {

absl::Status LowerThisThreadPriority(int nice, bool idle) {
  if (nice < 0 || nice > 19) {
    return absl::InvalidArgumentError(
        absl::StrFormat("thread nice value %d: use 0 to 19", nice));
  }
  const pid_t tid = static_cast<pid_t>(syscall(SYS_gettid));
  if (idle) {
    sched_param param{};
    param.sched_priority = 0;
    if (sched_setscheduler(tid, SCHED_IDLE, &param) != 0) {
      return absl::InternalError(absl::StrFormat(
          "sched_setscheduler(SCHED_IDLE): %s", std::strerror(errno)));
    }
  }
  if (nice > 0) {
    errno = 0;
    const int current = getpriority(PRIO_PROCESS, tid);
    if (errno != 0) {
      return absl::InternalError(
          absl::StrFormat("getpriority: %s", std::strerror(errno)));
    }
    if (setpriority(PRIO_PROCESS, tid, std::min(19, current + nice)) != 0) {
      return absl::InternalError(
          absl::StrFormat("setpriority: %s", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

absl::Status MakeThisThreadBatch() {
  const pid_t tid = static_cast<pid_t>(syscall(SYS_gettid));
  sched_param param{};
  param.sched_priority = 0;
  if (sched_setscheduler(tid, SCHED_BATCH, &param) != 0) {
    return absl::InternalError(absl::StrFormat(
        "sched_setscheduler(SCHED_BATCH): %s", std::strerror(errno)));
  }
  return absl::OkStatus();
}

void NameThisThread(const std::string& name) {
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

}  // namespace hoist
