#include "common/model/tokenizer.h"

#include <span>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/mapped_file.h"
#include "common/base/status_macros.h"
#include "common/model/llama2c_tokenizer.h"
#include "common/model/sentencepiece_tokenizer.h"

namespace tandem {
namespace {

// A ModelProto starts with field 1 (a repeated SentencePiece message, tag
// 0x0A) and that message's non-zero length. A tokenizer.bin starts with its
// little-endian max_token_length, whose second byte is zero for any length
// below 256, so the two only overlap for odd files; those get both readers.
bool LooksLikeSentencePiece(std::span<const uint8_t> bytes) {
  return bytes.size() >= 2 && bytes[0] == 0x0A && bytes[1] != 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path) {
  ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  const std::span<const uint8_t> bytes = file.bytes();
  if (bytes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer file '", path, "' is empty"));
  }
  if (LooksLikeSentencePiece(bytes)) {
    auto sp = SentencePieceTokenizer::FromSerializedProto(bytes, path);
    if (sp.ok()) return std::unique_ptr<Tokenizer>(std::move(sp).value());
    auto bin = Llama2cTokenizer::FromBytes(bytes, path);
    if (bin.ok()) return std::unique_ptr<Tokenizer>(std::move(bin).value());
    return sp.status();
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Llama2cTokenizer> bin, Llama2cTokenizer::FromBytes(bytes, path));
  return std::unique_ptr<Tokenizer>(std::move(bin));
}

}  // namespace tandem
