// cuda_sim.h's controls, forwarded to the simulator's state.
#include "testing/cuda_sim/cuda_sim.h"

#include "testing/cuda_sim/sim_runtime.h"

namespace hoist::cuda_sim {

using internal::Runtime;

void Reset(const Config& config) { Runtime::Get().Reset(config); }
DeviceCounts CountsOf(int device) { return Runtime::Get().CountsOf(device); }
int64_t Calls(std::string_view function) {
  return Runtime::Get().Calls(function);
}
std::vector<std::string> Violations() { return Runtime::Get().Violations(); }
void FailNextCall(std::string_view function, cudaError_t error) {
  Runtime::Get().FailNextCall(function, error);
}
void FailNextCopy(int device, cudaError_t error, bool sticky) {
  Runtime::Get().FailNextCopy(device, error, sticky);
}
void Pause(int device) { Runtime::Get().Pause(device, true); }
void Resume(int device) { Runtime::Get().Pause(device, false); }
void WaitUntilRun(int device) { Runtime::Get().WaitUntilRun(device); }

}  // namespace hoist::cuda_sim
