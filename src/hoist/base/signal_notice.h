// Signals that announce something (a scheduler's SIGTERM before it
// preempts a job), noticed without doing anything in signal context: the
// handler only counts the signal and calls the handler that was installed
// before it. Whoever wants to know compares SignalNotice::count() with the
// count it saw last, from an ordinary thread.
//
// Installation is process-wide and counted: the first registration of a
// signal installs the handler (remembering the one it replaces), the last
// one to go puts that handler back, unless someone has installed another
// meanwhile. A previous handler that is a function is called after the
// count, with the same arguments; SIG_DFL and SIG_IGN are not (SIGTERM's
// default would end the process before it could save). Thread-safe.
#ifndef HOIST_BASE_SIGNAL_NOTICE_H_
#define HOIST_BASE_SIGNAL_NOTICE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"

namespace hoist {

class SignalNotice {
 public:
  // Installs the handler for each of `signals` (kInvalidArgument for one
  // that cannot be caught, SIGKILL or SIGSTOP, or that does not exist;
  // nothing is installed then). The registration lasts as long as the
  // returned object.
  static absl::StatusOr<std::unique_ptr<SignalNotice>> Install(
      std::vector<int> signals);
  ~SignalNotice();

  // Signals received so far by the process, of any installed kind.
  static int64_t count();
  // Whether each of this registration's signals still reaches hoist's
  // handler (false once the job installed its own over it).
  bool installed() const;

  const std::vector<int>& signals() const { return signals_; }

 private:
  explicit SignalNotice(std::vector<int> signals)
      : signals_(std::move(signals)) {}
  const std::vector<int> signals_;
};

}  // namespace hoist

#endif  // HOIST_BASE_SIGNAL_NOTICE_H_
