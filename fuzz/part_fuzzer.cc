// libFuzzer target: a local tier's part as a peer holds it (its manifest,
// as PART.json or MANIFEST.json, and its data files), the way a restore
// that rebuilds a lost part reads it. The input is the part's manifest (up
// to the first NUL) and the bytes that stand for every data file. A part
// that opens must describe its extents so that they encode and decode back
// to themselves (what the ranks all-gather), and every extent is read from
// its mapped file or refused with a status (a reference to another step,
// an extent past its file's end); the whole part is packed as a peer sends
// it. The text after the NUL is also decoded as the all-gathered extents
// of a rank, which must fail with a status or encode back to itself.
// Nothing may crash, read outside the files, or allocate from the
// manifest's claims.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "hoist/checkpoint/tier/part_files.h"
#include "hoist/checkpoint/tier/replica_plan.h"
#include "hoist/manifest.h"
#include "hoist/storage.h"

namespace {

// This process's scratch step directory, on tmpfs when there is one.
const std::string& StepDir() {
  static const std::string* dir = [] {
    const char* base =
        std::filesystem::exists("/dev/shm") ? "/dev/shm" : "/tmp";
    auto* d = new std::string(std::string(base) + "/hoist_part_fuzz_" +
                              std::to_string(getpid()));
    std::filesystem::create_directories(*d + "/data");
    std::atexit([] { std::filesystem::remove_all(*dir); });
    return d;
  }();
  return *dir;
}

void Write(const std::string& path, const char* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data, static_cast<std::streamsize>(size));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* text = reinterpret_cast<const char*>(data);
  const char* nul = static_cast<const char*>(std::memchr(text, 0, size));
  const size_t text_size = nul == nullptr ? size : nul - text;
  const char* bytes = nul == nullptr ? text + size : nul + 1;
  const size_t bytes_size = nul == nullptr ? 0 : size - text_size - 1;

  // The all-gathered extents of a rank, from anything.
  absl::StatusOr<std::vector<hoist::PartExtent>> gathered =
      hoist::DecodePartExtents(absl::string_view(bytes, bytes_size), "fuzz");
  if (gathered.ok() &&
      *hoist::DecodePartExtents(hoist::EncodePartExtents(*gathered), "fuzz") !=
          *gathered) {
    std::abort();
  }

  absl::StatusOr<hoist::Manifest> manifest =
      hoist::DecodeManifest(std::string_view(text, text_size));
  if (!manifest.ok()) return 0;
  const std::string& dir = StepDir();
  std::filesystem::remove_all(dir + "/data");
  std::filesystem::create_directories(dir + "/data");
  Write(dir + "/MANIFEST.json", text, text_size);
  std::set<std::string> files;
  for (const hoist::ManifestArray& array : manifest->arrays) {
    for (const hoist::ManifestExtent& extent : array.extents) {
      if (files.size() < 8) files.insert(extent.file);
    }
  }
  for (const std::string& file : files) {
    const std::filesystem::path path = dir + "/" + file;
    std::filesystem::create_directories(path.parent_path());
    Write(path, bytes, bytes_size);
  }

  std::unique_ptr<hoist::Storage> storage = hoist::MakePosixStorage();
  absl::StatusOr<std::unique_ptr<hoist::HeldPart>> part =
      hoist::OpenHeldPart(*storage, dir);
  if (!part.ok()) return 0;
  const std::vector<hoist::PartExtent>& extents = (*part)->extents;
  absl::StatusOr<std::vector<hoist::PartExtent>> again =
      hoist::DecodePartExtents(hoist::EncodePartExtents(extents), "fuzz");
  if (!again.ok() || *again != extents) std::abort();
  std::vector<int> all;
  uint64_t sum = 0;
  for (int i = 0; i < static_cast<int>(extents.size()); ++i) {
    absl::StatusOr<absl::Span<const uint8_t>> read =
        hoist::ExtentBytes(**part, i);
    if (!read.ok()) continue;
    if (static_cast<int64_t>(read->size()) != extents[i].length_bytes) {
      std::abort();
    }
    for (uint8_t b : *read) sum += b;  // every byte is readable
    all.push_back(i);
  }
  (void)sum;
  absl::StatusOr<hoist::OutgoingFile> packed =
      hoist::PackedFile(**part, "data/packed.bin", all);
  if (packed.ok()) {
    for (absl::Span<const uint8_t> piece : packed->pieces) {
      if (piece.data() == nullptr && !piece.empty()) std::abort();
    }
  }
  return 0;
}
