// Text <-> token ids for Llama-family vocabularies. Implementations are
// immutable after loading and safe to use from many threads.
#ifndef TANDEM_COMMON_TOKENIZER_TOKENIZER_H_
#define TANDEM_COMMON_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

// How Encode treats its input.
struct EncodeOptions {
  // Add the tokens the model puts around every text: BOS first (and EOS last
  // where tokenizer_config.json sets add_eos_token). A tokenizer without BOS
  // (Qwen) or whose config says add_bos_token: false adds nothing.
  bool add_bos = false;
  // Match the model's special tokens (<s>, <|eot_id|>, ...) in the text and
  // emit their ids, as for a prompt rendered from a chat template. When false
  // a special token's spelling is encoded as ordinary text, so user text can
  // never produce a control id.
  bool parse_special = false;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  virtual int vocab_size() const = 0;
  // -1 when the model has no BOS token (Qwen).
  virtual int32_t bos_id() const = 0;
  // The main end-of-sequence id (the config's eos_token); -1 when none.
  virtual int32_t eos_id() const = 0;
  // Every id that ends generation, eos_id() first: Llama 3 instruct models
  // stop on <|end_of_text|>, <|eom_id|> and <|eot_id|>. Empty when none.
  virtual std::vector<int32_t> eos_ids() const {
    const int32_t eos = eos_id();
    return eos >= 0 ? std::vector<int32_t>{eos} : std::vector<int32_t>{};
  }

  // Ids of `text` under the model's rules. For SentencePiece vocabularies a
  // leading space is added to non-empty text, spaces become U+2581 and
  // unknown bytes fall back to <0xXX>; byte-level BPE vocabularies (Llama 3,
  // Qwen) split the text with their pre-tokenizer pattern first.
  virtual absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                                      const EncodeOptions& options) const = 0;

  // Encode(text, {.add_bos = add_bos}): plain text, no special tokens.
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_bos) const {
    return Encode(text, EncodeOptions{.add_bos = add_bos});
  }

  // The bytes token `id` stands for when it follows token `prev`: byte tokens
  // <0xXX> give their byte, U+2581 gives a space, byte-level BPE tokens give
  // the bytes their characters stand for, and for vocabularies that add a
  // leading space to the text (SentencePiece style) the leading space of the
  // first piece after BOS is dropped. Control and special tokens give "",
  // <unk> gives " \u2047 " as SentencePiece does. Out-of-range ids are
  // INVALID_ARGUMENT; any `prev` is accepted (-1 for "none"). Bytes may be
  // part of a UTF-8 character; see IncrementalDetokenizer for streaming whole
  // characters.
  virtual absl::StatusOr<std::string> Decode(int32_t prev, int32_t id) const = 0;
};

// Loads a tokenizer: a Hugging Face model folder (its tokenizer.json, with
// tokenizer_config.json and generation_config.json when present, or else its
// tokenizer.model), a tokenizer.json file (its folder's config files are read
// too), or by the file's contents a SentencePiece model (`.model`, protobuf)
// or a llama2.c `tokenizer.bin`. A missing file is NOT_FOUND; an empty,
// truncated or corrupt one is INVALID_ARGUMENT naming the file and the
// problem.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path);

}  // namespace tandem

#endif  // TANDEM_COMMON_TOKENIZER_TOKENIZER_H_
