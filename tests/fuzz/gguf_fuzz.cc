// GGUF files: the header, metadata and tensor infos (GgufFile::Parse), every
// typed getter on every key, loading the file as a llama model, and
// widening its matrices from any of the supported (quantized) types.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "common/model/gguf.h"
#include "common/model/gguf_model.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<tandem::GgufFile> file =
      tandem::GgufFile::Parse(nullptr, std::span(data, size), "fuzz.gguf");
  if (!file.ok()) return 0;
  for (const tandem::GgufMetadataEntry& entry : file->metadata()) {
    FUZZ_CHECK(file->FindValue(entry.key) == &entry.value);
    (void)file->GetUint32(entry.key);
    (void)file->GetInt32(entry.key);
    (void)file->GetUint64(entry.key);
    (void)file->GetFloat(entry.key);
    (void)file->GetBool(entry.key);
    (void)file->GetString(entry.key);
    (void)file->GetStringArray(entry.key);
    (void)file->GetFloatArray(entry.key);
    (void)file->GetInt32Array(entry.key);
  }
  for (const tandem::GgufTensorInfo& t : file->tensors()) {
    FUZZ_CHECK(file->FindTensor(t.name) == &t);
    FUZZ_CHECK(t.data.size() == t.num_bytes);
    FUZZ_CHECK(t.data.data() >= data && t.data.data() + t.data.size() <= data + size);
  }
  absl::StatusOr<std::unique_ptr<tandem::ModelWeights>> model = tandem::LoadGgufModel(*file);
  if (!model.ok()) return 0;
  // Widen every matrix, whatever its (quantized) type: at most 8 floats a
  // byte of input.
  for (const tandem::LayerWeights& l : (*model)->layers) {
    for (const tandem::Tensor* t : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w1, &l.w2, &l.w3}) {
      FUZZ_CHECK(t->ToFloats().size() == t->size());
    }
  }
  FUZZ_CHECK((*model)->token_embedding.ToFloats().size() == (*model)->token_embedding.size());
  return 0;
}
