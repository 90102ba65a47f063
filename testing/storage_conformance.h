// One conformance suite for every Storage (as TensorStore's kvstore
// test_util): what a checkpoint needs of its storage, each case gated by
// the capabilities the storage reports (Storage::capabilities()), the
// commit protocol (BeginDir, CommitDir, HasMarker, RemoveCommitted)
// included. A backend's test includes this header in one .cc file of its
// binary and instantiates the suite:
//
//   INSTANTIATE_TEST_SUITE_P(Posix, StorageConformanceTest,
//                            ::testing::Values(StorageBackend{"posix",
//                                                             MakePosix}),
//                            StorageBackendName);
//
// A backend's `make` fills a StorageSubject; it may skip (GTEST_SKIP) or
// fail the test (a server that did not start) instead.
#ifndef HOIST_TESTING_STORAGE_CONFORMANCE_H_
#define HOIST_TESTING_STORAGE_CONFORMANCE_H_

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "hoist/storage.h"

namespace hoist::testing {

// A storage under test and the directory to work in (empty, existing where
// the storage has directories).
struct StorageSubject {
  std::shared_ptr<void> keep;     // what `storage` needs alive (a temp dir)
  std::unique_ptr<Storage> base;  // a wrapped storage's base, if any
  std::unique_ptr<Storage> storage;
  std::string root;
};

struct StorageBackend {
  std::string name;
  std::function<void(StorageSubject&)> make;
};

inline void PrintTo(const StorageBackend& backend, std::ostream* out) {
  *out << backend.name;
}

inline std::string StorageBackendName(
    const ::testing::TestParamInfo<StorageBackend>& info) {
  return info.param.name;
}

class StorageConformanceTest : public ::testing::TestWithParam<StorageBackend> {
 protected:
  void SetUp() override {
    GetParam().make(s_);
    if (IsSkipped() || HasFatalFailure()) return;
    ASSERT_NE(s_.storage, nullptr);
    can_ = s_.storage->capabilities();
  }

  Storage& storage() { return *s_.storage; }
  std::string Path(const std::string& name) { return JoinPath(s_.root, name); }

  static std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 13);
    return v;
  }

  // `path` written whole and durable (on an object store, an upload that
  // is not synced leaves no object).
  void Put(const std::string& path, absl::Span<const uint8_t> bytes) {
    absl::StatusOr<std::unique_ptr<WritableFile>> file =
        storage().OpenWritable(path);
    ASSERT_TRUE(file.ok()) << file.status();
    if (!bytes.empty()) {
      ASSERT_TRUE((*file)->WriteAt(0, bytes).ok());
    }
    ASSERT_TRUE((*file)->Sync().ok());
    ASSERT_TRUE((*file)->Close().ok());
  }
  void Put(const std::string& path, const std::string& text) {
    Put(path, absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(text.data()),
                                  text.size()));
  }

  // Bytes [offset, offset + n) of `path`.
  absl::StatusOr<std::vector<uint8_t>> Get(const std::string& path,
                                           int64_t offset, size_t n) {
    absl::StatusOr<std::unique_ptr<ReadableFile>> file =
        storage().OpenReadable(path);
    if (!file.ok()) return file.status();
    std::vector<uint8_t> out(n);
    if (absl::Status s = (*file)->ReadAt(offset, absl::MakeSpan(out));
        !s.ok()) {
      return s;
    }
    return out;
  }
  std::string Text(const std::string& path) {
    absl::StatusOr<std::unique_ptr<ReadableFile>> file =
        storage().OpenReadable(path);
    if (!file.ok()) return "<" + std::string(file.status().message()) + ">";
    absl::StatusOr<std::vector<uint8_t>> bytes = Get(path, 0, *(*file)->Size());
    return bytes.ok() ? std::string(bytes->begin(), bytes->end()) : "<error>";
  }

  // The directory `dir` begun, its file data/x.bin holding `content`, and
  // committed with `content` as its marker's bytes.
  absl::Status Commit(const std::string& dir, const std::string& tmp,
                      const std::string& content, bool replace,
                      const std::string& aside) {
    const std::string subdirs[] = {"data"};
    absl::StatusOr<std::string> begun =
        storage().BeginDir(dir, tmp, subdirs, "MARKER", replace);
    if (!begun.ok()) return begun.status();
    Put(JoinPath(*begun, "data/x.bin"), content);
    return storage().CommitDir(*begun, dir, "MARKER", content, aside);
  }

  StorageSubject s_;
  StorageCapabilities can_;
};

// A 4 KiB-aligned buffer, as staged extents are.
struct AlignedBuffer {
  AlignedBuffer(size_t n, uint8_t seed)
      : data(static_cast<uint8_t*>(
            std::aligned_alloc(4096, (n + 4095) / 4096 * 4096))),
        size(n) {
    for (size_t i = 0; i < n; ++i)
      data[i] = static_cast<uint8_t>(seed + i * 13);
  }
  ~AlignedBuffer() { std::free(data); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  absl::Span<const uint8_t> span() const { return {data, size}; }
  std::vector<uint8_t> vector() const { return {data, data + size}; }
  uint8_t* data;
  size_t size;
};

TEST_P(StorageConformanceTest, CapabilitiesSayWhatItDoes) {
  absl::StatusOr<std::unique_ptr<WritableFile>> file =
      storage().OpenWritable(Path("f"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->sequential(), !can_.random_writes);
  ASSERT_TRUE((*file)->Sync().ok());
  ASSERT_TRUE((*file)->Close().ok());
  if (!can_.atomic_rename) {
    EXPECT_EQ(storage().Rename(Path("f"), Path("g")).code(),
              absl::StatusCode::kUnimplemented);
  }
  EXPECT_GE(storage().preferred_writer_streams(), 1);
}

TEST_P(StorageConformanceTest, WritesFromStartToEndReadBack) {
  auto file = storage().OpenWritable(Path("f.bin"));
  ASSERT_TRUE(file.ok()) << file.status();
  const AlignedBuffer aligned(8192, 1);          // O_DIRECT-eligible
  const AlignedBuffer with_tail(4096 + 100, 2);  // aligned body + tail
  const std::vector<uint8_t> unaligned = Bytes(333, 3);
  ASSERT_TRUE((*file)->WriteAt(0, aligned.span()).ok());
  ASSERT_TRUE((*file)->WriteAt(8192, with_tail.span()).ok());
  ASSERT_TRUE((*file)->WriteAt(8192 + 4196, unaligned).ok());
  ASSERT_TRUE((*file)->Sync().ok());
  ASSERT_TRUE((*file)->Close().ok());
  auto reader = storage().OpenReadable(Path("f.bin"));
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(*(*reader)->Size(), 8192 + 4196 + 333);
  EXPECT_EQ(*Get(Path("f.bin"), 0, 8192), aligned.vector());
  EXPECT_EQ(*Get(Path("f.bin"), 8192, 4196), with_tail.vector());
  EXPECT_EQ(*Get(Path("f.bin"), 8192 + 4196, 333), unaligned);
}

TEST_P(StorageConformanceTest, WritesAtOffsetsReadBack) {
  if (!can_.random_writes) GTEST_SKIP() << "files are written start to end";
  auto file = storage().OpenWritable(Path("f.bin"));
  ASSERT_TRUE(file.ok()) << file.status();
  const AlignedBuffer aligned(8192, 1);
  const std::vector<uint8_t> unaligned = Bytes(333, 3);
  ASSERT_TRUE((*file)->WriteAt(20000, unaligned).ok());  // past the end
  ASSERT_TRUE((*file)->WriteAt(0, aligned.span()).ok());
  ASSERT_TRUE((*file)->Sync().ok());
  ASSERT_TRUE((*file)->Close().ok());
  auto reader = storage().OpenReadable(Path("f.bin"));
  EXPECT_EQ(*(*reader)->Size(), 20000 + 333);
  EXPECT_EQ(*Get(Path("f.bin"), 0, 8192), aligned.vector());
  EXPECT_EQ(*Get(Path("f.bin"), 20000, 333), unaligned);
}

TEST_P(StorageConformanceTest, ConcurrentDisjointWritesToOneFile) {
  if (!can_.random_writes) GTEST_SKIP() << "one writer per file";
  auto file = storage().OpenWritable(Path("f.bin"));
  ASSERT_TRUE(file.ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const AlignedBuffer chunk(4096, static_cast<uint8_t>(t));
      for (int i = 0; i < 8; ++i) {
        EXPECT_TRUE((*file)->WriteAt((i * 4 + t) * 4096, chunk.span()).ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE((*file)->Sync().ok());
  for (int block = 0; block < 32; ++block) {
    EXPECT_EQ(*Get(Path("f.bin"), block * 4096, 4096),
              Bytes(4096, static_cast<uint8_t>(block % 4)))
        << block;
  }
}

TEST_P(StorageConformanceTest, WritesIntoAReservedFileReadBack) {
  if (!can_.random_writes) GTEST_SKIP() << "files are written start to end";
  auto file = storage().OpenWritable(Path("r.bin"));
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Reserve(0, 1 << 20).ok());
  const AlignedBuffer block(8192, 7);
  ASSERT_TRUE((*file)->WriteAt(4096, block.span()).ok());
  ASSERT_TRUE((*file)->WriteAt((1 << 20) - 100, Bytes(100, 8)).ok());
  ASSERT_TRUE((*file)->Sync().ok());
  ASSERT_TRUE((*file)->Close().ok());
  auto reader = storage().OpenReadable(Path("r.bin"));
  EXPECT_EQ(*(*reader)->Size(), 1 << 20);
  EXPECT_EQ(*Get(Path("r.bin"), 4096, 8192), block.vector());
  EXPECT_EQ(*Get(Path("r.bin"), (1 << 20) - 100, 100), Bytes(100, 8));
}

TEST_P(StorageConformanceTest, ReadPastTheEndIsDataLossNamingTheFile) {
  Put(Path("short.bin"), Bytes(100, 0));
  absl::Status status = Get(Path("short.bin"), 80, 50).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), ::testing::HasSubstr("short.bin"));
}

TEST_P(StorageConformanceTest, MissingFileIsNotFound) {
  EXPECT_EQ(storage().OpenReadable(Path("nope")).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(*storage().Exists(Path("nope")));
  if (!can_.local) return;  // a prefix exists once an object is under it
  EXPECT_EQ(storage().List(Path("nope")).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(storage().OpenWritable(Path("nodir/f")).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_P(StorageConformanceTest, AFileIsWrittenOnce) {
  Put(Path("f"), Bytes(1000, 0));
  EXPECT_EQ(storage().OpenWritable(Path("f")).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(*(*storage().OpenReadable(Path("f")))->Size(), 1000);  // kept
  if (!can_.local) return;
  ASSERT_TRUE(storage().CreateDir(Path("d")).ok());
  EXPECT_EQ(storage().OpenWritable(Path("d")).status().code(),
            absl::StatusCode::kAlreadyExists);
}

TEST_P(StorageConformanceTest, ListShowsTheNamesInADirectory) {
  ASSERT_TRUE(storage().CreateDirs(Path("d/sub")).ok());
  Put(Path("d/b"), "b");
  Put(Path("d/a"), "a");
  Put(Path("d/sub/x"), "x");
  ASSERT_TRUE(storage().SyncDir(Path("d")).ok());
  EXPECT_THAT(*storage().List(Path("d")),
              ::testing::ElementsAre("a", "b", "sub"));
  EXPECT_TRUE(*storage().IsDir(Path("d/sub")));
  EXPECT_FALSE(*storage().IsDir(Path("d/a")));
  EXPECT_TRUE(*storage().Exists(Path("d/sub")));
  // Removing a directory removes everything under it.
  // (A trailing '/' names the same directory on a filesystem.)
  ASSERT_TRUE(
      storage().RemoveAll(Path("d/sub") + (can_.local ? "/" : "")).ok());
  EXPECT_FALSE(*storage().Exists(Path("d/sub/x")));
  if (can_.consistent_listing) {
    EXPECT_THAT(*storage().List(Path("d")), ::testing::ElementsAre("a", "b"));
  }
  EXPECT_TRUE(storage().RemoveAll(Path("never-was")).ok());
}

TEST_P(StorageConformanceTest, DirectoriesAreMadeOnceAndRenamed) {
  if (!can_.atomic_rename) GTEST_SKIP() << "no rename";
  ASSERT_TRUE(storage().CreateDir(Path("d")).ok());
  EXPECT_EQ(storage().CreateDir(Path("d")).code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(storage().CreateDir(Path("d/sub")).ok());
  Put(Path("d/a"), "a");
  ASSERT_TRUE(storage().Rename(Path("d"), Path("e")).ok());
  EXPECT_FALSE(*storage().Exists(Path("d")));
  EXPECT_TRUE(*storage().Exists(Path("e/sub")));
  EXPECT_EQ(Text(Path("e/a")), "a");
  ASSERT_TRUE(storage().CreateDir(Path("f")).ok());
  EXPECT_EQ(storage().Rename(Path("e"), Path("f")).code(),
            absl::StatusCode::kAlreadyExists);
}

TEST_P(StorageConformanceTest, OpenReadableRefusesADirectory) {
  if (!can_.local) GTEST_SKIP() << "directories are prefixes";
  ASSERT_TRUE(storage().CreateDir(Path("d")).ok());
  absl::Status status = storage().OpenReadable(Path("d")).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), ::testing::HasSubstr("not a regular file"));
}

TEST_P(StorageConformanceTest, OpenReadableBeneathWalksRealDirectories) {
  ASSERT_TRUE(storage().CreateDirs(Path("step/data")).ok());
  Put(Path("step/data/x.bin"), Bytes(10, 0));
  auto read = storage().OpenReadableBeneath(Path("step"), "data/x.bin");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*(*read)->Size(), 10);
  absl::Status missing =
      storage().OpenReadableBeneath(Path("step"), "nodir/x.bin").status();
  if (can_.local) {  // a missing directory may be a link someone removed
    EXPECT_EQ(missing.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(missing.message(),
                ::testing::HasSubstr("not a directory inside"));
  } else {  // no directories, no links: a missing object
    EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  }
  EXPECT_EQ(
      storage().OpenReadableBeneath(Path("step"), "data/y.bin").status().code(),
      absl::StatusCode::kNotFound);
}

// The commit protocol (storage.h): a directory appears with every file in
// it, its marker last; never twice; replaced whole; removed whole.
TEST_P(StorageConformanceTest, ACommittedDirectoryAppearsWithItsMarker) {
  const std::string dir = Path("step_1");
  const std::string subdirs[] = {"data"};
  absl::StatusOr<std::string> begun =
      storage().BeginDir(dir, Path(".step_1.tmp"), subdirs, "MARKER", false);
  ASSERT_TRUE(begun.ok()) << begun.status();
  if (can_.atomic_rename) {
    EXPECT_NE(*begun, dir);  // written aside
  }
  Put(JoinPath(*begun, "data/x.bin"), "bytes");
  // Written, not committed: no marker, and (where it is renamed into
  // place) no directory.
  EXPECT_FALSE(*storage().HasMarker(dir, "MARKER"));
  if (can_.atomic_rename) {
    EXPECT_FALSE(*storage().Exists(dir));
  }
  ASSERT_TRUE(
      storage().CommitDir(*begun, dir, "MARKER", R"({"step":1})", "").ok());
  EXPECT_TRUE(*storage().HasMarker(dir, "MARKER"));
  EXPECT_EQ(Text(JoinPath(dir, "MARKER")), R"({"step":1})");
  EXPECT_EQ(Text(JoinPath(dir, "data/x.bin")), "bytes");
  if (*begun != dir) {
    EXPECT_FALSE(*storage().Exists(*begun));
  }
}

TEST_P(StorageConformanceTest, ACommittedDirectoryIsNotCommittedAgain) {
  const std::string dir = Path("step_2");
  ASSERT_TRUE(Commit(dir, Path(".a"), "first", false, "").ok());
  // Refused at the beginning (an object store sees the marker) or at the
  // commit; either way the first stays.
  const absl::Status again = Commit(dir, Path(".b"), "second", false, "");
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists) << again;
  EXPECT_EQ(Text(JoinPath(dir, "MARKER")), "first");
  EXPECT_EQ(Text(JoinPath(dir, "data/x.bin")), "first");
}

TEST_P(StorageConformanceTest, AReplacedDirectoryHoldsOnlyTheNewOne) {
  const std::string dir = Path("step_3");
  ASSERT_TRUE(Commit(dir, Path(".a"), "old", false, "").ok());
  Put(JoinPath(dir, "data/only-old.bin"), "o");
  ASSERT_TRUE(Commit(dir, Path(".b"), "new", true, Path(".aside")).ok());
  EXPECT_TRUE(*storage().HasMarker(dir, "MARKER"));
  EXPECT_EQ(Text(JoinPath(dir, "MARKER")), "new");
  EXPECT_EQ(Text(JoinPath(dir, "data/x.bin")), "new");
  EXPECT_FALSE(*storage().Exists(JoinPath(dir, "data/only-old.bin")));
  EXPECT_FALSE(*storage().Exists(Path(".aside")));
}

TEST_P(StorageConformanceTest, RemoveCommittedTakesTheDirectoryAway) {
  const std::string dir = Path("step_4");
  ASSERT_TRUE(Commit(dir, Path(".a"), "bytes", false, "").ok());
  ASSERT_TRUE(storage().RemoveCommitted(dir, Path(".gone"), "MARKER").ok());
  EXPECT_FALSE(*storage().HasMarker(dir, "MARKER"));
  EXPECT_FALSE(*storage().Exists(dir));
  EXPECT_FALSE(*storage().Exists(Path(".gone")));
  EXPECT_EQ(storage().RemoveCommitted(dir, Path(".gone"), "MARKER").code(),
            absl::StatusCode::kNotFound);
}

}  // namespace hoist::testing

#endif  // HOIST_TESTING_STORAGE_CONFORMANCE_H_
