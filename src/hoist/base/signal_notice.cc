#include "hoist/base/signal_notice.h"

#include <signal.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "hoist/mutex.h"

namespace hoist {
namespace {

std::atomic<int64_t> received{0};
static_assert(std::atomic<int64_t>::is_always_lock_free,
              "the handler may use only lock-free atomics");

// Per signal: the handler replaced (read by the handler, so written only
// while ours is not installed for that signal) and the registrations.
struct Slot {
  struct sigaction previous;
  int registrations = 0;
};
Slot slots[NSIG];
Mutex install_mu;

void Handler(int signal, siginfo_t* info, void* context) {
  received.fetch_add(1, std::memory_order_relaxed);
  const struct sigaction& previous = slots[signal].previous;
  if (previous.sa_flags & SA_SIGINFO) {
    if (previous.sa_sigaction != nullptr) {
      previous.sa_sigaction(signal, info, context);
    }
  } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
    previous.sa_handler(signal);
  }
}

bool OursIsInstalled(int signal) {
  struct sigaction current;
  if (sigaction(signal, nullptr, &current) != 0) return false;
  return (current.sa_flags & SA_SIGINFO) && current.sa_sigaction == Handler;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SignalNotice>> SignalNotice::Install(
    std::vector<int> signals) {
  for (int signal : signals) {
    if (signal <= 0 || signal >= NSIG || signal == SIGKILL ||
        signal == SIGSTOP) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "signal %d cannot announce a preemption: %s", signal,
          signal == SIGKILL || signal == SIGSTOP ? "it cannot be caught"
                                                 : "no such signal"));
    }
  }
  MutexLock lock(&install_mu);
  for (size_t i = 0; i < signals.size(); ++i) {
    Slot& slot = slots[signals[i]];
    if (slot.registrations++ > 0 && OursIsInstalled(signals[i])) continue;
    struct sigaction ours = {};
    ours.sa_sigaction = Handler;
    ours.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&ours.sa_mask);
    if (sigaction(signals[i], &ours, &slot.previous) != 0) {
      const int error = errno;
      --slot.registrations;
      for (size_t j = 0; j < i; ++j) {  // undo the ones before
        Slot& done = slots[signals[j]];
        if (--done.registrations == 0) {
          sigaction(signals[j], &done.previous, nullptr);
        }
      }
      return absl::InvalidArgumentError(
          absl::StrFormat("installing a handler for signal %d: %s", signals[i],
                          std::strerror(error)));
    }
  }
  return std::unique_ptr<SignalNotice>(new SignalNotice(std::move(signals)));
}

SignalNotice::~SignalNotice() {
  MutexLock lock(&install_mu);
  for (int signal : signals_) {
    Slot& slot = slots[signal];
    if (--slot.registrations == 0 && OursIsInstalled(signal)) {
      sigaction(signal, &slot.previous, nullptr);
    }
  }
}

int64_t SignalNotice::count() {
  return received.load(std::memory_order_relaxed);
}

bool SignalNotice::installed() const {
  for (int signal : signals_) {
    if (!OursIsInstalled(signal)) return false;
  }
  return true;
}

}  // namespace hoist
