// Writes a SentencePiece-style vocabulary (Llama 2, TinyLlama) as a Hugging
// Face tokenizer.json + tokenizer_config.json, as transformers' LlamaConverter
// would produce it, so converted checkpoints carry the tokenizers-library
// format.
#ifndef TANDEM_COMMON_TOKENIZER_HF_TOKENIZER_WRITER_H_
#define TANDEM_COMMON_TOKENIZER_HF_TOKENIZER_WRITER_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tokenizer/spm_vocabulary.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem {

// The vocabulary of a SentencePieceTokenizer or Llama2cTokenizer (as from
// LoadTokenizer on a tokenizer.model or tokenizer.bin); INVALID_ARGUMENT for
// any other tokenizer.
absl::StatusOr<SpmVocabulary> SpmVocabularyOf(const Tokenizer& tokenizer);

// The tokenizer.json text for `vocab`: a BPE model with byte_fallback whose
// merges are derived from the scores as transformers' SpmConverter does (for
// each piece, every split into two pieces; ordered by the piece's score,
// highest first, then by the ids of the two halves; merges into control,
// unknown, byte or unused pieces are left out, as SentencePiece never makes
// them), the Prepend("▁") + Replace(" ", "▁") normalizer, a BOS
// TemplateProcessing and Llama 2's decoder. Control and unknown pieces are
// special added tokens. INVALID_ARGUMENT for a vocabulary without pieces or
// with a piece that is not valid UTF-8.
absl::StatusOr<std::string> HfTokenizerJson(const SpmVocabulary& vocab);

// The matching tokenizer_config.json text (add_bos_token, bos/eos/unk).
std::string HfTokenizerConfigJson(const SpmVocabulary& vocab);

// Writes tokenizer.json and tokenizer_config.json into folder `dir`, which
// must exist. Errors name the file that could not be written.
absl::Status WriteHfTokenizer(const SpmVocabulary& vocab, const std::string& dir);

}  // namespace tandem

#endif  // TANDEM_COMMON_TOKENIZER_HF_TOKENIZER_WRITER_H_
