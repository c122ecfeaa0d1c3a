#include "tests/e2e/hub_folder.h"

#include <memory>
#include <utility>

#include "common/base/logging.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/engine/engine.h"
#include "common/engine/generate.h"
#include "common/model/model_weights.h"
#include "common/model/synthetic.h"
#include "common/tokenizer/hf_tokenizer_writer.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/testing/model_files.h"

namespace tandem::testing {

namespace {

std::string WriteHubFolder(const std::string& name, const ModelWeights& weights, DType dtype) {
  const std::string dir = TempDir() + "/" + name;
  auto tokenizer = LoadTokenizer(ModelFile("tok512.bin"));
  CHECK_OK(tokenizer.status());
  HubWriteOptions options;
  options.dtype = dtype;
  options.bos_id = (*tokenizer)->bos_id();
  options.eos_ids = (*tokenizer)->eos_ids();
  CHECK_OK(WriteHubModel(weights, dir, options));
  auto vocab = SpmVocabularyOf(**tokenizer);
  CHECK_OK(vocab.status());
  CHECK_OK(WriteHfTokenizer(*vocab, dir));
  return dir;
}

}  // namespace

std::string WriteStoriesHubFolder(const std::string& name, DType dtype) {
  auto weights = LoadModel(ModelFile("stories260K.bin"));
  CHECK_OK(weights.status());
  return WriteHubFolder(name, **weights, dtype);
}

std::string WriteSyntheticHubFolder(const std::string& name, const ModelConfig& config,
                                    DType dtype) {
  CHECK(config.vocab_size == 512) << "tok512.bin has 512 tokens";
  auto weights = MakeSyntheticModel(config, 3);
  CHECK_OK(weights.status());
  return WriteHubFolder(name, **weights, dtype);
}

std::vector<int32_t> LocalGreedyTokens(const std::string& dir, const std::vector<int32_t>& prompt,
                                       int max_tokens, std::optional<DType> kv_dtype) {
  auto weights = LoadModel(dir);
  CHECK_OK(weights.status());
  auto backend = CpuBackend::Create(CpuBackendOptions{.num_threads = 1});
  CHECK_OK(backend.status());
  auto engine =
      Engine::Create(**weights, std::move(backend).value(), EngineOptions{.kv_dtype = kv_dtype});
  CHECK_OK(engine.status());
  auto tokenizer = LoadTokenizer(dir);
  CHECK_OK(tokenizer.status());
  GenerateRequest request;
  request.prompt = prompt;
  request.max_new_tokens = max_tokens;
  request.eos_ids = (*tokenizer)->eos_ids();
  auto result = Generate(**engine, request);
  CHECK_OK(result.status());
  return result->tokens;
}

}  // namespace tandem::testing
