// The simulator's state machine (see sim_runtime.h): devices, streams and
// their threads, events, what observing a completion does, and the
// controls. Memory and copies are sim_copies.cc's. One mutex guards it
// all; a stream's thread drops it only while it moves bytes.
#include "testing/cuda_sim/sim_runtime.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_format.h"

namespace hoist::cuda_sim::internal {
namespace {

Config FirstConfig() {
  Config config;
  if (const char* devices = std::getenv("HOIST_CUDA_SIM_DEVICES");
      devices != nullptr && *devices != '\0') {
    config.devices = std::max(0, std::atoi(devices));
  }
  return config;
}

}  // namespace

Runtime& Runtime::Get() {
  static Runtime* runtime = new Runtime();  // never destroyed: threads use it
  return *runtime;
}

Runtime::Runtime() : config_(FirstConfig()), devices_(config_.devices) {}

cudaError_t Runtime::Enter(const char* function, bool uses_context) {
  Lock lock(mu_);
  ++calls_[function];
  if (auto it = failing_calls_.find(std::string_view(function));
      it != failing_calls_.end() && !it->second.empty()) {
    const cudaError_t error = it->second.front();
    it->second.pop_front();
    return Fail(error);
  }
  const int device = current_device_index;
  if (uses_context && device < static_cast<int>(devices_.size()) &&
      devices_[device].sticky != cudaSuccess) {
    return Fail(devices_[device].sticky);
  }
  return cudaSuccess;
}

cudaError_t Runtime::Fail(cudaError_t error) {
  last_error = error;
  return error;
}

cudaError_t Runtime::TakeLastError(bool clear) {
  Runtime& runtime = Get();
  {
    Lock lock(runtime.mu_);
    const int device = current_device_index;
    if (device < static_cast<int>(runtime.devices_.size()) &&
        runtime.devices_[device].sticky != cudaSuccess) {
      return runtime.devices_[device].sticky;
    }
  }
  const cudaError_t error = last_error;
  if (clear) last_error = cudaSuccess;
  return error;
}

int Runtime::current_device() const { return current_device_index; }

cudaError_t Runtime::SetDevice(int device) {
  Lock lock(mu_);
  if (device < 0 || device >= static_cast<int>(devices_.size())) {
    return Fail(cudaErrorInvalidDevice);
  }
  current_device_index = device;
  return cudaSuccess;
}

cudaError_t Runtime::DeviceCount(int* count) {
  Lock lock(mu_);
  if (count == nullptr) return Fail(cudaErrorInvalidValue);
  if (!config_.driver) return Fail(cudaErrorInsufficientDriver);
  *count = static_cast<int>(devices_.size());
  return devices_.empty() ? Fail(cudaErrorNoDevice) : cudaSuccess;
}

cudaError_t Runtime::NumaId(int device, int* id) {
  Lock lock(mu_);
  if (id == nullptr) return Fail(cudaErrorInvalidValue);
  if (device < 0 || device >= static_cast<int>(devices_.size())) {
    return Fail(cudaErrorInvalidDevice);
  }
  *id = device < static_cast<int>(config_.host_numa_ids.size())
            ? config_.host_numa_ids[device]
            : 0;
  return cudaSuccess;
}

// --- Streams and events ----------------------------------------------------

std::shared_ptr<StreamState> Runtime::StartStream(int device,
                                                  std::string name) {
  auto stream = std::make_shared<StreamState>();
  stream->device = device;
  stream->id = next_handle_++;
  stream->name = std::move(name);
  stream->thread = std::thread([this, raw = stream.get()] { RunStream(raw); });
  return stream;
}

std::shared_ptr<StreamState> Runtime::StreamOf(cudaStream_t stream,
                                               cudaError_t* error) {
  if (stream == nullptr || stream == cudaStreamLegacy ||
      stream == cudaStreamPerThread) {
    const int device = current_device_index;
    if (device >= static_cast<int>(devices_.size())) {
      *error = cudaErrorInvalidDevice;
      return nullptr;
    }
    std::shared_ptr<StreamState>& legacy = devices_[device].legacy;
    if (legacy == nullptr) {
      legacy = StartStream(device, absl::StrFormat("legacy:%d", device));
    }
    return legacy;
  }
  auto it = streams_.find(stream);
  if (it == streams_.end()) {
    *error = cudaErrorInvalidResourceHandle;
    return nullptr;
  }
  return it->second;
}

cudaError_t Runtime::CreateStream(cudaStream_t* stream) {
  if (stream == nullptr) return Fail(cudaErrorInvalidValue);
  Lock lock(mu_);
  const int device = current_device_index;
  if (device >= static_cast<int>(devices_.size())) {
    return Fail(cudaErrorInvalidDevice);
  }
  std::shared_ptr<StreamState> state =
      StartStream(device, absl::StrFormat("%d:%d", device, next_handle_));
  *stream = reinterpret_cast<cudaStream_t>(0x10000 + state->id * 16);
  streams_[*stream] = std::move(state);
  return cudaSuccess;
}

cudaError_t Runtime::DestroyStream(cudaStream_t stream) {
  Lock lock(mu_);
  auto it = streams_.find(stream);
  if (it == streams_.end()) return Fail(cudaErrorInvalidResourceHandle);
  std::shared_ptr<StreamState> state = std::move(it->second);
  streams_.erase(it);
  // As on a GPU, queued work still runs; and its bytes land.
  state->stopping = true;
  changed_.notify_all();
  lock.unlock();
  state->thread.join();
  lock.lock();
  (void)Observe(*state, state->enqueued);
  return cudaSuccess;
}

cudaError_t Runtime::CreateEvent(cudaEvent_t* event) {
  if (event == nullptr) return Fail(cudaErrorInvalidValue);
  Lock lock(mu_);
  auto state = std::make_unique<EventState>();
  state->device = current_device_index;
  *event = reinterpret_cast<cudaEvent_t>(0x20000000 + next_handle_++ * 16);
  events_[*event] = std::move(state);
  return cudaSuccess;
}

cudaError_t Runtime::DestroyEvent(cudaEvent_t event) {
  Lock lock(mu_);
  if (events_.erase(event) == 0) return Fail(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}

cudaError_t Runtime::EventAndStream(cudaEvent_t event, cudaStream_t stream,
                                    EventState** event_state,
                                    std::shared_ptr<StreamState>* state) {
  auto it = events_.find(event);
  cudaError_t error = cudaErrorInvalidResourceHandle;
  if (it == events_.end() || (*state = StreamOf(stream, &error)) == nullptr) {
    return Fail(error);
  }
  *event_state = it->second.get();
  return cudaSuccess;
}

cudaError_t Runtime::Record(cudaEvent_t event, cudaStream_t stream) {
  Lock lock(mu_);
  EventState* recorded = nullptr;
  std::shared_ptr<StreamState> state;
  if (cudaError_t error = EventAndStream(event, stream, &recorded, &state);
      error != cudaSuccess) {
    return error;
  }
  // The CUDA guide: event and stream must belong to the same device.
  if (recorded->device != state->device) {
    return Fail(cudaErrorInvalidResourceHandle);
  }
  recorded->stream = state;
  recorded->seq = state->enqueued;
  return cudaSuccess;
}

cudaError_t Runtime::WaitEvent(cudaStream_t stream, cudaEvent_t event) {
  Lock lock(mu_);
  EventState* event_state = nullptr;
  std::shared_ptr<StreamState> state;
  if (cudaError_t error = EventAndStream(event, stream, &event_state, &state);
      error != cudaSuccess) {
    return error;
  }
  const EventState& waited = *event_state;
  // An event never recorded, or recorded on this very stream: no effect.
  if (waited.stream == nullptr || waited.stream == state) return cudaSuccess;
  Op op;
  op.kind = Op::Kind::kWait;
  op.wait_for = waited.stream;
  op.wait_seq = waited.seq;
  uint64_t& ordered = state->waits[waited.stream->id];
  ordered = std::max(ordered, waited.seq);
  Enqueue(*state, std::move(op));
  return cudaSuccess;
}

cudaError_t Runtime::SynchronizeEvent(cudaEvent_t event, bool block) {
  Lock lock(mu_);
  auto it = events_.find(event);
  if (it == events_.end()) return Fail(cudaErrorInvalidResourceHandle);
  std::shared_ptr<StreamState> stream = it->second->stream;
  const uint64_t seq = it->second->seq;
  if (stream == nullptr) return cudaSuccess;  // never recorded: complete
  if (!block && stream->run < seq) return cudaErrorNotReady;
  changed_.wait(lock, [&] { return stream->run >= seq; });
  return Observe(*stream, seq);
}

cudaError_t Runtime::SynchronizeStream(cudaStream_t stream) {
  Lock lock(mu_);
  cudaError_t error = cudaSuccess;
  std::shared_ptr<StreamState> state = StreamOf(stream, &error);
  if (state == nullptr) return Fail(error);
  const uint64_t seq = state->enqueued;
  changed_.wait(lock, [&] { return state->run >= seq; });
  return Observe(*state, seq);
}

cudaError_t Runtime::SynchronizeDevice() {
  Lock lock(mu_);
  const int device = current_device_index;
  std::vector<std::shared_ptr<StreamState>> streams;
  for (const auto& [unused, state] : streams_) {
    if (state->device == device) streams.push_back(state);
  }
  if (device < static_cast<int>(devices_.size()) &&
      devices_[device].legacy != nullptr) {
    streams.push_back(devices_[device].legacy);
  }
  cudaError_t first = cudaSuccess;
  for (const std::shared_ptr<StreamState>& state : streams) {
    const uint64_t seq = state->enqueued;
    changed_.wait(lock, [&] { return state->run >= seq; });
    if (cudaError_t error = Observe(*state, seq);
        first == cudaSuccess && error != cudaSuccess) {
      first = error;
    }
  }
  return first;
}

void Runtime::Publish(StreamState& stream, uint64_t seq) {
  while (!stream.unpublished.empty() && stream.unpublished.front().seq <= seq) {
    const Unpublished& copy = stream.unpublished.front();
    const uint8_t* from = copy.shadow.data();
    for (const Piece& piece : copy.pieces) {
      for (size_t row = 0; row < piece.rows; ++row) {
        std::memcpy(piece.dst + row * piece.dst_pitch, from, piece.width);
        from += piece.width;
      }
    }
    Untrack(stream.unpublished.front().writes);
    stream.unpublished.pop_front();
  }
}

cudaError_t Runtime::Observe(StreamState& stream, uint64_t seq) {
  Publish(stream, seq);
  if (stream.error == cudaSuccess || stream.error_seq > seq) {
    return cudaSuccess;
  }
  const cudaError_t error = stream.error;
  if (stream.error_sticky) devices_[stream.device].sticky = error;
  stream.error = cudaSuccess;  // reported once (a sticky one stays above)
  return Fail(error);
}

// --- A stream's thread -----------------------------------------------------

void Runtime::RunStream(StreamState* stream) {
  Lock lock(mu_);
  while (true) {
    changed_.wait(lock, [&] {
      return (!stream->queue.empty() &&
              (stream->stopping || !devices_[stream->device].paused)) ||
             (stream->stopping && stream->queue.empty());
    });
    if (stream->queue.empty()) return;
    stream->running.push_back(std::move(stream->queue.front()));
    stream->queue.pop_front();
    Op& op = stream->running.back();
    RunOp(*stream, op, lock);
    Untrack(op.uses);  // what stays in use moved to the unpublished copy
    stream->run = op.seq;
    stream->running.clear();
    changed_.notify_all();
  }
}

void Runtime::RunOp(StreamState& stream, Op& op, Lock& lock) {
  if (op.kind == Op::Kind::kWait) {
    StreamState& other = *op.wait_for;
    changed_.wait(lock, [&] { return other.run >= op.wait_seq; });
    // Seen from this stream, the waited-for copies are complete: their
    // bytes land (an error there is reported by the other stream).
    Publish(other, op.wait_seq);
    return;
  }
  DeviceState& device = devices_[stream.device];
  if (!device.failing_copies.empty()) {
    const Injected injected = device.failing_copies.front();
    device.failing_copies.pop_front();
    if (stream.error == cudaSuccess) {
      stream.error = injected.error;
      stream.error_seq = op.seq;
      stream.error_sticky = injected.sticky;
    }
    return;  // nothing is written: the destination keeps its poison
  }
  lock.unlock();
  const auto start = std::chrono::steady_clock::now();
  std::vector<uint8_t> shadow;
  for (const Piece& piece : op.pieces) {
    for (size_t row = 0; row < piece.rows; ++row) {
      uint8_t* to = piece.dst + row * piece.dst_pitch;
      if (op.kind == Op::Kind::kMemset) {
        std::memset(to, op.value, piece.width);
      } else if (op.host_dst) {
        const uint8_t* from = piece.src + row * piece.src_pitch;
        shadow.insert(shadow.end(), from, from + piece.width);
      } else {
        std::memcpy(to, piece.src + row * piece.src_pitch, piece.width);
      }
    }
  }
  // The modelled engine takes each op after the one before; the stream
  // sleeps only when the model is a millisecond or more ahead of the clock
  // (a sleep per small op would cost more than the op).
  stream.modelled_free =
      std::max(stream.modelled_free, start) +
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(op.modelled_seconds));
  if (stream.modelled_free - std::chrono::steady_clock::now() >=
      std::chrono::milliseconds(1)) {
    std::this_thread::sleep_until(stream.modelled_free);
  }
  lock.lock();
  if (op.host_dst) {
    // Its destination stays in use until the copy is observed.
    Unpublished copy{op.seq, op.pieces, std::move(shadow), {}};
    std::erase_if(op.uses, [&](Uses::iterator use) {
      if (!use->second.write) return false;
      copy.writes.push_back(use);
      return true;
    });
    stream.unpublished.push_back(std::move(copy));
  }
}

// --- Controls --------------------------------------------------------------

void Runtime::StopAll(Lock& lock) {
  std::vector<std::shared_ptr<StreamState>> all;
  for (auto& [unused, state] : streams_) all.push_back(state);
  for (DeviceState& device : devices_) {
    device.paused = false;
    if (device.legacy != nullptr) all.push_back(device.legacy);
  }
  for (const auto& state : all) state->stopping = true;
  changed_.notify_all();
  lock.unlock();
  for (const auto& state : all) state->thread.join();
  lock.lock();
}

void Runtime::Reset(const Config& config) {
  Lock lock(mu_);
  StopAll(lock);
  streams_.clear();
  events_.clear();
  for (auto& [begin, region] : regions_) {
    if (region.kind != Region::Kind::kRegistered) {
      std::free(reinterpret_cast<void*>(begin));
    }
  }
  regions_.clear();
  uses_.clear();
  longest_use_ = 0;
  calls_.clear();
  failing_calls_.clear();
  violations_.clear();
  config_ = config;
  devices_ = std::vector<DeviceState>(std::max(0, config.devices));
  last_error = cudaSuccess;
  current_device_index = 0;
}

DeviceCounts Runtime::CountsOf(int device) {
  Lock lock(mu_);
  return device >= 0 && device < static_cast<int>(devices_.size())
             ? devices_[device].counts
             : DeviceCounts{};
}

int64_t Runtime::Calls(std::string_view function) {
  Lock lock(mu_);
  auto it = calls_.find(function);
  return it == calls_.end() ? 0 : it->second;
}

std::vector<std::string> Runtime::Violations() {
  Lock lock(mu_);
  return violations_;
}

void Runtime::FailNextCall(std::string_view function, cudaError_t error) {
  Lock lock(mu_);
  auto it = failing_calls_.find(function);
  if (it == failing_calls_.end()) {
    it =
        failing_calls_.emplace(std::string(function), std::deque<cudaError_t>())
            .first;
  }
  it->second.push_back(error);
}

void Runtime::FailNextCopy(int device, cudaError_t error, bool sticky) {
  Lock lock(mu_);
  if (device >= 0 && device < static_cast<int>(devices_.size())) {
    devices_[device].failing_copies.push_back({error, sticky});
  }
}

void Runtime::Pause(int device, bool paused) {
  Lock lock(mu_);
  if (device >= 0 && device < static_cast<int>(devices_.size())) {
    devices_[device].paused = paused;
  }
  changed_.notify_all();
}

void Runtime::WaitUntilRun(int device) {
  Lock lock(mu_);
  std::vector<std::pair<std::shared_ptr<StreamState>, uint64_t>> targets;
  for (const auto& [unused, state] : streams_) {
    if (state->device == device) targets.emplace_back(state, state->enqueued);
  }
  if (device >= 0 && device < static_cast<int>(devices_.size()) &&
      devices_[device].legacy != nullptr) {
    targets.emplace_back(devices_[device].legacy,
                         devices_[device].legacy->enqueued);
  }
  for (const auto& [state, seq] : targets) {
    changed_.wait(lock, [&, s = state.get(), n = seq] { return s->run >= n; });
  }
}

bool Runtime::batch_copies() {
  Lock lock(mu_);
  return config_.batch_copies;
}

}  // namespace hoist::cuda_sim::internal
