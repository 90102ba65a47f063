// A GPT-style model (weights and Adam state) sharded Megatron-style on a
// (data, model) mesh: the sample the CLI plans, and later saves, and that the
// benchmarks measure. Only specs: no bytes are allocated here.
#ifndef HOIST_MODEL_SAMPLE_MODEL_H_
#define HOIST_MODEL_SAMPLE_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "hoist/array_spec.h"
#include "hoist/mesh.h"

namespace hoist {

struct GptConfig {
  int layers = 12;        // transformer blocks
  int64_t d_model = 768;  // hidden size
  int64_t vocab = 50257;  // GPT-2's vocabulary: odd, and not padded
  int64_t seq = 1024;     // learned position embeddings
  bool adam = true;       // add Adam's mu and nu for every weight
  DType dtype = DType::kFloat32;
};

// Parameter count of the weights alone (no optimizer state).
int64_t GptParameterCount(const GptConfig& config);

// The config of `layers` blocks and d_model chosen so that weights of
// `dtype` plus float32 Adam state come to about `total_bytes`.
GptConfig GptConfigForBytes(int64_t total_bytes, DType dtype = DType::kFloat32);

// The arrays, named "params/h/3/attn/c_attn/w", "opt/mu/…", "opt/nu/…" and
// "opt/count" (int32 scalar). `mesh` needs axes "data" and "model"; weights
// are sharded over "model" (column-parallel c_attn and c_fc, row-parallel
// c_proj, embeddings along d_model) and replicated over "data"; layer norms,
// row-parallel biases and position embeddings are replicated everywhere.
// kInvalidArgument if the mesh lacks those axes; the shardings themselves are
// validated when planned.
absl::StatusOr<std::vector<ArraySpec>> GptModel(const GptConfig& config,
                                                const Mesh& mesh);

}  // namespace hoist

#endif  // HOIST_MODEL_SAMPLE_MODEL_H_
