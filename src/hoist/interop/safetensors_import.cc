// Import of a safetensors checkpoint as a hoist step: every header is read
// and checked first (ReadSafetensorsHeaders), then the files are mapped
// read-only and their tensors saved through a CheckpointManager of one host
// device, whose copies read the mapped pages as the staging pool takes
// them; the save's own protocol makes the step atomic and hashed.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "hoist/base/checked_math.h"
#include "hoist/base/status_macros.h"
#include "hoist/checkpoint_manager.h"
#include "hoist/format/layout.h"
#include "hoist/host_backend.h"
#include "hoist/interop.h"
#include "hoist/interop/safetensors_names.h"
#include "hoist/io/errno_status.h"
#include "hoist/manifest.h"
#include "hoist/transfer/staging_pool.h"

namespace hoist {
namespace {

// As the safetensors library: a larger header is refused.
constexpr int64_t kMaxHeaderBytes = int64_t{100} << 20;

absl::StatusOr<std::string> ReadWhole(Storage& storage, const std::string& path,
                                      int64_t limit) {
  ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> file,
                   storage.OpenReadable(path));
  ASSIGN_OR_RETURN(const int64_t size, file->Size());
  if (size > limit) {
    return absl::DataLossError(
        absl::StrFormat("%s: %d bytes, more than %d", path, size, limit));
  }
  std::string text(size, '\0');
  RETURN_IF_ERROR(file->ReadAt(
      0, absl::MakeSpan(reinterpret_cast<uint8_t*>(text.data()), size)));
  return text;
}

// The files of the source: itself, the shards its index names, or its one
// *.safetensors file.
absl::StatusOr<std::vector<std::string>> SourceFiles(Storage& storage,
                                                     const std::string& src) {
  if (!storage.capabilities().local) {
    // The source's files are mapped into memory: they must be local.
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: a safetensors source is read from a local file or directory "
        "(download it first; the hoist root it is imported into may be an "
        "object store)",
        src));
  }
  ASSIGN_OR_RETURN(bool exists, storage.Exists(src));
  if (!exists) {
    return absl::NotFoundError(
        absl::StrFormat("%s: no such file or directory", src));
  }
  ASSIGN_OR_RETURN(bool is_dir, storage.IsDir(src));
  if (!is_dir) return std::vector<std::string>{src};
  const std::string index = JoinPath(src, kSafetensorsIndexFile);
  ASSIGN_OR_RETURN(bool indexed, storage.Exists(index));
  if (indexed) {
    ASSIGN_OR_RETURN(const std::string text,
                     ReadWhole(storage, index, kMaxHeaderBytes));
    const nlohmann::json json = nlohmann::json::parse(text, nullptr, false);
    if (json.is_discarded() || !json.is_object() ||
        !json.contains("weight_map") || !json["weight_map"].is_object()) {
      return absl::DataLossError(absl::StrFormat(
          "%s: not a safetensors index (no weight_map object)", index));
    }
    std::set<std::string> shards;
    for (const auto& [name, file] : json["weight_map"].items()) {
      if (!file.is_string() || !IsSafeRelativePath(file.get<std::string>()) ||
          absl::StrContains(file.get<std::string>(), '/')) {
        return absl::DataLossError(absl::StrFormat(
            "%s: tensor '%s' is in %s, not a file name in its directory", index,
            name, file.dump()));
      }
      shards.insert(file.get<std::string>());
    }
    std::vector<std::string> files;
    for (const std::string& shard : shards) {
      const std::string path = JoinPath(src, shard);
      ASSIGN_OR_RETURN(bool present, storage.Exists(path));
      if (!present) {
        return absl::NotFoundError(absl::StrFormat(
            "%s names %s, which %s does not hold", index, shard, src));
      }
      files.push_back(path);
    }
    return files;
  }
  ASSIGN_OR_RETURN(std::vector<std::string> names, storage.List(src));
  std::vector<std::string> found;
  for (const std::string& name : names) {
    if (absl::EndsWith(name, ".safetensors")) found.push_back(name);
  }
  if (found.size() != 1) {
    return absl::NotFoundError(absl::StrFormat(
        "%s: expected one *.safetensors file or %s, found %d files", src,
        kSafetensorsIndexFile, found.size()));
  }
  return std::vector<std::string>{JoinPath(src, found[0])};
}

bool IsCount(const nlohmann::json& value) {
  return value.is_number_unsigned() ||
         (value.is_number_integer() && value.get<int64_t>() >= 0);
}

// The checked tensors of one file.
absl::StatusOr<std::vector<SafetensorsTensor>> ReadHeader(
    Storage& storage, const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> file,
                   storage.OpenReadable(path));
  ASSIGN_OR_RETURN(const int64_t size, file->Size());
  auto bad = [&](const std::string& what) {
    return absl::DataLossError(absl::StrFormat("%s: %s", path, what));
  };
  if (size < 8) {
    return bad(
        absl::StrFormat("%d bytes: too short for a safetensors header", size));
  }
  uint8_t prefix[8];
  RETURN_IF_ERROR(file->ReadAt(0, absl::MakeSpan(prefix, 8)));
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = length << 8 | prefix[i];
  if (length > static_cast<uint64_t>(std::min(size - 8, kMaxHeaderBytes))) {
    return bad(absl::StrFormat(
        "header length %d runs past the file's %d bytes (truncated?)", length,
        size));
  }
  std::string text(length, '\0');
  RETURN_IF_ERROR(file->ReadAt(
      8, absl::MakeSpan(reinterpret_cast<uint8_t*>(text.data()), length)));
  const nlohmann::json header = nlohmann::json::parse(text, nullptr, false);
  if (header.is_discarded()) return bad("header is not JSON");
  if (!header.is_object()) return bad("header is not a JSON object");
  const int64_t data_start = 8 + static_cast<int64_t>(length);
  const int64_t data_bytes = size - data_start;
  std::vector<SafetensorsTensor> tensors;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = absl::StrFormat("tensor '%s'", name);
    if (!entry.is_object() || entry.size() != 3 || !entry.contains("dtype") ||
        !entry.contains("shape") || !entry.contains("data_offsets")) {
      return bad(where + ": entry is not {dtype, shape, data_offsets}");
    }
    const nlohmann::json& dtype = entry["dtype"];
    absl::StatusOr<std::string> hoist_dtype =
        dtype.is_string() ? HoistDTypeOfSafetensors(dtype.get<std::string>())
                          : absl::InvalidArgumentError("");
    if (!hoist_dtype.ok()) {
      return bad(
          absl::StrFormat("%s: dtype %s is not one hoist holds", where,
                          absl::StrReplaceAll(dtype.dump(), {{"\"", "'"}})));
    }
    const nlohmann::json& shape = entry["shape"];
    const nlohmann::json& offsets = entry["data_offsets"];
    if (!shape.is_array() ||
        !std::all_of(shape.begin(), shape.end(), IsCount)) {
      return bad(absl::StrFormat("%s: shape %s", where, shape.dump()));
    }
    if (!offsets.is_array() || offsets.size() != 2 || !IsCount(offsets[0]) ||
        !IsCount(offsets[1]) ||
        offsets[0].get<uint64_t>() > offsets[1].get<uint64_t>() ||
        offsets[1].get<uint64_t>() > static_cast<uint64_t>(data_bytes)) {
      return bad(
          absl::StrFormat("%s: data_offsets %s outside the %d data bytes",
                          where, offsets.dump(), data_bytes));
    }
    SafetensorsTensor tensor{name, *hoist_dtype, {}, path};
    ASSIGN_OR_RETURN(const DType parsed, ParseDType(*hoist_dtype));
    // Elements times item size, refusing what int64 cannot hold.
    __int128 need = ItemSize(parsed);
    for (const nlohmann::json& n : shape) {
      tensor.shape.push_back(n.get<int64_t>());
      need *= n.get<int64_t>();
      if (need > data_bytes)
        need = data_bytes + 1;  // too many, and no overflow
    }
    tensor.offset = data_start + offsets[0].get<int64_t>();
    tensor.bytes = offsets[1].get<int64_t>() - offsets[0].get<int64_t>();
    if (need != tensor.bytes) {
      return bad(absl::StrFormat(
          "%s: %d bytes for shape %s of %s (%s bytes)", where, tensor.bytes,
          shape.dump(), dtype.get<std::string>(),
          need > data_bytes ? std::string("more than the file's")
                            : absl::StrCat(static_cast<int64_t>(need))));
    }
    tensors.push_back(std::move(tensor));
  }
  std::vector<const SafetensorsTensor*> by_offset;
  for (const SafetensorsTensor& t : tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) {
    return std::pair(a->offset, a->bytes) < std::pair(b->offset, b->bytes);
  });
  int64_t at = data_start;
  for (const SafetensorsTensor* t : by_offset) {
    if (t->offset != at) {
      return bad(absl::StrFormat(
          "tensor '%s' starts at %d, %s", t->name, t->offset - data_start,
          t->offset < at
              ? "overlapping the tensor before it"
              : absl::StrFormat("leaving a gap after %d", at - data_start)));
    }
    at += t->bytes;
  }
  if (at != size) {
    return bad(absl::StrFormat("the tensors end at %d of %d data bytes",
                               at - data_start, data_bytes));
  }
  return tensors;
}

// A file mapped read-only for the life of the import.
class MappedFile {
 public:
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(
      const std::string& path, int64_t size) {
    auto out = std::unique_ptr<MappedFile>(new MappedFile(size));
    if (size == 0) return out;
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return ErrnoStatus(errno, "open", path);
    void* data = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    const int saved = errno;
    close(fd);
    if (data == MAP_FAILED) return ErrnoStatus(saved, "mmap", path);
    out->data_ = static_cast<const uint8_t*>(data);
    return out;
  }
  ~MappedFile() {
    if (data_ != nullptr) munmap(const_cast<uint8_t*>(data_), size_);
  }
  const uint8_t* data() const { return data_; }

 private:
  explicit MappedFile(int64_t size) : size_(size) {}
  const int64_t size_;
  const uint8_t* data_ = nullptr;
};

}  // namespace

absl::StatusOr<std::vector<SafetensorsTensor>> ReadSafetensorsHeaders(
    const std::string& src, const StorageOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<Storage> storage, OpenStorage(src, options));
  ASSIGN_OR_RETURN(std::vector<std::string> files, SourceFiles(*storage, src));
  std::vector<SafetensorsTensor> all;
  std::map<std::string, std::string> where;  // name -> file
  for (const std::string& file : files) {
    ASSIGN_OR_RETURN(std::vector<SafetensorsTensor> tensors,
                     ReadHeader(*storage, file));
    for (SafetensorsTensor& tensor : tensors) {
      auto [it, fresh] = where.emplace(tensor.name, file);
      if (!fresh) {
        return absl::DataLossError(absl::StrFormat(
            "tensor '%s' is in both %s and %s", tensor.name, it->second, file));
      }
      all.push_back(std::move(tensor));
    }
  }
  return all;
}

absl::StatusOr<ImportStats> ImportSafetensors(const std::string& src,
                                              const std::string& root,
                                              int64_t step, int64_t pool_bytes,
                                              const StorageOptions& storage,
                                              OperationProgress* progress) {
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(const std::vector<SafetensorsTensor> tensors,
                   ReadSafetensorsHeaders(src, storage));
  // The source is local (ReadSafetensorsHeaders checked): its files are
  // mapped.
  std::map<std::string, std::unique_ptr<MappedFile>> mapped;
  ASSIGN_OR_RETURN(std::unique_ptr<Storage> source, OpenStorage(src, storage));
  for (const SafetensorsTensor& tensor : tensors) {
    if (mapped.contains(tensor.file)) continue;
    ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> file,
                     source->OpenReadable(tensor.file));
    ASSIGN_OR_RETURN(const int64_t size, file->Size());
    ASSIGN_OR_RETURN(mapped[tensor.file], MappedFile::Open(tensor.file, size));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend,
                   MakeHostBackend({.num_devices = 1}));
  std::unique_ptr<Coordinator> coordinator = MakeSingleProcessCoordinator();
  // Each tensor is one device's shard, staged whole: the pool holds at
  // least the largest.
  int64_t largest = 0;
  for (const SafetensorsTensor& tensor : tensors) {
    largest = std::max(largest, tensor.bytes);
  }
  CheckpointManagerOptions options;
  options.pool_bytes =
      std::max(pool_bytes, AlignUp(largest, StagingPool::kAlignment));
  options.pool_pinning = CheckpointManagerOptions::PoolPinning::kAtOpen;
  ASSIGN_OR_RETURN(std::unique_ptr<Storage> root_storage,
                   OpenStorage(root, storage));
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointManager> manager,
                   CheckpointManager::Open(root, *backend, *coordinator,
                                           options, root_storage.get()));
  const DeviceId device = backend->devices()[0]->id();
  static const uint8_t kNothing = 0;  // where an empty tensor's bytes are
  std::vector<SaveArray> arrays;
  ImportStats stats;
  for (const SafetensorsTensor& tensor : tensors) {
    const Box whole(std::vector<int64_t>(tensor.shape.size(), 0), tensor.shape);
    ASSIGN_OR_RETURN(const DType dtype, ParseDType(tensor.dtype));
    const uint8_t* data = tensor.bytes == 0
                              ? &kNothing
                              : mapped[tensor.file]->data() + tensor.offset;
    arrays.push_back({{tensor.name, dtype, tensor.shape,
                       ExplicitSharding{{{device, whole}}}},
                      {{device, data}}});
    stats.bytes += tensor.bytes;
  }
  const nlohmann::json metadata = {
      {"imported_from", {{"format", "safetensors"}, {"path", src}}}};
  ASSIGN_OR_RETURN(
      SaveHandle handle,
      manager->Save(step, arrays,
                    metadata.dump(-1, ' ', false,
                                  nlohmann::json::error_handler_t::replace)));
  if (progress != nullptr) {
    // The save's written bytes, until it ends.
    progress->total.store(stats.bytes);
    progress->current.Set(src);
    while (!handle.WaitCommittedFor(absl::Milliseconds(50))) {
      progress->done.store(handle.progress().written_bytes.load());
    }
    progress->done.store(handle.progress().written_bytes.load());
  }
  ASSIGN_OR_RETURN(const SaveInfo info, handle.WaitCommitted());
  stats.step = step;
  stats.path = info.path;
  stats.arrays = static_cast<int64_t>(arrays.size());
  stats.elapsed = absl::Now() - start;
  return stats;
}

}  // namespace hoist
