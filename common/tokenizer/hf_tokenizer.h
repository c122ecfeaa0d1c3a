// Hugging Face tokenizers-library vocabularies (tokenizer.json) with a BPE
// model: byte-level BPE (Llama 3, Qwen 2.5, SmolLM) and SentencePiece-style
// BPE with byte fallback (Llama 2, TinyLlama, Mistral), plus the BOS/EOS
// rules of tokenizer_config.json and generation_config.json.
#ifndef TANDEM_COMMON_TOKENIZER_HF_TOKENIZER_H_
#define TANDEM_COMMON_TOKENIZER_HF_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/bpe.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/special_tokens.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem {

// Immutable after loading; safe to use from many threads.
//
// Encode follows the library: added tokens are cut out of the text first,
// then each remaining segment is normalized, pre-tokenized into words and
// each word BPE-encoded by merge rank (a word that is itself a token is taken
// whole under ignore_merges). Special added tokens are cut out only with
// EncodeOptions::parse_special, so plain text never yields them; non-special
// added tokens are always cut out, as the library does. Malformed UTF-8
// bytes are read as U+FFFD.
//
// Not supported (loading fails naming the field): models other than BPE,
// normalizers other than Sequence/Prepend/Replace(String)/NFC (NFC is taken
// as the identity, so text should arrive NFC-normalized), pre-tokenizers
// other than Sequence/Split/ByteLevel/Metaspace/Digits, post-processors other
// than TemplateProcessing/ByteLevel/Sequence, continuing_subword_prefix and
// end_of_word_suffix. Added tokens' single_word and normalized flags are
// ignored (matched as written, on the raw text); dropout is ignored.
class HfTokenizer final : public Tokenizer {
 public:
  // File contents; an empty path means the file is absent.
  struct Files {
    std::string tokenizer_path = "";  // tokenizer.json
    std::string tokenizer_json = "";
    std::string config_path = "";  // tokenizer_config.json
    std::string config_json = "";
    std::string generation_config_path = "";  // generation_config.json
    std::string generation_config_json = "";
  };

  // Parses the files. INVALID_ARGUMENT naming the file and the field for
  // JSON that does not parse, a missing or unsupported model, a merge naming
  // an unknown token, a pattern PCRE2 rejects, or a bos/eos token that is
  // not in the vocabulary.
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> FromFiles(const Files& files);

  // Reads a model folder's tokenizer.json (NOT_FOUND when absent) or the
  // tokenizer.json at `path`, with tokenizer_config.json and
  // generation_config.json from the same folder when they exist.
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> Load(const std::string& path);

  ~HfTokenizer() override;

  int vocab_size() const override { return static_cast<int>(pieces_.size()); }
  // The config's bos_token, else the first token the post-processor puts
  // before the text, else -1 (Qwen).
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_ids_.empty() ? -1 : eos_ids_[0]; }
  // The config's eos_token, then generation_config.json's eos_token_id(s).
  // Without either, the special tokens among </s>, <|end_of_text|>,
  // <|eot_id|>, <|eom_id|>, <|endoftext|>, <|im_end|>.
  std::vector<int32_t> eos_ids() const override { return eos_ids_; }

  // add_bos adds what the post-processor puts around the text
  // (TemplateProcessing's special tokens, e.g. Llama 3's <|begin_of_text|>),
  // overridden by tokenizer_config.json's add_bos_token / add_eos_token when
  // present. Never fails.
  using Tokenizer::Encode;
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                              const EncodeOptions& options) const override;

  // Byte-level tokens give the bytes their characters stand for; otherwise
  // the decoder's rules apply (U+2581 -> ' ', <0xXX> -> the byte), and when
  // the decoder strips the leading space (Strip, Metaspace) a normal token
  // right after BOS loses its leading space. Special tokens give "", unk
  // gives " \u2047 ", non-special added tokens their content.
  absl::StatusOr<std::string> Decode(int32_t prev, int32_t id) const override;

  // Whether the model is byte-level BPE.
  bool byte_level() const { return byte_level_; }

 private:
  struct Scratch;
  HfTokenizer();
  void EncodeSegment(std::string_view segment, bool at_text_start, Scratch* scratch,
                     std::vector<int32_t>* ids) const;

  // Constant after construction.
  bool byte_level_ = false;
  std::unique_ptr<BpeModel> model_;
  Normalizer normalizer_;
  PreTokenizer pre_tokenizer_;
  SpecialTokenMatcher all_added_;    // Every added token (parse_special).
  SpecialTokenMatcher plain_added_;  // Non-special added tokens only.
  std::vector<int32_t> prefix_ids_;  // Added around the text by add_bos.
  std::vector<int32_t> suffix_ids_;
  int32_t bos_id_ = -1;
  std::vector<int32_t> eos_ids_;
  std::vector<std::string> pieces_;  // Decoded bytes of each id.
  std::vector<bool> is_normal_;      // Model tokens other than byte fallback / unk.
  bool strip_space_after_bos_ = false;

  friend class HfTokenizerLoader;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_TOKENIZER_HF_TOKENIZER_H_
