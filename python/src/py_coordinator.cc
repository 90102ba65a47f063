#include "py_coordinator.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace nb = nanobind;

namespace hoist {
namespace {

// A Coordinator over a Python object (hoist's coordinators over
// torch.distributed and JAX's distributed runtime, or a caller's own) with
// `rank` and `size` attributes and the methods
//   barrier(name) -> None
//   all_gather(name, data: bytes) -> list of bytes, by rank
//   broadcast(name, data: bytes, root: int) -> bytes
// and, where it has them (else an all-gather and a broadcast stand in):
//   gather(name, data: bytes, root: int) -> list of bytes by rank on root,
//                                           [] elsewhere
//   scatter(name, pieces: list of bytes (root's), root: int) -> bytes
// and, for a preemption's agreement, the notice board:
//   post(board, data: bytes) -> None
//   read_board(board) -> (ranks posted: int, [bytes by rank] once all have,
//                         else None)
// The manager calls it from its saver thread as well as the caller's, one
// call at a time (the board from its preemption watch's thread, at any
// time); each call takes the GIL for its duration (the object's
// collectives release it while they wait). A Python exception becomes the
// call's error: TimeoutError kDeadlineExceeded, anything else kAborted (the
// job lost a rank: retry the checkpoint), with the exception's text, which
// names the rank that did not answer.
class PyCoordinator final : public Coordinator {
 public:
  explicit PyCoordinator(nb::object object)
      : object_(std::move(object)),
        rank_(nb::cast<int>(object_.attr("rank"))),
        size_(nb::cast<int>(object_.attr("size"))) {}
  ~PyCoordinator() override {
    nb::gil_scoped_acquire gil;
    object_.reset();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::Status Barrier(std::string_view name) override {
    return Call(name, [&] { object_.attr("barrier")(Str(name)); });
  }
  absl::StatusOr<std::vector<std::string>> AllGather(
      std::string_view name, std::string bytes) override {
    std::vector<std::string> all;
    absl::Status status = Call(name, [&] {
      nb::object got = object_.attr("all_gather")(Str(name), Bytes(bytes));
      for (nb::handle item : got) all.push_back(FromBytes(item, name));
      if (static_cast<int>(all.size()) != size_) {
        throw std::runtime_error(
            absl::StrFormat("all_gather returned %d contributions for %d ranks",
                            all.size(), size_));
      }
    });
    if (!status.ok()) return status;
    return all;
  }
  absl::StatusOr<std::string> Broadcast(std::string_view name,
                                        std::string bytes, int root) override {
    std::string out;
    absl::Status status = Call(name, [&] {
      out = FromBytes(object_.attr("broadcast")(Str(name), Bytes(bytes), root),
                      name);
    });
    if (!status.ok()) return status;
    return out;
  }
  absl::StatusOr<std::vector<std::string>> Gather(std::string_view name,
                                                  std::string bytes,
                                                  int root) override {
    if (!Has("gather"))
      return Coordinator::Gather(name, std::move(bytes), root);
    if (absl::Status s = CheckRoot("gather", name, root); !s.ok()) return s;
    std::vector<std::string> all;
    absl::Status status = Call(name, [&] {
      nb::object got = object_.attr("gather")(Str(name), Bytes(bytes), root);
      for (nb::handle item : got) all.push_back(FromBytes(item, name));
      if (static_cast<int>(all.size()) != (rank_ == root ? size_ : 0)) {
        throw std::runtime_error(absl::StrFormat(
            "gather returned %d contributions on rank %d (root %d) of %d",
            all.size(), rank_, root, size_));
      }
    });
    if (!status.ok()) return status;
    return all;
  }
  absl::StatusOr<std::string> Scatter(std::string_view name,
                                      std::vector<std::string> pieces,
                                      int root) override {
    if (!Has("scatter")) {
      return Coordinator::Scatter(name, std::move(pieces), root);
    }
    if (absl::Status s = CheckRoot("scatter", name, root); !s.ok()) return s;
    if (rank_ == root) {
      if (absl::Status s = CheckPieces(name, pieces.size()); !s.ok()) return s;
    }
    std::string out;
    absl::Status status = Call(name, [&] {
      nb::list given;
      for (const std::string& piece : pieces) given.append(Bytes(piece));
      out = FromBytes(object_.attr("scatter")(Str(name), given, root), name);
    });
    if (!status.ok()) return status;
    return out;
  }
  absl::Status Post(std::string_view board, std::string value) override {
    absl::Status missing;
    absl::Status status = Call(board, [&] {
      if (!nb::hasattr(object_, "post")) {
        missing = Coordinator::Post(board, "");
        return;
      }
      object_.attr("post")(Str(board), Bytes(value));
    });
    return missing.ok() ? status : missing;
  }
  absl::StatusOr<BoardView> ReadBoard(std::string_view board) override {
    BoardView view;
    absl::Status missing;
    absl::Status status = Call(board, [&] {
      if (!nb::hasattr(object_, "read_board")) {
        missing = Coordinator::ReadBoard(board).status();
        return;
      }
      nb::tuple got =
          nb::cast<nb::tuple>(object_.attr("read_board")(Str(board)));
      if (got.size() != 2) {
        throw std::runtime_error("read_board must return (posted, values)");
      }
      view.posted = nb::cast<int>(got[0]);
      if (!got[1].is_none()) {
        for (nb::handle item : got[1]) {
          view.values.push_back(FromBytes(item, board));
        }
        if (static_cast<int>(view.values.size()) != size_) {
          throw std::runtime_error(
              absl::StrFormat("read_board returned %d values for %d ranks",
                              view.values.size(), size_));
        }
      }
    });
    if (!missing.ok()) return missing;
    if (!status.ok()) return status;
    return view;
  }

  // exchange(name, data, to, from_, receive): `data` the bytes to send
  // (valid during the call): a read-only NumPy view, or, when they are
  // gathered from several places, a hoist._dist.Gathered whose len() and
  // slices (NumPy arrays) are those of their concatenation; `receive` called
  // with each piece received (a 1-D uint8 NumPy array), in order. A
  // coordinator without exchange() cannot move bulk data (kUnimplemented).
  absl::Status ExchangeGathered(
      std::string_view name, absl::Span<const absl::Span<const uint8_t>> pieces,
      int to, int from, const ReceivePiece& receive) override {
    if (to < 0 || to >= size_ || from < 0 || from >= size_) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "exchange '%s': rank %d or %d of %d", name, to, from, size_));
    }
    absl::Status received;
    absl::Status status = Call(name, [&] {
      if (!nb::hasattr(object_, "exchange")) {
        received = absl::UnimplementedError(absl::StrFormat(
            "exchange '%s': the coordinator has no exchange() to move bulk "
            "data (a local tier needs one)",
            name));
        return;
      }
      const auto view = [](absl::Span<const uint8_t> bytes) {
        return nb::ndarray<nb::numpy, const uint8_t, nb::ndim<1>>(
            bytes.data(), {bytes.size()}, nb::handle());
      };
      nb::object data;
      if (pieces.size() == 1) {
        data = nb::cast(view(pieces[0]));
      } else {
        nb::list views;
        for (absl::Span<const uint8_t> piece : pieces) {
          views.append(view(piece));
        }
        data = nb::module_::import_("hoist._dist").attr("Gathered")(views);
      }
      nb::object sink = nb::cpp_function(
          [&](nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig> piece) {
            if (!received.ok()) return;
            received = receive(absl::MakeConstSpan(piece.data(), piece.size()));
            if (!received.ok()) {
              throw std::runtime_error(std::string(received.message()));
            }
          });
      object_.attr("exchange")(Str(name), data, to, from, sink);
    });
    if (!received.ok()) return received;
    return status;
  }

 private:
  static nb::str Str(std::string_view s) { return nb::str(s.data(), s.size()); }
  static nb::bytes Bytes(const std::string& s) {
    return nb::bytes(s.data(), s.size());
  }
  static std::string FromBytes(nb::handle item, std::string_view name) {
    if (!nb::isinstance<nb::bytes>(item)) {
      throw std::runtime_error(
          absl::StrFormat("coordinator operation '%s' returned %s, not bytes",
                          name, nb::type_name(item.type()).c_str()));
    }
    nb::bytes b = nb::borrow<nb::bytes>(item);
    return std::string(b.c_str(), b.size());
  }
  bool Has(const char* method) {
    nb::gil_scoped_acquire gil;
    return nb::hasattr(object_, method);
  }

  template <typename F>
  absl::Status Call(std::string_view name, F&& body) {
    nb::gil_scoped_acquire gil;
    try {
      body();
      return absl::OkStatus();
    } catch (nb::python_error& e) {
      const bool timeout = e.matches(PyExc_TimeoutError);
      const std::string message = absl::StrFormat(
          "coordinator operation '%s' on rank %d of %d: %s: %s", name, rank_,
          size_, nb::type_name(e.type()).c_str(), nb::str(e.value()).c_str());
      return timeout ? absl::DeadlineExceededError(message)
                     : absl::AbortedError(message);
    } catch (const std::exception& e) {
      return absl::AbortedError(
          absl::StrFormat("coordinator operation '%s' on rank %d of %d: %s",
                          name, rank_, size_, e.what()));
    }
  }

  nb::object object_;
  const int rank_;
  const int size_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Coordinator>> MakePyCoordinator(
    nb::object object) {
  auto coordinator = std::make_unique<PyCoordinator>(std::move(object));
  if (coordinator->size() < 1 || coordinator->rank() < 0 ||
      coordinator->rank() >= coordinator->size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("coordinator: rank %d of %d", coordinator->rank(),
                        coordinator->size()));
  }
  return coordinator;
}

}  // namespace hoist
