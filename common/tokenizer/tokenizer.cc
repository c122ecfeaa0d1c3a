#include "common/tokenizer/tokenizer.h"

#include <filesystem>
#include <span>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/mapped_file.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/hf_tokenizer.h"
#include "common/tokenizer/llama2c_tokenizer.h"
#include "common/tokenizer/sentencepiece_tokenizer.h"

namespace tandem {
namespace {

// A ModelProto starts with field 1 (a repeated SentencePiece message, tag
// 0x0A) and that message's non-zero length. A tokenizer.bin starts with its
// little-endian max_token_length, whose second byte is zero for any length
// below 256, so the two only overlap for odd files; those get both readers.
bool LooksLikeSentencePiece(std::span<const uint8_t> bytes) {
  return bytes.size() >= 2 && bytes[0] == 0x0A && bytes[1] != 0;
}

// tokenizer.json is a JSON object: '{', then '"' or '}' after any
// whitespace. A tokenizer.bin starting with '{' (max_token_length 123) has a
// zero byte next.
bool LooksLikeJson(std::span<const uint8_t> bytes) {
  const auto is_space = [](uint8_t b) { return b == ' ' || b == '\t' || b == '\n' || b == '\r'; };
  size_t i = 0;
  while (i < bytes.size() && is_space(bytes[i])) ++i;
  if (i == bytes.size() || bytes[i] != '{') return false;
  ++i;
  while (i < bytes.size() && is_space(bytes[i])) ++i;
  return i < bytes.size() && (bytes[i] == '"' || bytes[i] == '}');
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    if (fs::exists(fs::path(path) / "tokenizer.json", ec)) {
      ASSIGN_OR_RETURN(std::unique_ptr<HfTokenizer> hf, HfTokenizer::Load(path));
      return std::unique_ptr<Tokenizer>(std::move(hf));
    }
    if (fs::exists(fs::path(path) / "tokenizer.model", ec)) {
      return LoadTokenizer((fs::path(path) / "tokenizer.model").string());
    }
    // A folder without a tokenizer is a wrong argument, not a missing file.
    return absl::InvalidArgumentError(
        absl::StrCat("'", path,
                     "' is a folder but not a model folder: it has neither tokenizer.json nor "
                     "tokenizer.model"));
  }
  ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  const std::span<const uint8_t> bytes = file.bytes();
  if (bytes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer file '", path, "' is empty"));
  }
  if (LooksLikeJson(bytes)) {
    ASSIGN_OR_RETURN(std::unique_ptr<HfTokenizer> hf, HfTokenizer::Load(path));
    return std::unique_ptr<Tokenizer>(std::move(hf));
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
