// llama2.c checkpoints: the seven-field header checked against the size.
#include <cstddef>
#include <cstdint>
#include <span>

#include "common/model/llama2c_checkpoint.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<std::unique_ptr<tandem::ModelWeights>> weights =
      tandem::ParseLlama2cCheckpoint(nullptr, std::span(data, size), "fuzz.bin");
  if (!weights.ok()) return 0;
  // Every tensor lies inside the input.
  const auto inside = [&](const tandem::Tensor& t) {
    const auto* begin = static_cast<const uint8_t*>(t.data);
    return begin >= data && begin + t.size_bytes() <= data + size;
  };
  FUZZ_CHECK(inside((*weights)->token_embedding));
  FUZZ_CHECK(inside((*weights)->classifier));
  FUZZ_CHECK(inside((*weights)->rms_final));
  for (const tandem::LayerWeights& layer : (*weights)->layers) {
    FUZZ_CHECK(inside(layer.wq) && inside(layer.wk) && inside(layer.wv) && inside(layer.wo));
    FUZZ_CHECK(inside(layer.w1) && inside(layer.w2) && inside(layer.w3));
  }
  return 0;
}
