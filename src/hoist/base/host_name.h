// This machine's host name, as the processes of a job compare them.
#ifndef HOIST_BASE_HOST_NAME_H_
#define HOIST_BASE_HOST_NAME_H_

#include <unistd.h>

#include <string>

namespace hoist {

// gethostname's answer (empty if it fails); never holds a line break.
inline std::string HostName() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return host;
}

}  // namespace hoist

#endif  // HOIST_BASE_HOST_NAME_H_
