#include "common/chat/internal/lexer.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/chat/internal/py_string.h"

namespace tandem::jinja {
namespace {

bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

// Jinja2 strips with Python's str.rstrip() and \s, i.e. Unicode whitespace.
std::string RStripAll(absl::string_view s) {
  return PyStrip(s, std::nullopt, /*left=*/false, /*right=*/true);
}
// Length of the run of whitespace (Python \s) starting at `pos`.
size_t WhitespaceRun(absl::string_view s, size_t pos) {
  const std::u32string tail = DecodeUtf8(s.substr(pos, std::min<size_t>(s.size() - pos, 4096)));
  size_t bytes = 0;
  for (char32_t c : tail) {
    if (!IsPySpace(c)) break;
    std::string enc;
    AppendUtf8(c, &enc);
    bytes += enc.size();
  }
  // Whitespace runs over 4 KiB are rare; continue in chunks.
  if (bytes > 0 && pos + bytes < s.size() && bytes >= 4000) {
    return bytes + WhitespaceRun(s, pos + bytes);
  }
  return bytes;
}

bool IsAllWhitespace(absl::string_view s) {
  if (s.empty()) return false;
  for (char32_t c : DecodeUtf8(s)) {
    if (!IsPySpace(c)) return false;
  }
  return true;
}

class Lexer {
 public:
  explicit Lexer(absl::string_view source) {
    // Newlines normalised to \n; one trailing newline dropped
    // (keep_trailing_newline=False).
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_.push_back('\n');
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_.push_back(source[i]);
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  absl::StatusOr<std::vector<Token>> Run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      size_t tag = FindTagStart(pos);
      if (tag == std::string::npos) {
        Emit(Token::Type::kText, src_.substr(pos), pos);
        break;
      }
      const char kind = src_[tag + 1];
      char sign = 0;
      size_t after = tag + 2;
      if (after < src_.size() && (src_[after] == '-' || src_[after] == '+')) {
        sign = src_[after];
        ++after;
      }
      std::string text = src_.substr(pos, tag - pos);
      if (sign == '-') {
        text = RStripAll(text);
      } else if (sign != '+' && kind != '{') {
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) &&
            IsAllWhitespace(absl::string_view(text).substr(l_pos))) {
          text.resize(l_pos);
        }
      }
      if (!text.empty()) Emit(Token::Type::kText, std::move(text), pos);
      if (kind == '#') {
        absl::StatusOr<size_t> end = SkipComment(after, tag);
        if (!end.ok()) return end.status();
        pos = *end;
      } else if (kind == '%' && IsRawBegin(after)) {
        absl::StatusOr<size_t> end = LexRaw(tag);
        if (!end.ok()) return end.status();
        pos = *end;
      } else {
        absl::StatusOr<size_t> end = LexTag(kind == '%', after, tag);
        if (!end.ok()) return end.status();
        pos = *end;
      }
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    Emit(Token::Type::kEof, "", src_.size());
    return std::move(tokens_);
  }

 private:
  int LineAt(size_t pos) {
    // Incremental: positions only grow between calls.
    if (pos < line_pos_) {
      line_pos_ = 0;
      line_ = 1;
    }
    for (; line_pos_ < pos && line_pos_ < src_.size(); ++line_pos_) {
      if (src_[line_pos_] == '\n') ++line_;
    }
    return line_;
  }

  void Emit(Token::Type type, std::string text, size_t pos) {
    Token t;
    t.type = type;
    t.text = std::move(text);
    t.line = LineAt(pos);
    tokens_.push_back(std::move(t));
  }

  absl::Status Error(size_t pos, absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("template syntax error, line ", LineAt(pos), ": ", what));
  }

  size_t FindTagStart(size_t pos) const {
    while (true) {
      const size_t p = src_.find('{', pos);
      if (p == std::string::npos || p + 1 >= src_.size()) return std::string::npos;
      const char c = src_[p + 1];
      if (c == '{' || c == '%' || c == '#') return p;
      pos = p + 1;
    }
  }

  // Consumes a tag end at `pos` when there is one: "-END" and any whitespace
  // after it, "+END", or "END" and (for blocks and comments) one newline.
  bool MatchEnd(size_t pos, absl::string_view end, bool trim_newline, size_t* next) {
    if (src_.compare(pos, 1 + end.size(), absl::StrCat("-", end)) == 0) {
      *next = pos + 1 + end.size();
      *next += WhitespaceRun(src_, *next);
      return true;
    }
    if (trim_newline && src_.compare(pos, 1 + end.size(), absl::StrCat("+", end)) == 0) {
      *next = pos + 1 + end.size();
      return true;
    }
    if (src_.compare(pos, end.size(), std::string(end)) == 0) {
      *next = pos + end.size();
      if (trim_newline && *next < src_.size() && src_[*next] == '\n') ++*next;
      return true;
    }
    return false;
  }

  absl::StatusOr<size_t> SkipComment(size_t pos, size_t tag) {
    for (size_t i = pos; i < src_.size(); ++i) {
      size_t next;
      if ((src_[i] == '#' || src_[i] == '-' || src_[i] == '+') && MatchEnd(i, "#}", true, &next)) {
        return next;
      }
    }
    return Error(tag, "missing end of comment tag");
  }

  bool IsRawBegin(size_t pos) const {
    while (pos < src_.size() && IsAsciiSpace(src_[pos])) ++pos;
    if (src_.compare(pos, 3, "raw") != 0) return false;
    pos += 3;
    if (pos < src_.size() && IsNameChar(src_[pos])) return false;
    while (pos < src_.size() && IsAsciiSpace(src_[pos])) ++pos;
    return src_.compare(pos, 2, "%}") == 0 || src_.compare(pos, 3, "-%}") == 0;
  }

  // {% raw %} ... {% endraw %}: the content is text. No newline is trimmed
  // after the raw tag itself (as in Jinja2).
  absl::StatusOr<size_t> LexRaw(size_t tag) {
    size_t pos = src_.find("%}", tag) + 2;
    if (src_[pos - 3] == '-') pos += WhitespaceRun(src_, pos);
    size_t search = pos;
    while (true) {
      const size_t p = src_.find("{%", search);
      if (p == std::string::npos) return Error(tag, "missing end of raw directive");
      size_t q = p + 2;
      char sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      while (q < src_.size() && IsAsciiSpace(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) {
        search = p + 2;
        continue;
      }
      q += 6;
      while (q < src_.size() && IsAsciiSpace(src_[q])) ++q;
      size_t next;
      if (!MatchEnd(q, "%}", true, &next)) {
        search = p + 2;
        continue;
      }
      std::string text = src_.substr(pos, p - pos);
      if (sign == '-') {
        text = RStripAll(text);
      } else if (sign != '+') {
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        const bool line_starting = pos > 0 && src_[pos - 1] == '\n';
        if ((l_pos > 0 || line_starting) &&
            IsAllWhitespace(absl::string_view(text).substr(l_pos))) {
          text.resize(l_pos);
        }
      }
      if (!text.empty()) Emit(Token::Type::kText, std::move(text), pos);
      return next;
    }
  }

  absl::StatusOr<size_t> LexTag(bool block, size_t pos, size_t tag) {
    Emit(block ? Token::Type::kBlockBegin : Token::Type::kVarBegin, "", tag);
    std::vector<char> brackets;
    while (true) {
      while (pos < src_.size() && IsAsciiSpace(src_[pos])) ++pos;
      if (pos >= src_.size()) {
        return Error(tag, block ? "unexpected end of template, unclosed '{%' tag"
                                : "unexpected end of template, unclosed '{{' tag");
      }
      size_t next;
      if (brackets.empty() && MatchEnd(pos, block ? "%}" : "}}", block, &next)) {
        Emit(block ? Token::Type::kBlockEnd : Token::Type::kVarEnd, "", pos);
        return next;
      }
      const char c = src_[pos];
      if (IsNameStart(c)) {
        size_t e = pos;
        while (e < src_.size() && IsNameChar(src_[e])) ++e;
        Emit(Token::Type::kName, src_.substr(pos, e - pos), pos);
        pos = e;
      } else if (IsDigit(c)) {
        absl::StatusOr<size_t> e = LexNumber(pos);
        if (!e.ok()) return e.status();
        pos = *e;
      } else if (c == '\'' || c == '"') {
        absl::StatusOr<size_t> e = LexString(pos);
        if (!e.ok()) return e.status();
        pos = *e;
      } else {
        static constexpr absl::string_view kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
        std::string op;
        for (absl::string_view t : kTwo) {
          if (src_.compare(pos, 2, std::string(t)) == 0) op = std::string(t);
        }
        if (op.empty()) {
          if (absl::string_view("+-/*%~[](){}><=.:|,;").find(c) == absl::string_view::npos) {
            return Error(pos, absl::StrCat("unexpected char '", std::string(1, c), "'"));
          }
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") {
          if (brackets.size() >= 1000) return Error(pos, "brackets nested too deeply");
          brackets.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
        } else if (op == ")" || op == "]" || op == "}") {
          if (brackets.empty()) return Error(pos, absl::StrCat("unexpected '", op, "'"));
          if (brackets.back() != op[0]) {
            return Error(pos, absl::StrCat("unexpected '", op, "', expected '",
                                           std::string(1, brackets.back()), "'"));
          }
          brackets.pop_back();
        }
        Emit(Token::Type::kOperator, op, pos);
        pos += op.size();
      }
    }
  }

  absl::StatusOr<size_t> LexNumber(size_t pos) {
    auto digits = [&](size_t p) {
      while (p < src_.size() && (IsDigit(src_[p]) ||
                                 (src_[p] == '_' && p + 1 < src_.size() && IsDigit(src_[p + 1])))) {
        ++p;
      }
      return p;
    };
    size_t e = digits(pos);
    bool is_float = false;
    const bool after_dot = !tokens_.empty() && tokens_.back().type == Token::Type::kOperator &&
                           tokens_.back().text == ".";
    if (!after_dot) {
      if (e + 1 < src_.size() && src_[e] == '.' && IsDigit(src_[e + 1])) {
        e = digits(e + 1);
        is_float = true;
      }
      if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
        size_t x = e + 1;
        if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
        if (x < src_.size() && IsDigit(src_[x])) {
          e = digits(x);
          is_float = true;
        }
      }
    }
    std::string text;
    for (size_t i = pos; i < e; ++i) {
      if (src_[i] != '_') text.push_back(src_[i]);
    }
    Token t;
    t.line = LineAt(pos);
    if (is_float) {
      t.type = Token::Type::kFloat;
      t.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      t.type = Token::Type::kInteger;
      auto res = std::from_chars(text.data(), text.data() + text.size(), t.int_value);
      if (res.ec != std::errc()) return Error(pos, "integer literal too large");
    }
    t.text = std::move(text);
    tokens_.push_back(std::move(t));
    return e;
  }

  // Python string escapes, as Jinja2 decodes them ("unicode-escape").
  absl::StatusOr<size_t> LexString(size_t pos) {
    const char quote = src_[pos];
    std::string value;
    size_t i = pos + 1;
    while (true) {
      if (i >= src_.size()) return Error(pos, "unterminated string literal");
      const char c = src_[i];
      if (c == quote) break;
      if (c != '\\') {
        value.push_back(c);
        ++i;
        continue;
      }
      if (i + 1 >= src_.size()) return Error(pos, "unterminated string literal");
      const char e = src_[i + 1];
      i += 2;
      auto hex = [&](int n) -> int64_t {
        if (i + n > src_.size()) return -1;
        int64_t v = 0;
        for (int k = 0; k < n; ++k) {
          const char h = src_[i + k];
          int d = IsDigit(h)               ? h - '0'
                  : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                  : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                           : -1;
          if (d < 0) return -1;
          v = v * 16 + d;
        }
        i += n;
        return v;
      };
      switch (e) {
        case 'n':
          value.push_back('\n');
          break;
        case 't':
          value.push_back('\t');
          break;
        case 'r':
          value.push_back('\r');
          break;
        case '\\':
          value.push_back('\\');
          break;
        case '\'':
          value.push_back('\'');
          break;
        case '"':
          value.push_back('"');
          break;
        case 'a':
          value.push_back('\a');
          break;
        case 'b':
          value.push_back('\b');
          break;
        case 'f':
          value.push_back('\f');
          break;
        case 'v':
          value.push_back('\v');
          break;
        case '\n':
          break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          const int64_t cp = hex(e == 'x' ? 2 : e == 'u' ? 4 : 8);
          if (cp < 0 || cp > 0x10FFFF) return Error(pos, "invalid escape in string literal");
          AppendUtf8(static_cast<char32_t>(cp), &value);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            int v = e - '0';
            for (int k = 0; k < 2 && i < src_.size() && src_[i] >= '0' && src_[i] <= '7'; ++k) {
              v = v * 8 + (src_[i++] - '0');
            }
            AppendUtf8(static_cast<char32_t>(v), &value);
          } else {
            value.push_back('\\');
            value.push_back(e);
          }
      }
    }
    Token t;
    t.type = Token::Type::kString;
    t.text = std::move(value);
    t.line = LineAt(pos);
    tokens_.push_back(std::move(t));
    return i + 1;
  }

  std::string src_;
  std::vector<Token> tokens_;
  size_t line_pos_ = 0;
  int line_ = 1;
};

}  // namespace

absl::StatusOr<std::vector<Token>> Tokenize(absl::string_view source) {
  return Lexer(source).Run();
}

std::string DescribeToken(const Token& t) {
  switch (t.type) {
    case Token::Type::kText:
      return "template data";
    case Token::Type::kVarBegin:
      return "'{{'";
    case Token::Type::kVarEnd:
      return "end of print statement";
    case Token::Type::kBlockBegin:
      return "'{%'";
    case Token::Type::kBlockEnd:
      return "end of statement block";
    case Token::Type::kName:
    case Token::Type::kOperator:
      return absl::StrCat("'", t.text, "'");
    case Token::Type::kString:
      return "string literal";
    case Token::Type::kInteger:
    case Token::Type::kFloat:
      return absl::StrCat("number ", t.text);
    case Token::Type::kEof:
      return "end of template";
  }
  return "token";
}

}  // namespace tandem::jinja
