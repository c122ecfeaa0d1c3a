// The llama2.c `tokenizer.bin` vocabulary: int32 max_token_length, then one
// record {float score, int32 len, len bytes} per token until the end of the
// file. It is a SentencePiece BPE vocabulary exported with U+2581 already
// replaced by ' ', ids 0..2 <unk>/<s>/</s> and ids 3..258 the byte tokens
// <0x00>..<0xFF>.
#ifndef TANDEM_COMMON_TOKENIZER_LLAMA2C_TOKENIZER_H_
#define TANDEM_COMMON_TOKENIZER_LLAMA2C_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/tokenizer/special_tokens.h"
#include "common/tokenizer/spm_vocabulary.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem {

// Immutable after construction; safe to use from many threads.
class Llama2cTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kUnkId = 0;
  static constexpr int32_t kBosId = 1;
  static constexpr int32_t kEosId = 2;
  static constexpr int32_t kFirstByteId = 3;  // <0x00>; <0xFF> is 258.

  // Parses the contents of a tokenizer.bin. `path` only names the file in
  // errors: INVALID_ARGUMENT for a truncated file, a negative or oversized
  // record length, no tokens, or byte tokens missing from ids 3..258.
  static absl::StatusOr<std::unique_ptr<Llama2cTokenizer>> FromBytes(std::span<const uint8_t> bytes,
                                                                     const std::string& path);

  int vocab_size() const override { return static_cast<int>(pieces_.size()); }
  int32_t bos_id() const override { return kBosId; }
  int32_t eos_id() const override { return kEosId; }

  // SentencePiece BPE: the text (with a leading space) is split into UTF-8
  // characters, then the adjacent pair whose concatenation is a piece with
  // the highest score (leftmost on ties) is merged until no pair is a piece;
  // what is not a piece in the end falls back to byte tokens. As in
  // SentencePiece's normalizer, each malformed UTF-8 byte becomes U+FFFD and
  // U+2581 in the text is read as a space.
  // Special and byte tokens never come out of a merge, so text such as "<s>"
  // or "<0x41>" is encoded as plain text, unless options.parse_special lets
  // "<s>" and "</s>" stand for BOS and EOS. Never fails; O(n log n).
  //
  // llama2.c itself replaces characters missing from the vocabulary by bytes
  // before merging; that gives the same ids whenever every character of
  // every piece is a piece itself, which holds for the Llama vocabularies.
  using Tokenizer::Encode;
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                              const EncodeOptions& options) const override;

  // <unk> gives " \u2047 " (SentencePiece's surface for it), <s> and </s>
  // give "". Any `prev` is accepted; only prev == BOS changes the result.
  absl::StatusOr<std::string> Decode(int32_t prev, int32_t id) const override;

  // The vocabulary in SentencePiece spelling: U+2581 for spaces, <0xXX> byte
  // pieces, <unk>/<s>/</s> for ids 0..2.
  SpmVocabulary vocabulary() const;

 private:
  Llama2cTokenizer() = default;

  // Appends the ids of `text` (no special tokens) to `ids`.
  void EncodePlain(std::string_view text, std::vector<int32_t>* ids) const;

  // Id of the mergeable (normal) piece `text`, or -1.
  int32_t FindPiece(std::string_view text) const;

  // Constant after construction.
  std::vector<std::string> pieces_;  // Decoded text of each id.
  std::vector<float> scores_;
  absl::flat_hash_map<std::string, int32_t> piece_ids_;  // Normal pieces only.
  // No piece has a space after a non-space byte, so no merge crosses the
  // start of a word (true of SentencePiece vocabularies trained with
  // split_by_whitespace, the default).
  bool split_at_word_starts_ = false;
  SpecialTokenMatcher control_tokens_;  // "<s>" and "</s>".
};

}  // namespace tandem

#endif  // TANDEM_COMMON_TOKENIZER_LLAMA2C_TOKENIZER_H_
