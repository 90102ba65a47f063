// The CUDA runtime API functions hoist calls (and its tests and GPU bench
// call), defined over the simulator's state (sim_runtime.h). Each counts
// itself, honours an injected failure and the device's sticky error, checks
// its arguments as the CUDA runtime documents, and hands the work on.
#include <cuda_runtime_api.h>

#include <vector>

#include "testing/cuda_sim/sim_runtime.h"

using hoist::cuda_sim::internal::Piece;
using hoist::cuda_sim::internal::Runtime;

namespace {

Runtime& Sim() { return Runtime::Get(); }

// Device selection and counting do not touch a context: a sticky error
// does not fail them.
#define HOIST_SIM_ENTER_AS(uses_context)                            \
  do {                                                              \
    if (cudaError_t entered_ = Sim().Enter(__func__, uses_context); \
        entered_ != cudaSuccess) {                                  \
      return entered_;                                              \
    }                                                               \
  } while (0)
#define HOIST_SIM_ENTER() HOIST_SIM_ENTER_AS(true)

}  // namespace

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  HOIST_SIM_ENTER_AS(false);
  return Sim().DeviceCount(count);
}

cudaError_t cudaSetDevice(int device) {
  HOIST_SIM_ENTER_AS(false);
  return Sim().SetDevice(device);
}

cudaError_t cudaGetDevice(int* device) {
  HOIST_SIM_ENTER_AS(false);
  if (device == nullptr) return Runtime::Fail(cudaErrorInvalidValue);
  *device = Sim().current_device();
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr,
                                   int device) {
  HOIST_SIM_ENTER();
  if (attr != cudaDevAttrHostNumaId) {
    return Runtime::Fail(cudaErrorNotSupported);  // not modelled
  }
  return Sim().NumaId(device, value);
}

cudaError_t cudaGetLastError(void) {
  (void)Sim().Enter(__func__);
  return Runtime::TakeLastError(/*clear=*/true);
}

cudaError_t cudaPeekAtLastError(void) {
  (void)Sim().Enter(__func__);
  return Runtime::TakeLastError(/*clear=*/false);
}

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
#define HOIST_SIM_NAME(code) \
  case code:                 \
    return #code;
    HOIST_SIM_NAME(cudaSuccess)
    HOIST_SIM_NAME(cudaErrorInvalidValue)
    HOIST_SIM_NAME(cudaErrorMemoryAllocation)
    HOIST_SIM_NAME(cudaErrorInvalidPitchValue)
    HOIST_SIM_NAME(cudaErrorInvalidDevicePointer)
    HOIST_SIM_NAME(cudaErrorInsufficientDriver)
    HOIST_SIM_NAME(cudaErrorCallRequiresNewerDriver)
    HOIST_SIM_NAME(cudaErrorNoDevice)
    HOIST_SIM_NAME(cudaErrorInvalidDevice)
    HOIST_SIM_NAME(cudaErrorInvalidResourceHandle)
    HOIST_SIM_NAME(cudaErrorIllegalState)
    HOIST_SIM_NAME(cudaErrorNotReady)
    HOIST_SIM_NAME(cudaErrorIllegalAddress)
    HOIST_SIM_NAME(cudaErrorHostMemoryAlreadyRegistered)
    HOIST_SIM_NAME(cudaErrorHostMemoryNotRegistered)
    HOIST_SIM_NAME(cudaErrorLaunchFailure)
    HOIST_SIM_NAME(cudaErrorNotSupported)
    HOIST_SIM_NAME(cudaErrorUnknown)
#undef HOIST_SIM_NAME
    default:
      return "cudaErrorUnrecognized";
  }
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorInsufficientDriver:
      return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorIllegalState:
      return "operation not permitted in the current state (cuda_sim: a "
             "queued copy still uses this memory; see Violations())";
    case cudaErrorHostMemoryAlreadyRegistered:
      return "part or all of the requested memory range is already mapped";
    case cudaErrorHostMemoryNotRegistered:
      return "pointer does not correspond to a registered memory region";
    case cudaErrorNotSupported:
      return "operation not supported";
    default:
      return "simulated CUDA error";
  }
}

// --- Memory ----------------------------------------------------------------

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  HOIST_SIM_ENTER();
  return Sim().Malloc(ptr, bytes);
}

cudaError_t cudaFree(void* ptr) {
  HOIST_SIM_ENTER();
  return Sim().Free(ptr);
}

cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned int flags) {
  HOIST_SIM_ENTER();
  (void)flags;  // portable, mapped, write-combined: all pinned alike here
  return Sim().HostAlloc(ptr, bytes);
}

cudaError_t cudaFreeHost(void* ptr) {
  HOIST_SIM_ENTER();
  return Sim().FreeHost(ptr);
}

cudaError_t cudaHostRegister(void* ptr, size_t bytes, unsigned int flags) {
  HOIST_SIM_ENTER();
  (void)flags;
  return Sim().HostRegister(ptr, bytes);
}

cudaError_t cudaHostUnregister(void* ptr) {
  HOIST_SIM_ENTER();
  return Sim().HostUnregister(ptr);
}

// --- Streams and events ------------------------------------------------------

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream,
                                      unsigned int flags) {
  HOIST_SIM_ENTER();
  (void)flags;  // non-blocking or not: only the legacy stream is special
  return Sim().CreateStream(stream);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  HOIST_SIM_ENTER();
  return Sim().DestroyStream(stream);
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  HOIST_SIM_ENTER();
  return Sim().SynchronizeStream(stream);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                unsigned int flags) {
  HOIST_SIM_ENTER();
  if (flags != 0) return Runtime::Fail(cudaErrorInvalidValue);
  return Sim().WaitEvent(stream, event);
}

cudaError_t cudaDeviceSynchronize(void) {
  HOIST_SIM_ENTER();
  return Sim().SynchronizeDevice();
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  HOIST_SIM_ENTER();
  (void)flags;  // timing or not, blocking sync or spinning: alike here
  return Sim().CreateEvent(event);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  HOIST_SIM_ENTER();
  return Sim().DestroyEvent(event);
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  HOIST_SIM_ENTER();
  return Sim().Record(event, stream);
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  HOIST_SIM_ENTER();
  return Sim().SynchronizeEvent(event, /*block=*/false);
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  HOIST_SIM_ENTER();
  return Sim().SynchronizeEvent(event, /*block=*/true);
}

// --- Copies and sets ---------------------------------------------------------

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count,
                            enum cudaMemcpyKind kind, cudaStream_t stream) {
  HOIST_SIM_ENTER();
  return Sim().Copy({{static_cast<uint8_t*>(dst), count,
                      static_cast<const uint8_t*>(src), count, count, 1}},
                    kind, stream, __func__);
}

cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src,
                              size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind kind, cudaStream_t stream) {
  HOIST_SIM_ENTER();
  return Sim().Copy({{static_cast<uint8_t*>(dst), dpitch,
                      static_cast<const uint8_t*>(src), spitch, width, height}},
                    kind, stream, __func__);
}

cudaError_t cudaMemcpyBatchAsync(void* const* dsts, const void* const* srcs,
                                 const size_t* sizes, size_t count,
                                 struct cudaMemcpyAttributes* attrs,
                                 size_t* attrsIdxs, size_t numAttrs,
                                 cudaStream_t stream) {
  HOIST_SIM_ENTER();
  if (!Sim().batch_copies()) return Runtime::Fail(cudaErrorNotSupported);
  // As documented: not the legacy stream; attributes cover every copy,
  // starting at 0, increasing, each with a source access order.
  if (stream == nullptr || stream == cudaStreamLegacy || count == 0 ||
      dsts == nullptr || srcs == nullptr || sizes == nullptr ||
      attrs == nullptr || attrsIdxs == nullptr || numAttrs == 0 ||
      numAttrs > count || attrsIdxs[0] != 0) {
    return Runtime::Fail(cudaErrorInvalidValue);
  }
  for (size_t i = 0; i < numAttrs; ++i) {
    if ((i > 0 && attrsIdxs[i] <= attrsIdxs[i - 1]) || attrsIdxs[i] >= count ||
        attrs[i].srcAccessOrder == cudaMemcpySrcAccessOrderInvalid) {
      return Runtime::Fail(cudaErrorInvalidValue);
    }
  }
  std::vector<Piece> pieces;
  pieces.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    pieces.push_back({static_cast<uint8_t*>(dsts[i]), sizes[i],
                      static_cast<const uint8_t*>(srcs[i]), sizes[i], sizes[i],
                      1});
  }
  return Sim().Copy(std::move(pieces), cudaMemcpyDefault, stream, __func__);
}

cudaError_t cudaMemcpy3DBatchAsync(size_t numOps,
                                   struct cudaMemcpy3DBatchOp* opList,
                                   unsigned long long flags,
                                   cudaStream_t stream) {
  HOIST_SIM_ENTER();
  if (!Sim().batch_copies()) return Runtime::Fail(cudaErrorNotSupported);
  if (stream == nullptr || stream == cudaStreamLegacy || numOps == 0 ||
      opList == nullptr || flags != 0) {
    return Runtime::Fail(cudaErrorInvalidValue);
  }
  // Pointer to pointer only (CUDA arrays are not modelled); the element is
  // a byte; a row length is 0 (packed) or at least the width; depth 1.
  std::vector<Piece> pieces;
  pieces.reserve(numOps);
  for (size_t i = 0; i < numOps; ++i) {
    const cudaMemcpy3DBatchOp& op = opList[i];
    const cudaExtent& extent = op.extent;
    if (op.src.type != cudaMemcpyOperandTypePointer ||
        op.dst.type != cudaMemcpyOperandTypePointer || extent.width == 0 ||
        extent.height == 0 || extent.depth != 1 ||
        op.srcAccessOrder == cudaMemcpySrcAccessOrderInvalid) {
      return Runtime::Fail(cudaErrorInvalidValue);
    }
    const size_t src_pitch =
        op.src.op.ptr.rowLength == 0 ? extent.width : op.src.op.ptr.rowLength;
    const size_t dst_pitch =
        op.dst.op.ptr.rowLength == 0 ? extent.width : op.dst.op.ptr.rowLength;
    if (src_pitch < extent.width || dst_pitch < extent.width) {
      return Runtime::Fail(cudaErrorInvalidValue);
    }
    pieces.push_back({static_cast<uint8_t*>(op.dst.op.ptr.ptr), dst_pitch,
                      static_cast<const uint8_t*>(op.src.op.ptr.ptr), src_pitch,
                      extent.width, extent.height});
  }
  return Sim().Copy(std::move(pieces), cudaMemcpyDefault, stream, __func__);
}

cudaError_t cudaMemset(void* dst, int value, size_t count) {
  HOIST_SIM_ENTER();
  // Asynchronous with respect to the host for device memory (the CUDA
  // guide), on the legacy stream.
  return Sim().Memset(dst, value, count, nullptr, /*synchronous=*/false);
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t count,
                            cudaStream_t stream) {
  HOIST_SIM_ENTER();
  return Sim().Memset(dst, value, count, stream, /*synchronous=*/false);
}

}  // extern "C"
