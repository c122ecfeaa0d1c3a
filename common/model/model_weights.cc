#include "common/model/model_weights.h"

#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/model/gguf_model.h"
#include "common/model/llama2c_checkpoint.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModel(const std::string& path) {
  char magic[4] = {};
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open model file '", path, "'"));
  in.read(magic, 4);
  if (in.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0) return LoadGgufModel(path);
  return LoadLlama2cCheckpoint(path);
}

}  // namespace tandem
