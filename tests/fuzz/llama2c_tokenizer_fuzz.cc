// llama2.c tokenizer.bin files, then encoding and decoding with the result.
#include <cstddef>
#include <cstdint>
#include <span>

#include "common/tokenizer/llama2c_tokenizer.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<std::unique_ptr<tandem::Llama2cTokenizer>> tokenizer =
      tandem::Llama2cTokenizer::FromBytes(std::span(data, size), "fuzz-tokenizer.bin");
  if (!tokenizer.ok()) return 0;
  const int vocab = (*tokenizer)->vocab_size();
  FUZZ_CHECK(vocab > 0);
  absl::StatusOr<std::vector<int32_t>> ids =
      (*tokenizer)->Encode("Hello world, héllo 123!", /*add_bos=*/true);
  FUZZ_CHECK(ids.ok());
  int32_t prev = (*tokenizer)->bos_id();
  for (int32_t id : *ids) {
    FUZZ_CHECK(id >= 0 && id < vocab);
    (void)(*tokenizer)->Decode(prev, id);
    prev = id;
  }
  // Ids reach Decode from clients (/detokenize): out of range is an error.
  FUZZ_CHECK(!(*tokenizer)->Decode(-1, vocab).ok());
  FUZZ_CHECK(!(*tokenizer)->Decode(-1, -1).ok());
  return 0;
}
