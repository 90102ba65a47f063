// XXH3, as every part of hoist hashes extents: <xxhash.h>, with its calls
// routed on x86-64 to libxxhash's dispatching entry points, which pick the
// widest vector unit the running CPU has (AVX2, AVX-512) instead of the
// SSE2 the library is compiled for (about 15% faster on streaming data
// here, more on data still in cache). The hashes are the same.
#ifndef HOIST_BASE_XXH3_H_
#define HOIST_BASE_XXH3_H_

#include <xxhash.h>

#if defined(__x86_64__) && !defined(HOIST_NO_XXH_DISPATCH)
#include <xxh_x86dispatch.h>
#endif

#endif  // HOIST_BASE_XXH3_H_
