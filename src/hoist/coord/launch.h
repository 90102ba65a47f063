// How this process was launched (private to dist/; MakeJobCoordinator is
// the public face).
#ifndef HOIST_COORD_LAUNCH_H_
#define HOIST_COORD_LAUNCH_H_

namespace hoist {

// True when an MPI launcher (mpirun, srun with PMI) started this process as
// one of several.
bool LaunchedByMpiWithSeveralRanks();

}  // namespace hoist

#endif  // HOIST_COORD_LAUNCH_H_
