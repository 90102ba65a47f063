// The file names of a Hugging Face safetensors checkpoint, as the Hub lays
// it out: one place for the export and the import.
#ifndef HOIST_INTEROP_SAFETENSORS_NAMES_H_
#define HOIST_INTEROP_SAFETENSORS_NAMES_H_

namespace hoist {

// A checkpoint in one file.
inline constexpr char kSafetensorsSingleFile[] = "model.safetensors";
// A checkpoint in shards: {"metadata": {"total_size"}, "weight_map":
// {tensor: shard file}}; shards are model-0000K-of-0000N.safetensors.
inline constexpr char kSafetensorsIndexFile[] = "model.safetensors.index.json";

}  // namespace hoist

#endif  // HOIST_INTEROP_SAFETENSORS_NAMES_H_
