// Text <-> token ids for Llama-family vocabularies. Implementations are
// immutable after loading and safe to use from many threads.
#ifndef TANDEM_COMMON_MODEL_TOKENIZER_H_
#define TANDEM_COMMON_MODEL_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  virtual int vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;

  // Ids of `text` under SentencePiece rules (a leading space is added to
  // non-empty text, spaces become U+2581, unknown bytes fall back to
  // <0xXX>), with BOS first when `add_bos`.
  virtual absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                                      bool add_bos) const = 0;

  // The bytes token `id` stands for when it follows token `prev`: byte tokens
  // <0xXX> give their byte, U+2581 gives a space, and the leading space of
  // the first piece after BOS is dropped. Control tokens give "", <unk> gives
  // " \u2047 " as SentencePiece does. Out-of-range ids are INVALID_ARGUMENT;
  // any `prev` is accepted (-1 for "none"). Bytes may be part of a UTF-8
  // character; see IncrementalDetokenizer for streaming whole characters.
  virtual absl::StatusOr<std::string> Decode(int32_t prev, int32_t id) const = 0;
};

// Loads a tokenizer by the file's contents: a SentencePiece model
// (`.model`, protobuf) or a llama2.c `tokenizer.bin`. A missing file is
// NOT_FOUND; an empty, truncated or corrupt one is INVALID_ARGUMENT naming
// the file and the problem.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path);

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_TOKENIZER_H_
