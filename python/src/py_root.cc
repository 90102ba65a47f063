#include "py_root.h"

#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "hoist/checkpoint_root.h"
#include "hoist/device.h"
#include "hoist/huge_pages.h"
#include "hoist/interop.h"
#include "py_arrays.h"
#include "py_observe.h"
#include "py_status.h"
#include "py_storage.h"

namespace nb = nanobind;

namespace hoist {
namespace {

// The manifest, as JSON text, of the step directory `path` (ROOT/step_N),
// or of the newest committed step when `path` is a root.
std::string Inspect(const std::string& path,
                    const std::map<std::string, std::string>& storage_options) {
  const StorageOptions storage = StorageOptionsOf(storage_options);
  return Check(EncodeManifest(
      WithoutGil([&] { return ReadManifestAt(path, storage); }), kOneDocument));
}

// Its head alike (ManifestHead): of a split manifest, every array's extents
// empty, and only the file's first bytes read.
std::string InspectHead(
    const std::string& path,
    const std::map<std::string, std::string>& storage_options) {
  const StorageOptions storage = StorageOptionsOf(storage_options);
  const ManifestHead head =
      WithoutGil([&] { return ReadManifestHeadAt(path, storage); });
  return Check(EncodeManifest(head.manifest, kOneDocument));
}

// Re-reads every extent of the step at `path` (ROOT/step_N, or a root's
// newest step) against its hash, without the root's lock: (step, problems).
std::tuple<int64_t, std::vector<std::string>> VerifyAt(
    const std::string& path,
    const std::map<std::string, std::string>& storage_options,
    OperationProgress* progress) {
  const StorageOptions storage = StorageOptionsOf(storage_options);
  auto opened = WithoutGil([&] { return OpenStepAt(path, storage); });
  VerifyReport report =
      WithoutGil([&] { return opened.first->Verify(opened.second, progress); });
  return {opened.second, std::move(report.problems)};
}

// Reads `arrays` (host memory only) of step `step` (or of the newest
// committed step) of the root at `path` (or of the step directory `path`)
// without the root's lock or a pool, beside a job that saves into it:
// (step, the restore's figures).
std::tuple<int64_t, nb::dict> ReadAt(
    const std::string& path, std::optional<int64_t> step,
    const std::vector<PyArray>& arrays,
    const std::map<std::string, std::string>& storage_options) {
  const StorageOptions storage = StorageOptionsOf(storage_options);
  std::vector<RestoreTarget> targets;
  AppendTargets(
      arrays,
      [](int64_t, const nb::ndarray<>&, const std::string& where) -> Device* {
        Invalid(where + ": a read without a manager fills host memory only");
        return nullptr;
      },
      targets);
  auto opened = WithoutGil([&] { return OpenStepAt(path, storage); });
  const int64_t read = step.value_or(opened.second);
  const RestoreStats stats =
      WithoutGil([&] { return opened.first->Read(read, targets); });
  return {read, RestoreStatsDict(stats)};
}

// Exports step `step_dir` to safetensors in `out_dir` (see
// hoist/interop.h): the figures as a dict.
nb::dict ExportSafetensorsTo(
    const std::string& step_dir, const std::string& out_dir,
    int64_t max_shard_bytes, const std::string& prefix, int64_t memory_bytes,
    const std::map<std::string, std::string>& storage_options,
    OperationProgress* progress) {
  const StorageOptions storage = StorageOptionsOf(storage_options);
  const ExportStats s = WithoutGil([&] {
    return ExportSafetensors(step_dir, out_dir,
                             {.max_shard_bytes = max_shard_bytes,
                              .prefix = prefix,
                              .memory_bytes = memory_bytes,
                              .storage = storage,
                              .progress = progress});
  });
  nb::dict d;
  d["tensors"] = s.tensors;
  d["bytes"] = s.bytes;
  d["bytes_read"] = s.bytes_read;
  d["files"] = s.files;
  d["elapsed_s"] = absl::ToDoubleSeconds(s.elapsed);
  return d;
}

// Imports the safetensors source `src` as step `step` of `root` (see
// hoist/interop.h): the figures as a dict.
nb::dict ImportSafetensorsFrom(
    const std::string& src, const std::string& root, int64_t step,
    int64_t pool_bytes,
    const std::map<std::string, std::string>& storage_options,
    OperationProgress* progress) {
  const StorageOptions storage = StorageOptionsOf(storage_options);
  const ImportStats s = WithoutGil([&] {
    return ImportSafetensors(src, root, step, pool_bytes, storage, progress);
  });
  nb::dict d;
  d["step"] = s.step;
  d["path"] = s.path;
  d["arrays"] = s.arrays;
  d["bytes"] = s.bytes;
  d["elapsed_s"] = absl::ToDoubleSeconds(s.elapsed);
  return d;
}

}  // namespace

void BindRoot(nb::module_& m) {
  m.def("inspect", &Inspect, nb::arg("path"), nb::arg("storage_options"));
  m.def("inspect_head", &InspectHead, nb::arg("path"),
        nb::arg("storage_options"));
  // Whether restored arrays are advised for huge pages (huge_pages.h).
  m.def("advise_huge_pages", &AdviseHugePages);
  m.def("verify_at", &VerifyAt, nb::arg("path"), nb::arg("storage_options"),
        nb::arg("progress").none() = nb::none());
  m.def("read_at", &ReadAt, nb::arg("path"), nb::arg("step").none(),
        nb::arg("arrays"), nb::arg("storage_options"));
  // Defaults the Python functions take from the engine.
  m.attr("POOL_ALIGNMENT") = kPoolAlignmentBytes;
  m.attr("IMPORT_POOL_BYTES") = kImportPoolBytes;
  m.attr("EXPORT_MAX_SHARD_BYTES") = SafetensorsExportOptions{}.max_shard_bytes;
  m.attr("EXPORT_MEMORY_BYTES") = SafetensorsExportOptions{}.memory_bytes;
  m.def("export_safetensors", &ExportSafetensorsTo, nb::arg("step_dir"),
        nb::arg("out_dir"), nb::arg("max_shard_bytes"), nb::arg("prefix"),
        nb::arg("memory_bytes"), nb::arg("storage_options"),
        nb::arg("progress").none() = nb::none());
  m.def("import_safetensors", &ImportSafetensorsFrom, nb::arg("src"),
        nb::arg("root"), nb::arg("step"), nb::arg("pool_bytes"),
        nb::arg("storage_options"), nb::arg("progress").none() = nb::none());
}

}  // namespace hoist
