// hoist._hoist: the C++ engine for Python (nanobind). The Python package
// (python/hoist/) turns pytrees of JAX, PyTorch and NumPy arrays into the
// flat lists this module takes: per array its name, dtype, global shape and
// every shard as (device id, box origin, box shape, data). Shard data comes
// in as nanobind ndarrays, i.e. through DLPack (or the buffer protocol),
// without a copy; a save holds them until its copies have landed, then
// drops them (which calls each DLPack deleter). The GIL is released while
// hoist stages, waits, restores and verifies.
//
// Errors: every failed call raises hoist._hoist.Error(code, message), code
// being absl's status code; python/hoist/_errors.py maps it to ValueError,
// OSError, hoist.DataLossError, ...
#include <nanobind/nanobind.h>

#include <exception>

#include "py_backend.h"
#include "py_manager.h"
#include "py_observe.h"
#include "py_options.h"
#include "py_root.h"
#include "py_status.h"

namespace nb = nanobind;

NB_MODULE(_hoist, m) {
  using namespace hoist;
  m.doc() = "hoist's C++ engine; use the hoist package instead.";
  // hoist._hoist.Error(message), with .code (absl's status code) and
  // .message.
  static nb::object error_type = nb::steal(
      PyErr_NewException("hoist._hoist.Error", PyExc_Exception, nullptr));
  m.attr("Error") = error_type;
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const StatusError& e) {
      nb::object error = error_type(e.message);
      error.attr("code") = e.code;
      error.attr("message") = e.message;
      PyErr_SetObject(error_type.ptr(), error.ptr());
    }
  });

  BindBackend(m);
  BindManagerOptions(m);
  BindManager(m);
  BindRoot(m);
  BindObserve(m);
}
