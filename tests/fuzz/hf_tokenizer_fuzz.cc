// Hugging Face tokenizers: tokenizer.json, tokenizer_config.json and
// generation_config.json (the input's parts, NUL-separated), then encoding
// and decoding with what loaded.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/tokenizer/hf_tokenizer.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string_view> parts =
      tandem::fuzz::SplitAtNul(tandem::fuzz::AsText(data, size), 3);
  tandem::HfTokenizer::Files files;
  files.tokenizer_path = "tokenizer.json";
  files.tokenizer_json = std::string(parts[0]);
  if (parts.size() > 1) {
    files.config_path = "tokenizer_config.json";
    files.config_json = std::string(parts[1]);
  }
  if (parts.size() > 2) {
    files.generation_config_path = "generation_config.json";
    files.generation_config_json = std::string(parts[2]);
  }
  absl::StatusOr<std::unique_ptr<tandem::HfTokenizer>> tokenizer =
      tandem::HfTokenizer::FromFiles(files);
  if (!tokenizer.ok()) return 0;
  const int vocab = (*tokenizer)->vocab_size();
  for (bool special : {false, true}) {
    absl::StatusOr<std::vector<int32_t>> ids =
        (*tokenizer)
            ->Encode(
                "Hello  world!\n\t123 4567 <s></s><|endoftext|> h\xc3\xa9llo \xff\xfe caf\xc3\xa9",
                tandem::EncodeOptions{.add_bos = true, .parse_special = special});
    FUZZ_CHECK(ids.ok());
    int32_t prev = (*tokenizer)->bos_id();
    for (int32_t id : *ids) {
      FUZZ_CHECK(id >= 0 && id < vocab);
      (void)(*tokenizer)->Decode(prev, id);
      prev = id;
    }
  }
  for (int32_t id = 0; id < vocab && id < 64; ++id) (void)(*tokenizer)->Decode(-1, id);
  // Ids reach Decode from clients (/detokenize): out of range is an error.
  FUZZ_CHECK(!(*tokenizer)->Decode(-1, vocab).ok());
  FUZZ_CHECK(!(*tokenizer)->Decode(-1, -1).ok());
  return 0;
}
