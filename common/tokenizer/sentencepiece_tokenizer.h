// A SentencePiece model (`tokenizer.model`, a ModelProto) through
// libsentencepiece, which stays private to this target.
#ifndef TANDEM_COMMON_TOKENIZER_SENTENCEPIECE_TOKENIZER_H_
#define TANDEM_COMMON_TOKENIZER_SENTENCEPIECE_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/special_tokens.h"
#include "common/tokenizer/spm_vocabulary.h"
#include "common/tokenizer/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}  // namespace sentencepiece

namespace tandem {

// Immutable after construction; safe to use from many threads (the
// processor's const methods are).
class SentencePieceTokenizer final : public Tokenizer {
 public:
  // Parses a serialized ModelProto. `path` only names the file in errors:
  // INVALID_ARGUMENT with SentencePiece's reason when it does not parse.
  static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> FromSerializedProto(
      std::span<const uint8_t> bytes, const std::string& path);

  ~SentencePieceTokenizer() override;

  int vocab_size() const override { return static_cast<int>(pieces_.size()); }
  // -1 when the model defines no such token.
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }

  // The model's own encoding (normalizer, dummy prefix, byte fallback).
  // With options.parse_special the control pieces' spellings ("<s>", "</s>")
  // in the text give their ids and the text between is encoded on its own.
  using Tokenizer::Encode;
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                              const EncodeOptions& options) const override;

  // Unknown tokens give " \u2047 ", SentencePiece's own surface for them, so
  // that a lost character stays visible; control tokens give "", unused
  // tokens their piece text. Any `prev` is accepted; only prev == BOS
  // changes the result.
  absl::StatusOr<std::string> Decode(int32_t prev, int32_t id) const override;

  // The model's pieces, scores and types.
  SpmVocabulary vocabulary() const;

 private:
  explicit SentencePieceTokenizer(std::unique_ptr<sentencepiece::SentencePieceProcessor> sp);

  // Constant after construction.
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
  int32_t bos_id_;
  int32_t eos_id_;
  std::vector<std::string> pieces_;  // Decoded text of each id.
  std::vector<bool> is_normal_;      // Whether the BOS rule applies to the id.
  SpecialTokenMatcher control_tokens_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_TOKENIZER_SENTENCEPIECE_TOKENIZER_H_
