#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <xxhash.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "hoist/checkpoint_manager.h"
#include "hoist/checkpoint_root.h"
#include "hoist/format/layout.h"
#include "hoist/host_backend.h"
#include "hoist/interop.h"
#include "testing/array_bytes.h"
#include "testing/loop_filesystem.h"
#include "testing/mixed_model.h"
#include "testing/temp_dir.h"

namespace hoist {
namespace {

using ::testing::HasSubstr;

std::vector<ArraySpec> Model() {
  const Mesh mesh = *Mesh::Create({"data", "model"}, {2, 2});
  return {
      // Sharded over columns: a run of rows meets every shard.
      {"model/w",
       DType::kBFloat16,
       {300, 260},
       NamedSharding{mesh, {{}, {"model"}}}},
      {"model/b", DType::kFloat32, {260}, Sharding::Replicated(mesh)},
      {"model/big",
       DType::kFloat32,
       {3, 1000, 100},
       NamedSharding{mesh, {{}, {"data", "model"}}}},
      {"model/empty", DType::kInt64, {0, 4}, Sharding::Replicated(mesh)},
      {"optim/mu", DType::kFloat8E4M3FN, {64}, Sharding::Replicated(mesh)},
  };
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A safetensors file: its header, and each tensor's bytes.
struct Parsed {
  nlohmann::json header;
  std::map<std::string, std::string> tensors;
};

Parsed Parse(const std::string& path) {
  const std::string text = ReadFile(path);
  uint64_t length = 0;
  std::memcpy(&length, text.data(), 8);
  Parsed out;
  out.header = nlohmann::json::parse(text.substr(8, length));
  const size_t data = 8 + length;
  EXPECT_EQ(data % 8, 0u);
  std::map<std::pair<size_t, size_t>, std::string> by_offset;
  for (auto& [name, entry] : out.header.items()) {
    if (name == "__metadata__") continue;
    by_offset[{entry["data_offsets"][0], entry["data_offsets"][1]}] = name;
  }
  size_t expected_begin = 0;
  for (const auto& [offsets, name] : by_offset) {
    const auto [begin, end] = offsets;
    EXPECT_EQ(begin, expected_begin) << name;  // back to back
    expected_begin = end;
    out.tensors[name] = text.substr(data + begin, end - begin);
  }
  EXPECT_EQ(data + expected_begin, text.size());
  return out;
}

class ExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = *MakeHostBackend({.num_devices = 4});
    model_ = Model();
    shards_ = testing::FillShards(model_, backend_->devices());
    root_ = temp_.path() + "/ckpt";
    coordinator_ = MakeSingleProcessCoordinator();
    auto manager = *CheckpointManager::Open(root_, *backend_, *coordinator_);
    ASSERT_TRUE(manager->Save(7, testing::SaveArraysOf(model_, shards_)).ok());
    ASSERT_TRUE(manager->WaitUntilFinished().ok());
  }

  std::string Expected(int array) const {
    const ArraySpec& spec = model_[array];
    std::vector<uint8_t> bytes = testing::BoxBytes(
        spec, array,
        Box(std::vector<int64_t>(spec.shape.size(), 0), spec.shape));
    return std::string(bytes.begin(), bytes.end());
  }

  testing::TempDir temp_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Coordinator> coordinator_;
  std::vector<ArraySpec> model_;
  testing::DeviceShards shards_;
  std::string root_;
};

TEST_F(ExportTest, OneFileHoldsEveryTensorBitExactWithItsHash) {
  const std::string out = temp_.path() + "/hf";
  absl::StatusOr<ExportStats> stats = ExportSafetensors(root_, out);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->tensors, 5);
  ASSERT_EQ(stats->files.size(), 1u);
  Parsed file = Parse(out + "/model.safetensors");
  const nlohmann::json meta = file.header["__metadata__"];
  EXPECT_EQ(meta["format"], "pt");
  EXPECT_EQ(meta["hoist.step"], "7");
  const nlohmann::json hashes =
      nlohmann::json::parse(meta["hoist.xxh3"].get<std::string>());
  for (size_t a = 0; a < model_.size(); ++a) {
    const std::string& name = model_[a].name;
    ASSERT_TRUE(file.tensors.contains(name)) << name;
    EXPECT_EQ(file.tensors[name], Expected(a)) << name;
    EXPECT_EQ(file.header[name]["shape"], model_[a].shape);
    EXPECT_EQ(hashes[name],
              absl::StrFormat("%016x", XXH3_64bits(file.tensors[name].data(),
                                                   file.tensors[name].size())));
  }
  EXPECT_EQ(file.header["model/w"]["dtype"], "BF16");
  EXPECT_EQ(file.header["optim/mu"]["dtype"], "F8_E4M3");
}

TEST_F(ExportTest, ShardsWithAnIndexAndStreamsThroughLittleMemory) {
  const std::string out = temp_.path() + "/hf";
  // 1 MiB of memory: 512 KiB chunks; model/big (1.2 MB) goes in runs of
  // rows, model/w meets both column shards in every run.
  absl::StatusOr<ExportStats> stats =
      ExportSafetensors(root_, out,
                        {.max_shard_bytes = 200'000,
                         .prefix = "model/=base.",
                         .memory_bytes = 1 << 20});
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->tensors, 4);  // optim/ left out
  const nlohmann::json index =
      nlohmann::json::parse(ReadFile(out + "/model.safetensors.index.json"));
  EXPECT_EQ(index["weight_map"].size(), 4u);
  int64_t total = 0;
  for (size_t a = 0; a < 4; ++a) {
    const std::string name = "base." + model_[a].name.substr(6);
    const std::string file = index["weight_map"][name];
    EXPECT_THAT(file, ::testing::MatchesRegex(
                          "model-0000[1-9]-of-0000[0-9].safetensors"));
    Parsed parsed = Parse(out + "/" + file);
    EXPECT_EQ(parsed.tensors[name], Expected(a)) << name;
    total += static_cast<int64_t>(parsed.tensors[name].size());
  }
  EXPECT_EQ(index["metadata"]["total_size"], total);
  EXPECT_GE(stats->files.size(), 3u);  // w alone, big alone, b + empty
  // Every extent read once, though runs of rows cut each of them.
  EXPECT_EQ(stats->bytes_read, stats->bytes);
}

TEST_F(ExportTest, AnExtentCorruptAtItsEndFailsAfterItsFirstRunsWereWritten) {
  // model/big's first extent (3 x 500 x 50 float32, 300 KB) is read in
  // runs across several 188 KiB chunks; only its last byte is wrong, so
  // the mismatch shows when its earlier runs are already written.
  const Manifest manifest = *ReadManifestAt(root_);
  const ManifestArray& big = manifest.arrays[2];
  ASSERT_EQ(big.name, "model/big");
  const ManifestExtent& extent = big.extents[0];
  ASSERT_GT(extent.length_bytes, 2 << 17);
  {
    std::fstream f(root_ + "/" + StepDirName(7) + "/" + extent.file,
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(extent.offset_bytes + extent.length_bytes - 1);
    const char last = static_cast<char>(f.get());
    f.seekp(extent.offset_bytes + extent.length_bytes - 1);
    f.put(static_cast<char>(last ^ 0x01));
  }
  const std::string out = temp_.path() + "/hf";
  SafetensorsExportOptions options;
  options.memory_bytes = 1 << 20;
  absl::Status status = ExportSafetensors(root_, out, options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr("array 'model/big'"));
  EXPECT_THAT(status.message(), HasSubstr("xxh3 mismatch"));
  EXPECT_TRUE(std::filesystem::is_empty(out));
}

TEST_F(ExportTest, RefusesAnExistingExportAndNamesItCannotMake) {
  const std::string out = temp_.path() + "/hf";
  ASSERT_TRUE(ExportSafetensors(root_, out).ok());
  absl::Status again = ExportSafetensors(root_, out).status();
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(again.message(), HasSubstr("already holds an export"));
  absl::Status none =
      ExportSafetensors(root_, temp_.path() + "/x", {.prefix = "nope/"})
          .status();
  EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.message(), HasSubstr("no array's name starts with 'nope/'"));
  absl::Status nameless =
      ExportSafetensors(root_, temp_.path() + "/y", {.prefix = "optim/mu"})
          .status();
  EXPECT_EQ(nameless.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(nameless.message(), HasSubstr("safetensors cannot hold"));
  EXPECT_EQ(ExportSafetensors(temp_.path() + "/none", temp_.path() + "/z")
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  // An OUT_DIR that is a file is named as such, and left as it was.
  const std::string file = temp_.path() + "/a-file";
  { std::ofstream(file) << "kept"; }
  absl::Status not_dir = ExportSafetensors(root_, file).status();
  EXPECT_EQ(not_dir.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(not_dir.message(), HasSubstr("a-file is not a directory"));
  std::ifstream kept(file);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(kept), {}), "kept");
}

TEST_F(ExportTest, ACorruptExtentFailsWithoutLeavingAFile) {
  const std::string data = root_ + "/" + StepDirName(7) + "/data";
  for (const auto& entry : std::filesystem::directory_iterator(data)) {
    std::fstream f(entry.path(),
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x5a');
  }
  const std::string out = temp_.path() + "/hf";
  absl::Status status = ExportSafetensors(root_, out).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_TRUE(std::filesystem::is_empty(out));
}

TEST_F(ExportTest, AFullDiskFailsBeforeAnyByteMovesAndLeavesNoFile) {
  testing::LoopFilesystem fs(32 << 20);
  if (!fs.ok()) GTEST_SKIP() << fs.reason();
  // Less room than the export (1.5 MB of tensors) needs.
  {
    std::ofstream out(fs.path() + "/filler", std::ios::binary);
    const std::string block(1 << 16, 'x');
    // Until the disk is full (or nearly: the stream fails when it is).
    while (fs.FreeBytes() > (int64_t{512} << 10) &&
           out.write(block.data(), block.size()).flush()) {
    }
  }
  sync();
  const std::string out = fs.path() + "/hf";
  absl::Status status = ExportSafetensors(root_, out).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_THAT(status.message(), HasSubstr("fallocate"));
  EXPECT_THAT(status.message(), HasSubstr("No space left on device"));
  EXPECT_TRUE(std::filesystem::is_empty(out));
}

TEST_F(ExportTest, ImportOfTheExportRestoresEveryArrayBitExact) {
  const std::string out = temp_.path() + "/hf";
  SafetensorsExportOptions options;
  options.max_shard_bytes = 300'000;
  ASSERT_TRUE(ExportSafetensors(root_, out, options).ok());
  const std::string imported = temp_.path() + "/imported";
  absl::StatusOr<ImportStats> stats =
      ImportSafetensors(out, imported, 3, /*pool_bytes=*/1 << 20);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->arrays, static_cast<int64_t>(model_.size()));
  auto root = *CheckpointRoot::OpenForReading(imported);
  const Manifest manifest = *root->ReadManifest(3);
  EXPECT_THAT(manifest.metadata_json, HasSubstr("\"imported_from\""));
  for (size_t a = 0; a < model_.size(); ++a) {
    const ArraySpec& spec = model_[a];
    std::string bytes(Expected(a).size(), '\0');
    std::vector<RestoreTarget> targets = {
        {spec.name,
         spec.dtype,
         spec.shape,
         {{Box(std::vector<int64_t>(spec.shape.size(), 0), spec.shape), nullptr,
           bytes.data()}}}};
    ASSERT_TRUE(root->Read(3, targets).ok()) << spec.name;
    EXPECT_EQ(bytes, Expected(a)) << spec.name;
  }
  EXPECT_EQ(root->Verify(3)->problems.size(), 0u);
}

// A safetensors file of `header` (JSON text) and `data` bytes.
std::string WriteSafetensors(const std::string& path, const std::string& header,
                             size_t data) {
  std::string text(8, '\0');
  for (int i = 0; i < 8; ++i)
    text[i] = static_cast<char>(header.size() >> (8 * i));
  text += header + std::string(data, '\x01');
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

TEST(SafetensorsImportTest, RefusesHeadersThatDoNotTileTheData) {
  testing::TempDir temp;
  const std::string huge = WriteSafetensors(
      temp.path() + "/huge.safetensors",
      R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
      8);
  absl::Status status = ReadSafetensorsHeaders(huge).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("more than the file's"));
  const std::string gap = WriteSafetensors(
      temp.path() + "/gap.safetensors",
      R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", 4);
  EXPECT_THAT(ReadSafetensorsHeaders(gap).status().message(),
              HasSubstr("leaving a gap after 0"));
  // The same tensor in two files of one directory's index.
  const std::string dir = temp.path() + "/two";
  std::filesystem::create_directory(dir);
  for (const char* file : {"x.safetensors", "y.safetensors"}) {
    WriteSafetensors(dir + "/" + file,
                     R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})",
                     1);
  }
  std::ofstream(dir + "/model.safetensors.index.json")
      << R"({"weight_map":{"a":"x.safetensors","b":"y.safetensors"}})";
  status = ReadSafetensorsHeaders(dir).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("tensor 'a' is in both"));
  std::ofstream(dir + "/model.safetensors.index.json")
      << R"({"weight_map":{"a":"../x.safetensors"}})";
  EXPECT_THAT(ReadSafetensorsHeaders(dir).status().message(),
              HasSubstr("not a file name in its directory"));
  // Nothing was imported: no root was made.
  EXPECT_FALSE(ImportSafetensors(huge, temp.path() + "/root", 1).ok());
  EXPECT_FALSE(std::filesystem::exists(temp.path() + "/root"));
}

TEST(SafetensorsDTypeTest, EveryHoistDTypeHasANameAndBack) {
  for (DType dtype : kAllDTypes) {
    const std::string name(DTypeName(dtype));
    absl::StatusOr<std::string> st = SafetensorsDType(name);
    ASSERT_TRUE(st.ok()) << name;
    EXPECT_EQ(*HoistDTypeOfSafetensors(*st), name);
  }
  EXPECT_EQ(HoistDTypeOfSafetensors("C64").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hoist
