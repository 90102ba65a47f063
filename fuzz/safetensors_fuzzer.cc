// Fuzzes the safetensors header reader (ReadSafetensorsHeaders) with
// arbitrary files: it must return an error or tensors that tile the file's
// data exactly, never crash, hang or read outside the file.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "hoist/interop.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/hoist-safetensors-fuzz-" +
                                  std::to_string(getpid()) + ".safetensors";
  FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) return 0;
  std::fwrite(data, 1, size, file);
  std::fclose(file);
  absl::StatusOr<std::vector<hoist::SafetensorsTensor>> tensors =
      hoist::ReadSafetensorsHeaders(path);
  if (tensors.ok()) {
    int64_t bytes = 0;
    for (const hoist::SafetensorsTensor& tensor : *tensors) {
      if (tensor.offset < 8 || tensor.bytes < 0 ||
          tensor.offset + tensor.bytes > static_cast<int64_t>(size)) {
        std::abort();  // a tensor outside the file
      }
      bytes += tensor.bytes;
    }
    if (!tensors->empty() && bytes > static_cast<int64_t>(size)) std::abort();
  }
  return 0;
}
