#include "hoist/model/sample_model.h"

#include <cmath>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace hoist {
namespace {

struct Weight {
  std::string name;
  std::vector<int64_t> shape;
  PartitionSpec spec;
};

std::vector<Weight> GptWeights(const GptConfig& c) {
  const int64_t d = c.d_model;
  const PartitionSpec replicated = {};
  const PartitionSpec columns = {{}, {"model"}};  // (in, out/model)
  const PartitionSpec rows = {{"model"}};         // (in/model, out)
  std::vector<Weight> w = {
      {"params/wte", {c.vocab, d}, columns},
      {"params/wpe", {c.seq, d}, replicated},
  };
  for (int l = 0; l < c.layers; ++l) {
    const std::string h = absl::StrCat("params/h/", l, "/");
    w.push_back({h + "ln_1/scale", {d}, replicated});
    w.push_back({h + "ln_1/bias", {d}, replicated});
    w.push_back({h + "attn/c_attn/w", {d, 3 * d}, columns});
    w.push_back({h + "attn/c_attn/b", {3 * d}, rows});
    w.push_back({h + "attn/c_proj/w", {d, d}, rows});
    w.push_back({h + "attn/c_proj/b", {d}, replicated});
    w.push_back({h + "ln_2/scale", {d}, replicated});
    w.push_back({h + "ln_2/bias", {d}, replicated});
    w.push_back({h + "mlp/c_fc/w", {d, 4 * d}, columns});
    w.push_back({h + "mlp/c_fc/b", {4 * d}, rows});
    w.push_back({h + "mlp/c_proj/w", {4 * d, d}, rows});
    w.push_back({h + "mlp/c_proj/b", {d}, replicated});
  }
  w.push_back({"params/ln_f/scale", {d}, replicated});
  w.push_back({"params/ln_f/bias", {d}, replicated});
  return w;
}

}  // namespace

int64_t GptParameterCount(const GptConfig& config) {
  int64_t count = 0;
  for (const Weight& w : GptWeights(config)) {
    count += Box::FromShape(w.shape).num_elements();
  }
  return count;
}

GptConfig GptConfigForBytes(int64_t total_bytes, DType dtype) {
  // Per layer ~12 d^2 weights; with Adam, 3 copies. Keep d a multiple of 256
  // (divisible by any model axis up to 256), aim at about 48 layers, and fit
  // the layer count to the rest.
  GptConfig config;
  config.dtype = dtype;
  const double bytes_per_param =
      static_cast<double>(ItemSize(dtype)) + (config.adam ? 8.0 : 0.0);
  const double params = static_cast<double>(total_bytes) / bytes_per_param;
  config.d_model = 256;
  while (config.d_model < 8192 &&
         12.0 * 48 * config.d_model * config.d_model < params) {
    config.d_model += 256;
  }
  const double d = static_cast<double>(config.d_model);
  const double fixed = (config.vocab + config.seq) * d;
  config.layers = std::max(1, static_cast<int>(std::lround(
                                  (params - fixed) / (12.0 * d * d + 13 * d))));
  return config;
}

absl::StatusOr<std::vector<ArraySpec>> GptModel(const GptConfig& config,
                                                const Mesh& mesh) {
  if (!mesh.AxisIndex("data") || !mesh.AxisIndex("model")) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the GPT sample model needs mesh axes 'data' and 'model'; got %s",
        mesh.ToString()));
  }
  std::vector<ArraySpec> arrays;
  const std::vector<Weight> weights = GptWeights(config);
  const std::vector<std::string> groups =
      config.adam ? std::vector<std::string>{"", "opt/mu/", "opt/nu/"}
                  : std::vector<std::string>{""};
  for (const std::string& group : groups) {
    for (const Weight& w : weights) {
      arrays.push_back({group.empty() ? w.name : group + w.name.substr(7),
                        group.empty() ? config.dtype : DType::kFloat32, w.shape,
                        NamedSharding{mesh, w.spec}});
    }
  }
  if (config.adam) {
    arrays.push_back(
        {"opt/count", DType::kInt32, {}, Sharding::Replicated(mesh)});
  }
  return arrays;
}

}  // namespace hoist
