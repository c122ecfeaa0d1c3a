#include "common/tokenizer/hf_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/symbols.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using Json = nlohmann::json;

constexpr int64_t kMaxVocab = 1 << 24;

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// The byte of a byte-fallback token "<0xXX>", or -1.
int ByteTokenValue(std::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return -1;
  const int hi = HexDigit(token[3]);
  const int lo = HexDigit(token[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

absl::StatusOr<Json> ParseJson(const std::string& text, const std::string& path) {
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer file '", path, "' is not valid JSON: ", e.what()));
  }
}

// A token given as "text" or {"content": "text"} (tokenizer_config.json);
// empty for null or absent.
std::string TokenContent(const Json& json) {
  if (json.is_string()) return json.get<std::string>();
  if (json.is_object() && json.contains("content") && json["content"].is_string()) {
    return json["content"].get<std::string>();
  }
  return "";
}

}  // namespace

// Builds an HfTokenizer from parsed files; errors name the file and field.
class HfTokenizerLoader {
 public:
  explicit HfTokenizerLoader(const HfTokenizer::Files& files) : files_(files) {}

  absl::StatusOr<std::unique_ptr<HfTokenizer>> Load() {
    tok_ = std::unique_ptr<HfTokenizer>(new HfTokenizer());
    ASSIGN_OR_RETURN(const Json root, ParseJson(files_.tokenizer_json, files_.tokenizer_path));
    if (!root.is_object()) return Error("(root)", "not a JSON object");
    if (!root.contains("model") || !root["model"].is_object()) {
      return Error("model", "missing or not an object");
    }
    RETURN_IF_ERROR(
        Wrap(Normalizer::Parse(Get(root, "normalizer"), "normalizer"), &tok_->normalizer_));
    RETURN_IF_ERROR(Wrap(PreTokenizer::Parse(Get(root, "pre_tokenizer"), "pre_tokenizer"),
                         &tok_->pre_tokenizer_));
    RETURN_IF_ERROR(ParseDecoder(Get(root, "decoder"), "decoder"));
    tok_->byte_level_ = tok_->pre_tokenizer_.byte_level() || byte_level_decoder_;
    RETURN_IF_ERROR(ParseModel(root["model"]));
    RETURN_IF_ERROR(ParseAddedTokens(Get(root, "added_tokens")));
    BuildPieces();
    RETURN_IF_ERROR(ParsePostProcessor(Get(root, "post_processor"), "post_processor"));
    RETURN_IF_ERROR(ApplyConfigs());
    return std::move(tok_);
  }

 private:
  static const Json& Get(const Json& json, const char* key) {
    static const Json kNull;
    const auto it = json.find(key);
    return it == json.end() ? kNull : *it;
  }

  absl::Status Error(absl::string_view field, absl::string_view message,
                     const std::string* path = nullptr) const {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer file '",
                                                   path ? *path : files_.tokenizer_path,
                                                   "': field '", field, "': ", message));
  }

  // Moves a parsed part into place, prefixing a parse error with the file.
  template <typename T>
  absl::Status Wrap(absl::StatusOr<T> parsed, T* out) const {
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer file '", files_.tokenizer_path,
                                                     "': ", parsed.status().message()));
    }
    *out = std::move(parsed).value();
    return absl::OkStatus();
  }

  absl::Status ParseDecoder(const Json& json, const std::string& field) {
    if (json.is_null()) return absl::OkStatus();
    if (!json.is_object() || !json.contains("type") || !json["type"].is_string()) {
      return Error(field, "not an object with a string 'type'");
    }
    const std::string type = json["type"].get<std::string>();
    if (type == "Sequence") {
      const Json& decoders = Get(json, "decoders");
      if (!decoders.is_array()) return Error(field + ".decoders", "missing or not an array");
      for (size_t i = 0; i < decoders.size(); ++i) {
        RETURN_IF_ERROR(ParseDecoder(decoders[i], absl::StrCat(field, ".decoders[", i, "]")));
      }
    } else if (type == "ByteLevel") {
      byte_level_decoder_ = true;
    } else if (type == "ByteFallback") {
      byte_fallback_decoder_ = true;
    } else if (type == "Fuse") {
    } else if (type == "Strip") {
      const Json& start = Get(json, "start");
      if (start.is_number_integer() && start.get<int64_t>() > 0 &&
          TokenContent(Get(json, "content")) == " ") {
        tok_->strip_space_after_bos_ = true;
      }
    } else if (type == "Replace") {
      const Json& pattern = Get(json, "pattern");
      const Json& content = Get(json, "content");
      if (!pattern.is_object() || !Get(pattern, "String").is_string() || !content.is_string()) {
        return Error(field, "only Replace with a String pattern and a content is supported");
      }
      replacements_.emplace_back(pattern["String"].get<std::string>(), content.get<std::string>());
    } else if (type == "Metaspace") {
      const Json& replacement = Get(json, "replacement");
      if (!replacement.is_string()) return Error(field + ".replacement", "missing or not a string");
      replacements_.emplace_back(replacement.get<std::string>(), " ");
      const Json& scheme = Get(json, "prepend_scheme");
      const Json& add_prefix = Get(json, "add_prefix_space");
      const bool prepends = scheme.is_string() ? scheme.get<std::string>() != "never"
                                               : !add_prefix.is_boolean() || add_prefix.get<bool>();
      if (prepends) tok_->strip_space_after_bos_ = true;
    } else {
      return Error(field + ".type", absl::StrCat("unsupported decoder '", type, "'"));
    }
    return absl::OkStatus();
  }

  absl::Status ParseModel(const Json& model) {
    const Json& type = Get(model, "type");
    if (type.is_string() && type.get<std::string>() != "BPE") {
      return Error("model.type", absl::StrCat("unsupported model type '", type.get<std::string>(),
                                              "' (only BPE is supported)"));
    }
    if (!type.is_string() && !model.contains("merges")) {
      return Error("model.type", "missing (and no merges to infer BPE from)");
    }
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      const Json& v = Get(model, key);
      if (!v.is_null() && !(v.is_string() && v.get<std::string>().empty())) {
        return Error(absl::StrCat("model.", key), "is set; only null is supported");
      }
    }
    const Json& vocab = Get(model, "vocab");
    if (!vocab.is_object()) return Error("model.vocab", "missing or not an object");

    absl::flat_hash_map<std::string, int32_t> bpe_vocab;
    bpe_vocab.reserve(vocab.size());
    byte_fallback_ids_.fill(-1);
    for (const auto& [token, id_json] : vocab.items()) {
      if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0 ||
          id_json.get<int64_t>() >= kMaxVocab) {
        return Error(absl::StrCat("model.vocab[\"", token, "\"]"),
                     absl::StrCat("id must be an integer in [0, ", kMaxVocab, ")"));
      }
      const int32_t id = static_cast<int32_t>(id_json.get<int64_t>());
      model_tokens_.emplace_back(token, id);
      token_ids_.try_emplace(token, id);
      if (const int b = ByteTokenValue(token); b >= 0) byte_fallback_ids_[b] = id;
      if (tok_->byte_level_) {
        std::optional<std::string> bytes = ByteLevelToBytes(token);
        if (bytes.has_value()) bpe_vocab.try_emplace(*std::move(bytes), id);
      } else {
        bpe_vocab.try_emplace(token, id);
      }
    }

    BpeModel::Options options;
    options.byte_level = tok_->byte_level_;
    options.byte_fallback =
        Get(model, "byte_fallback").is_boolean() && model["byte_fallback"].get<bool>();
    options.ignore_merges =
        Get(model, "ignore_merges").is_boolean() && model["ignore_merges"].get<bool>();
    options.fuse_unk = Get(model, "fuse_unk").is_boolean() && model["fuse_unk"].get<bool>();
    const std::string unk = TokenContent(Get(model, "unk_token"));
    if (!unk.empty()) {
      const auto it = token_ids_.find(unk);
      if (it == token_ids_.end()) {
        return Error("model.unk_token", absl::StrCat("'", unk, "' is not in the vocab"));
      }
      options.unk_id = unk_id_ = it->second;
    }
    tok_->model_ = std::make_unique<BpeModel>(options, std::move(bpe_vocab));
    if (options.byte_fallback) {
      for (int b = 0; b < 256; ++b) {
        if (byte_fallback_ids_[b] >= 0) tok_->model_->SetByteFallbackId(b, byte_fallback_ids_[b]);
      }
    }

    const Json& merges = Get(model, "merges");
    if (!merges.is_array()) return Error("model.merges", "missing or not an array");
    for (size_t i = 0; i < merges.size(); ++i) {
      const Json& m = merges[i];
      std::string left, right;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
          return Error(absl::StrCat("model.merges[", i, "]"),
                       absl::StrCat("'", s, "' is not two tokens separated by one space"));
        }
        left = s.substr(0, space);
        right = s.substr(space + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        left = m[0].get<std::string>();
        right = m[1].get<std::string>();
      } else {
        return Error(absl::StrCat("model.merges[", i, "]"),
                     "neither a \"a b\" string nor a pair of strings");
      }
      if (tok_->byte_level_) {
        std::optional<std::string> l = ByteLevelToBytes(left);
        std::optional<std::string> r = ByteLevelToBytes(right);
        if (!l.has_value() || !r.has_value()) {
          return Error(absl::StrCat("model.merges[", i, "]"),
                       "a side has characters outside the byte-level alphabet");
        }
        left = *std::move(l);
        right = *std::move(r);
      }
      if (absl::Status s = tok_->model_->AddMerge(left, right, static_cast<int32_t>(i)); !s.ok()) {
        return Error(absl::StrCat("model.merges[", i, "]"), s.message());
      }
    }
    return absl::OkStatus();
  }

  absl::Status ParseAddedTokens(const Json& added) {
    if (added.is_null()) return absl::OkStatus();
    if (!added.is_array()) return Error("added_tokens", "not an array");
    std::vector<SpecialTokenMatcher::Token> all, plain;
    for (size_t i = 0; i < added.size(); ++i) {
      const Json& t = added[i];
      const std::string field = absl::StrCat("added_tokens[", i, "]");
      if (!t.is_object() || !Get(t, "content").is_string() || !Get(t, "id").is_number_integer() ||
          t["id"].get<int64_t>() < 0 || t["id"].get<int64_t>() >= kMaxVocab) {
        return Error(field, "needs a string 'content' and an integer 'id' in range");
      }
      SpecialTokenMatcher::Token token;
      token.content = t["content"].get<std::string>();
      token.id = static_cast<int32_t>(t["id"].get<int64_t>());
      token.lstrip = Get(t, "lstrip").is_boolean() && t["lstrip"].get<bool>();
      token.rstrip = Get(t, "rstrip").is_boolean() && t["rstrip"].get<bool>();
      const bool special = Get(t, "special").is_boolean() && t["special"].get<bool>();
      token_ids_[token.content] = token.id;
      added_.push_back({token.content, token.id, special});
      if (!special) plain.push_back(token);
      all.push_back(std::move(token));
    }
    tok_->all_added_ = SpecialTokenMatcher(std::move(all));
    tok_->plain_added_ = SpecialTokenMatcher(std::move(plain));
    return absl::OkStatus();
  }

  // The decoded bytes of every id.
  void BuildPieces() {
    int32_t size = 0;
    for (const auto& [token, id] : model_tokens_) size = std::max(size, id + 1);
    for (const AddedToken& a : added_) size = std::max(size, a.id + 1);
    tok_->pieces_.assign(size, "");
    tok_->is_normal_.assign(size, false);
    for (const auto& [token, id] : model_tokens_) {
      std::string& piece = tok_->pieces_[id];
      bool normal = true;
      if (id == unk_id_) {
        piece = std::string(kUnknownSurface);
        normal = false;
      } else if (byte_level_decoder_) {
        std::optional<std::string> bytes = ByteLevelToBytes(token);
        piece = bytes.has_value() ? *std::move(bytes) : token;
      } else if (const int b = ByteTokenValue(token); b >= 0 && byte_fallback_decoder_) {
        piece = std::string(1, static_cast<char>(b));
        normal = false;
      } else {
        piece = token;
        for (const auto& [from, to] : replacements_) {
          for (size_t pos = 0; (pos = piece.find(from, pos)) != std::string::npos;
               pos += to.size()) {
            piece.replace(pos, from.size(), to);
          }
        }
      }
      tok_->is_normal_[id] = normal;
    }
    for (const AddedToken& a : added_) {
      tok_->pieces_[a.id] = a.special ? "" : a.content;
      tok_->is_normal_[a.id] = false;
    }
  }

  absl::Status ParsePostProcessor(const Json& json, const std::string& field) {
    if (json.is_null()) return absl::OkStatus();
    const std::string type = Get(json, "type").is_string() ? json["type"].get<std::string>() : "";
    if (type == "Sequence") {
      const Json& processors = Get(json, "processors");
      if (!processors.is_array()) return Error(field + ".processors", "missing or not an array");
      for (size_t i = 0; i < processors.size(); ++i) {
        RETURN_IF_ERROR(
            ParsePostProcessor(processors[i], absl::StrCat(field, ".processors[", i, "]")));
      }
      return absl::OkStatus();
    }
    if (type == "ByteLevel") return absl::OkStatus();
    if (type != "TemplateProcessing") {
      return Error(field + ".type", absl::StrCat("unsupported post-processor '", type, "'"));
    }
    const Json& single = Get(json, "single");
    const Json& specials = Get(json, "special_tokens");
    if (!single.is_array()) return Error(field + ".single", "missing or not an array");
    bool after_sequence = false;
    template_prefix_.clear();
    template_suffix_.clear();
    for (size_t i = 0; i < single.size(); ++i) {
      const std::string item_field = absl::StrCat(field, ".single[", i, "]");
      if (single[i].contains("Sequence")) {
        after_sequence = true;
        continue;
      }
      const std::string name = TokenContent(Get(Get(single[i], "SpecialToken"), "id"));
      if (name.empty())
        return Error(item_field, "neither a Sequence nor a SpecialToken with an id");
      const Json& ids = Get(Get(specials, name.c_str()), "ids");
      if (!ids.is_array()) {
        return Error(absl::StrCat(field, ".special_tokens[\"", name, "\"].ids"),
                     "missing or not an array");
      }
      for (const Json& id : ids) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
            id.get<int64_t>() >= static_cast<int64_t>(tok_->pieces_.size())) {
          return Error(absl::StrCat(field, ".special_tokens[\"", name, "\"].ids"),
                       "an id is not a token of the vocabulary");
        }
        (after_sequence ? template_suffix_ : template_prefix_)
            .push_back(static_cast<int32_t>(id.get<int64_t>()));
      }
    }
    return absl::OkStatus();
  }

  // BOS/EOS from tokenizer_config.json and generation_config.json.
  absl::Status ApplyConfigs() {
    Json config = Json::object();
    if (!files_.config_path.empty()) {
      ASSIGN_OR_RETURN(config, ParseJson(files_.config_json, files_.config_path));
      if (!config.is_object()) return Error("(root)", "not a JSON object", &files_.config_path);
    }
    const auto resolve = [&](const char* key, int32_t* id) -> absl::Status {
      const std::string content = TokenContent(Get(config, key));
      if (content.empty()) return absl::OkStatus();
      const auto it = token_ids_.find(content);
      if (it == token_ids_.end()) {
        return Error(key, absl::StrCat("'", content, "' is not a token of ", files_.tokenizer_path),
                     &files_.config_path);
      }
      *id = it->second;
      return absl::OkStatus();
    };
    int32_t bos = -1, eos = -1;
    RETURN_IF_ERROR(resolve("bos_token", &bos));
    RETURN_IF_ERROR(resolve("eos_token", &eos));
    if (bos < 0 && !template_prefix_.empty()) bos = template_prefix_[0];
    tok_->bos_id_ = bos;

    tok_->prefix_ids_ = template_prefix_;
    tok_->suffix_ids_ = template_suffix_;
    const auto apply_flag = [&](const char* key, int32_t id, std::vector<int32_t>* ids) {
      const Json& flag = Get(config, key);
      if (!flag.is_boolean() || id < 0) return;
      std::erase(*ids, id);
      if (flag.get<bool>()) {
        if (ids == &tok_->prefix_ids_) {
          ids->insert(ids->begin(), id);
        } else {
          ids->push_back(id);
        }
      }
    };
    apply_flag("add_bos_token", bos, &tok_->prefix_ids_);
    apply_flag("add_eos_token", eos, &tok_->suffix_ids_);

    std::vector<int32_t>& eos_ids = tok_->eos_ids_;
    const auto add_eos = [&eos_ids](int64_t id) {
      if (std::find(eos_ids.begin(), eos_ids.end(), id) == eos_ids.end()) {
        eos_ids.push_back(static_cast<int32_t>(id));
      }
    };
    if (eos >= 0) add_eos(eos);
    if (!files_.generation_config_path.empty()) {
      ASSIGN_OR_RETURN(const Json gen,
                       ParseJson(files_.generation_config_json, files_.generation_config_path));
      const Json& ids = gen.is_object() ? Get(gen, "eos_token_id") : Json();
      for (const Json& id : ids.is_array() ? ids : Json::array({ids})) {
        if (id.is_null()) continue;
        if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
            id.get<int64_t>() >= static_cast<int64_t>(tok_->pieces_.size())) {
          return Error("eos_token_id", "not a token id of the vocabulary",
                       &files_.generation_config_path);
        }
        add_eos(id.get<int64_t>());
      }
    }
    if (eos_ids.empty()) {
      for (const char* name :
           {"</s>", "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>", "<|endoftext|>", "<|im_end|>"}) {
        for (const AddedToken& a : added_) {
          if (a.special && a.content == name) add_eos(a.id);
        }
      }
    }
    return absl::OkStatus();
  }

  struct AddedToken {
    std::string content;
    int32_t id;
    bool special;
  };

  const HfTokenizer::Files& files_;
  std::unique_ptr<HfTokenizer> tok_;
  bool byte_level_decoder_ = false;
  bool byte_fallback_decoder_ = false;
  std::vector<std::pair<std::string, std::string>> replacements_;  // Decoder Replace/Metaspace.
  std::vector<std::pair<std::string, int32_t>> model_tokens_;      // As written in the vocab.
  absl::flat_hash_map<std::string, int32_t> token_ids_;            // Vocab and added tokens.
  std::vector<AddedToken> added_;
  std::array<int32_t, 256> byte_fallback_ids_;
  int32_t unk_id_ = -1;
  std::vector<int32_t> template_prefix_;
  std::vector<int32_t> template_suffix_;
};

struct HfTokenizer::Scratch {
  std::string normalized;
  Words words;
  BpeModel::Scratch bpe;
};

HfTokenizer::HfTokenizer() = default;
HfTokenizer::~HfTokenizer() = default;

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::FromFiles(const Files& files) {
  return HfTokenizerLoader(files).Load();
}

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::Load(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  Files files;
  fs::path dir;
  if (fs::is_directory(path, ec)) {
    dir = path;
    files.tokenizer_path = (dir / "tokenizer.json").string();
  } else {
    files.tokenizer_path = path;
    dir = fs::path(path).parent_path();
  }
  ASSIGN_OR_RETURN(files.tokenizer_json, ReadWholeFile(files.tokenizer_path));
  const auto read_optional = [&](const char* name, std::string* file_path,
                                 std::string* contents) -> absl::Status {
    const fs::path p = dir / name;
    if (!fs::exists(p, ec)) return absl::OkStatus();
    *file_path = p.string();
    ASSIGN_OR_RETURN(*contents, ReadWholeFile(*file_path));
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(read_optional("tokenizer_config.json", &files.config_path, &files.config_json));
  RETURN_IF_ERROR(read_optional("generation_config.json", &files.generation_config_path,
                                &files.generation_config_json));
  return FromFiles(files);
}

absl::StatusOr<std::vector<int32_t>> HfTokenizer::Encode(std::string_view text,
                                                         const EncodeOptions& options) const {
  std::string sanitized;
  if (!IsValidUtf8(text)) {
    sanitized = SanitizeUtf8(text);
    text = sanitized;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + prefix_ids_.size() + suffix_ids_.size() + 1);
  if (options.add_bos) ids.insert(ids.end(), prefix_ids_.begin(), prefix_ids_.end());
  const SpecialTokenMatcher& added = options.parse_special ? all_added_ : plain_added_;
  Scratch scratch;
  for (size_t pos = 0;;) {
    const std::optional<SpecialTokenMatcher::Match> m = added.Find(text, pos);
    const size_t end = m.has_value() ? m->begin : text.size();
    EncodeSegment(text.substr(pos, end - pos), pos == 0, &scratch, &ids);
    if (!m.has_value()) break;
    ids.push_back(m->id);
    pos = m->end;
  }
  if (options.add_bos) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

void HfTokenizer::EncodeSegment(std::string_view segment, bool at_text_start, Scratch* scratch,
                                std::vector<int32_t>* ids) const {
  if (segment.empty()) return;
  if (!normalizer_.empty()) {
    scratch->normalized.assign(segment.data(), segment.size());
    normalizer_.Apply(&scratch->normalized);
    segment = scratch->normalized;
  }
  pre_tokenizer_.Split(segment, at_text_start, &scratch->words);
  const std::string_view text = scratch->words.text;
  for (const auto& [begin, end] : scratch->words.ranges) {
    model_->EncodeWord(text.substr(begin, end - begin), &scratch->bpe, ids);
  }
}

absl::StatusOr<std::string> HfTokenizer::Decode(int32_t prev, int32_t id) const {
  if (id < 0 || id >= vocab_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token id ", id, " is out of range [0, ", vocab_size(), ")"));
  }
  const std::string& piece = pieces_[id];
  if (strip_space_after_bos_ && prev == bos_id_ && bos_id_ >= 0 && is_normal_[id] &&
      !piece.empty() && piece[0] == ' ') {
    return piece.substr(1);
  }
  return piece;
}

}  // namespace tandem
