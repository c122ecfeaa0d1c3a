// A SentencePiece-style vocabulary as plain data: what the SentencePiece and
// llama2.c loaders know about each piece, for writers such as the Hugging
// Face tokenizer.json writer.
#ifndef TANDEM_COMMON_TOKENIZER_SPM_VOCABULARY_H_
#define TANDEM_COMMON_TOKENIZER_SPM_VOCABULARY_H_

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

struct SpmVocabulary {
  // SentencePiece's piece types.
  enum class Type { kNormal, kUnknown, kControl, kUserDefined, kByte, kUnused };
  struct Piece {
    std::string text;  // SentencePiece spelling: U+2581 for space, <0xXX> for bytes.
    float score = 0;
    Type type = Type::kNormal;
  };

  std::vector<Piece> pieces;  // Indexed by id.
  int32_t unk_id = -1;        // -1 when absent.
  int32_t bos_id = -1;
  int32_t eos_id = -1;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_TOKENIZER_SPM_VOCABULARY_H_
