// How arrays cross from Python into the engine: every shard and restore
// destination a nanobind ndarray (DLPack or the buffer protocol, never
// copied), checked to be dense in C order, as the engine's boxes and
// restore targets; and what Python is given back of a restore and of a
// manifest.
#ifndef HOIST_PYTHON_PY_ARRAYS_H_
#define HOIST_PYTHON_PY_ARRAYS_H_

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <climits>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_format.h"
#include "hoist/box.h"
#include "hoist/checkpoint_types.h"
#include "hoist/device.h"
#include "hoist/manifest.h"
#include "py_status.h"

namespace nb = nanobind;

namespace hoist {

// What Python is given of a manifest: one JSON document (hoist/2), which
// json.loads reads, however many extents it has.
inline constexpr ManifestEncoding kOneDocument{.split_above_extents =
                                                   INT64_MAX};

// (origin, shape) lists from Python as a Box; ValueError when their ranks
// differ (`where` names the array).
Box ToBox(const std::vector<int64_t>& origin, const std::vector<int64_t>& shape,
          const std::string& where);

// Whether an ndarray's elements lie contiguous in C order (an array with no
// elements does, whatever strides its library gave it).
template <typename... Args>
inline bool CContiguous(const nb::ndarray<Args...>& array) {
  for (size_t d = 0; d < array.ndim(); ++d) {
    if (array.shape(d) == 0) return true;
  }
  int64_t expected = 1;
  for (int d = static_cast<int>(array.ndim()) - 1; d >= 0; --d) {
    if (array.shape(d) != 1 && array.stride(d) != expected) return false;
    expected *= static_cast<int64_t>(array.shape(d));
  }
  return true;
}

// The bytes an ndarray holds, checked to be dense (C order) and `bytes`
// long. Arrays to save may be read-only (nb::ro); restore destinations not.
template <typename... Args>
auto DenseData(const nb::ndarray<Args...>& array, int64_t bytes,
               const std::string& where) {
  if (!CContiguous(array)) {
    Invalid(absl::StrFormat(
        "%s: the data is not contiguous in C order (make it contiguous "
        "first, e.g. numpy.ascontiguousarray or tensor.contiguous())",
        where));
  }
  const int64_t have = static_cast<int64_t>(array.nbytes());
  if (have != bytes) {
    Invalid(absl::StrFormat("%s: the data has %d bytes, the box needs %d",
                            where, have, bytes));
  }
  return array.data();
}

// An array to save: read-only ones too.
using SavedData = nb::ndarray<nb::ro>;

// (device id, origin, shape, data): data read-only to save, written to
// restore.
template <typename Data>
using PyShardOf =
    std::tuple<int64_t, std::vector<int64_t>, std::vector<int64_t>, Data>;
// (name, dtype, shape, shards)
template <typename Data>
using PyArrayOf = std::tuple<std::string, std::string, std::vector<int64_t>,
                             std::vector<PyShardOf<Data>>>;
using PyArray = PyArrayOf<nb::ndarray<>>;
// (origin, shape, token)
using PyReceivedBox =
    std::tuple<std::vector<int64_t>, std::vector<int64_t>, uint64_t>;
using PyReceivedArray =
    std::tuple<std::string, std::string, std::vector<int64_t>,
               std::vector<PyReceivedBox>>;

// The device a restore target's data outside host memory is on (or an
// error): given its device id, the data and where it is asked.
using DeviceOfData = absl::FunctionRef<Device*(
    int64_t device, const nb::ndarray<>& data, const std::string& where)>;

// `arrays` as restore targets, appended to `targets`: host memory, or the
// device `device_of` gives. ValueError for a box or data that does not fit.
void AppendTargets(const std::vector<PyArray>& arrays, DeviceOfData device_of,
                   std::vector<RestoreTarget>& targets);

// A restore's figures as Python's last_restore dict.
nb::dict RestoreStatsDict(const RestoreStats& s);

}  // namespace hoist

#endif  // HOIST_PYTHON_PY_ARRAYS_H_
