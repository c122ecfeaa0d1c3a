#include "common/tokenizer/sentencepiece_tokenizer.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/base/status_macros.h"

// The header aliases absl::string_view to std::string_view, which clashes with
// Debian's Abseil, whose absl::string_view is its own class. Renaming the
// header's namespace keeps its declarations (and their mangled names, which
// spell std::string_view) while leaving absl alone.
#define absl sentencepiece_absl
#include "common/tokenizer/symbols.h"
#include "sentencepiece_processor.h"
#undef absl

namespace tandem {
namespace {

// SentencePiece's codes are numbered as absl's (both follow google.rpc.Code).
absl::Status ToAbsl(const sentencepiece::util::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(static_cast<int>(s.code())), s.message());
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(
    std::unique_ptr<sentencepiece::SentencePieceProcessor> sp)
    : processor_(std::move(sp)), bos_id_(processor_->bos_id()), eos_id_(processor_->eos_id()) {}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::FromSerializedProto(
    std::span<const uint8_t> bytes, const std::string& path) {
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const absl::Status loaded = ToAbsl(sp->LoadFromSerializedProto(
      std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size())));
  if (!loaded.ok()) {
    // SentencePiece reports a protobuf that does not parse by quoting its
    // own source; say what it means.
    const bool unparsable = absl::StrContains(loaded.message(), "ParseFromArray");
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer file '", path, "' is not a valid SentencePiece model: ",
        unparsable ? "the protobuf does not parse (truncated or corrupt file)" : loaded.message()));
  }
  const int n = sp->GetPieceSize();
  if (n <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer file '", path, "' is a SentencePiece model with no pieces"));
  }

  auto tok = std::unique_ptr<SentencePieceTokenizer>(new SentencePieceTokenizer(std::move(sp)));
  const sentencepiece::SentencePieceProcessor& proc = *tok->processor_;
  tok->pieces_.resize(n);
  tok->is_normal_.resize(n);
  std::vector<SpecialTokenMatcher::Token> controls;
  for (int id = 0; id < n; ++id) {
    const std::string& piece = proc.IdToPiece(id);
    if (proc.IsControl(id)) {
      controls.push_back({piece, id});
      continue;
    }
    if (proc.IsUnknown(id)) {
      tok->pieces_[id] = std::string(kUnknownSurface);
    } else if (proc.IsByte(id)) {
      const int hi = piece.size() == 6 ? HexDigit(piece[3]) : -1;
      const int lo = piece.size() == 6 ? HexDigit(piece[4]) : -1;
      if (hi < 0 || lo < 0) {
        return absl::InvalidArgumentError(absl::StrCat("tokenizer file '", path,
                                                       "' has byte token ", id, " spelled '", piece,
                                                       "' instead of <0xXX>"));
      }
      tok->pieces_[id] = std::string(1, static_cast<char>(hi * 16 + lo));
    } else {
      tok->pieces_[id] = absl::StrReplaceAll(piece, {{"\xE2\x96\x81", " "}});
      tok->is_normal_[id] = true;
    }
  }
  tok->control_tokens_ = SpecialTokenMatcher(std::move(controls));
  return tok;
}

absl::StatusOr<std::vector<int32_t>> SentencePieceTokenizer::Encode(
    std::string_view text, const EncodeOptions& options) const {
  std::vector<int32_t> out;
  if (options.add_bos && bos_id_ >= 0) out.push_back(bos_id_);
  std::vector<int> ids;
  const auto encode = [&](std::string_view part) -> absl::Status {
    if (part.empty()) return absl::OkStatus();
    if (absl::Status s = ToAbsl(processor_->Encode(part, &ids)); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("SentencePiece encode failed: ", s.message()));
    }
    out.insert(out.end(), ids.begin(), ids.end());
    return absl::OkStatus();
  };
  if (!options.parse_special) {
    RETURN_IF_ERROR(encode(text));
    return out;
  }
  for (size_t pos = 0;;) {
    const std::optional<SpecialTokenMatcher::Match> m = control_tokens_.Find(text, pos);
    RETURN_IF_ERROR(encode(text.substr(pos, (m.has_value() ? m->begin : text.size()) - pos)));
    if (!m.has_value()) return out;
    out.push_back(m->id);
    pos = m->end;
  }
}

SpmVocabulary SentencePieceTokenizer::vocabulary() const {
  const sentencepiece::SentencePieceProcessor& proc = *processor_;
  SpmVocabulary vocab;
  vocab.unk_id = proc.unk_id();
  vocab.bos_id = bos_id_;
  vocab.eos_id = eos_id_;
  vocab.pieces.resize(pieces_.size());
  for (int id = 0; id < static_cast<int>(pieces_.size()); ++id) {
    SpmVocabulary::Piece& piece = vocab.pieces[id];
    piece.text = proc.IdToPiece(id);
    piece.score = proc.GetScore(id);
    using Type = SpmVocabulary::Type;
    piece.type = proc.IsUnknown(id)   ? Type::kUnknown
                 : proc.IsControl(id) ? Type::kControl
                 : proc.IsByte(id)    ? Type::kByte
                 : proc.IsUnused(id)  ? Type::kUnused
                                      : Type::kNormal;
  }
  return vocab;
}

absl::StatusOr<std::string> SentencePieceTokenizer::Decode(int32_t prev, int32_t id) const {
  if (id < 0 || id >= vocab_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token id ", id, " is out of range [0, ", vocab_size(), ")"));
  }
  const std::string& piece = pieces_[id];
  if (prev == bos_id_ && bos_id_ >= 0 && is_normal_[id] && !piece.empty() && piece[0] == ' ') {
    return piece.substr(1);
  }
  return piece;
}

}  // namespace tandem
