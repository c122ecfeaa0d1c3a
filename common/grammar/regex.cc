#include "common/grammar/regex.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status_macros.h"

namespace tandem::grammar {
namespace {

using Sequence = Grammar::Sequence;

const ByteSet kAscii = ByteRange(0, 0x7f);

// A set of characters: ASCII ones by byte, and of the others either all of
// them or a list.
struct CharSet {
  ByteSet ascii;
  bool all_non_ascii = false;
  std::vector<std::string> non_ascii;

  void Add(const CharSet& o) {
    ascii |= o.ascii;
    all_non_ascii = all_non_ascii || o.all_non_ascii;
    non_ascii.insert(non_ascii.end(), o.non_ascii.begin(), o.non_ascii.end());
  }
  bool empty() const { return ascii.none() && !all_non_ascii && non_ascii.empty(); }
};

CharSet Ascii(const ByteSet& set) { return {set, false, {}}; }
CharSet Any() { return {kAscii, true, {}}; }

absl::Status Unsupported(absl::string_view what, absl::string_view pattern) {
  return absl::InvalidArgumentError(absl::StrCat("the pattern \"", pattern, "\" uses ", what,
                                                 ", which is not supported in constrained output"));
}

class Parser {
 public:
  Parser(Grammar& g, absl::string_view pattern, RegexOptions options)
      : g_(g), p_(pattern), options_(options) {}

  absl::StatusOr<int32_t> Run() {
    if (p_.size() > kMaxPatternBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a pattern has ", p_.size(), " bytes; at most ", kMaxPatternBytes, " are served"));
    }
    absl::string_view body = p_;
    const bool start = !body.empty() && body.front() == '^';
    if (start) body.remove_prefix(1);
    size_t slashes = 0;
    for (size_t k = body.size(); k >= 2 && body[k - 2] == '\\'; --k) ++slashes;
    const bool end = !body.empty() && body.back() == '$' && slashes % 2 == 0;
    if (end) body.remove_suffix(1);
    body_ = body;
    ASSIGN_OR_RETURN(const int32_t inner, Alternation());
    if (i_ != body_.size()) return Unsupported(absl::StrCat("an unmatched `)`"), p_);
    Sequence whole;
    if (options_.search && !start) whole.push_back(Grammar::Ref(g_.Star(Emit(Any()))));
    whole.push_back(Grammar::Ref(inner));
    if (options_.search && !end) whole.push_back(Grammar::Ref(g_.Star(Emit(Any()))));
    return g_.Choice({whole});
  }

 private:
  bool done() const { return i_ >= body_.size(); }
  char peek() const { return body_[i_]; }

  // `pending`: elements built but not yet in the grammar.
  absl::Status CheckSize(size_t pending) const {
    if (g_.element_count() + pending > static_cast<size_t>(kMaxElements)) {
      return absl::InvalidArgumentError(
          absl::StrCat("the pattern \"", p_, "\" makes a grammar of more than ", kMaxElements,
                       " elements: lower its repetition counts"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<int32_t> Alternation() {
    if (++depth_ > 64) return Unsupported("groups nested deeper than 64", p_);
    const int32_t rule = g_.NewRule();
    while (true) {
      ASSIGN_OR_RETURN(Sequence s, Concat());
      g_.AddAlternative(rule, s);
      if (done() || peek() != '|') break;
      ++i_;
    }
    --depth_;
    return rule;
  }

  absl::StatusOr<Sequence> Concat() {
    Sequence out;
    while (!done() && peek() != '|' && peek() != ')') {
      ASSIGN_OR_RETURN(Sequence atom, Atom());
      ASSIGN_OR_RETURN(Sequence quantified, Quantified(std::move(atom)));
      out.insert(out.end(), quantified.begin(), quantified.end());
      RETURN_IF_ERROR(CheckSize(out.size()));
    }
    return out;
  }

  // Reads {n}, {n,} or {n,m} at i_; false (i_ unchanged) when it is none.
  bool Braces(int& min, int& max) {
    size_t j = i_ + 1;
    auto number = [&](int& v) {
      const size_t from = j;
      int64_t n = 0;
      while (j < body_.size() && body_[j] >= '0' && body_[j] <= '9' && n <= kMaxRepeat + 1) {
        n = n * 10 + (body_[j++] - '0');
      }
      v = static_cast<int>(std::min<int64_t>(n, kMaxRepeat + 1));
      return j > from;
    };
    if (!number(min)) return false;
    max = min;
    if (j < body_.size() && body_[j] == ',') {
      ++j;
      if (!number(max)) max = -1;
    }
    if (j >= body_.size() || body_[j] != '}') return false;
    i_ = j + 1;
    return true;
  }

  absl::StatusOr<Sequence> Quantified(Sequence atom) {
    if (done()) return atom;
    int min = 1, max = 1;
    switch (peek()) {
      case '*':
        min = 0, max = -1, ++i_;
        break;
      case '+':
        min = 1, max = -1, ++i_;
        break;
      case '?':
        min = 0, max = 1, ++i_;
        break;
      case '{':
        if (!Braces(min, max)) return atom;
        if (min > kMaxRepeat || max > kMaxRepeat || (max >= 0 && max < min)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "the pattern \"", p_, "\" repeats {", min, ",", max, "}; counts from 0 to ",
              kMaxRepeat, ", the first not above the second, are served"));
        }
        break;
      default:
        return atom;
    }
    if (!done() && peek() == '?') ++i_;  // lazy: the same language
    if (!done() && (peek() == '*' || peek() == '+' || peek() == '?' || peek() == '{')) {
      return Unsupported("a quantifier after a quantifier", p_);
    }
    return Repeat(g_, atom, {}, min, max);
  }

  absl::StatusOr<Sequence> Atom() {
    const char c = peek();
    switch (c) {
      case '(': {
        ++i_;
        if (!done() && peek() == '?') {
          if (i_ + 1 < body_.size() && body_[i_ + 1] == ':') {
            i_ += 2;
          } else {
            return Unsupported("lookaround or a named group `(?`", p_);
          }
        }
        ASSIGN_OR_RETURN(const int32_t rule, Alternation());
        if (done() || peek() != ')') return Unsupported("an unclosed `(`", p_);
        ++i_;
        return Sequence{Grammar::Ref(rule)};
      }
      case '[': {
        ++i_;
        ASSIGN_OR_RETURN(CharSet set, Class());
        return Emit(set);
      }
      case '.': {
        ++i_;
        CharSet set = Any();
        set.ascii.reset('\n');
        set.ascii.reset('\r');
        return Emit(set);
      }
      case '\\': {
        ++i_;
        ASSIGN_OR_RETURN(CharSet set, Escape(false));
        return Emit(set);
      }
      case '^':
      case '$':
        return Unsupported(absl::StrCat("`", std::string(1, c),
                                        "` inside the pattern (anchors are served at its ends)"),
                           p_);
      case '*':
      case '+':
      case '?':
        return Unsupported(absl::StrCat("`", std::string(1, c), "` with nothing to repeat"), p_);
      default: {
        ASSIGN_OR_RETURN(CharSet set, Literal());
        return Emit(set);
      }
    }
  }

  // One UTF-8 character at i_ as a set.
  absl::StatusOr<CharSet> Literal() {
    const unsigned char c = static_cast<unsigned char>(peek());
    if (c < 0x80) {
      ++i_;
      ByteSet s;
      s.set(c);
      return Ascii(s);
    }
    const int len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 0;
    if (len == 0 || i_ + len > body_.size()) return Unsupported("bytes that are not UTF-8", p_);
    CharSet set;
    set.non_ascii.emplace_back(std::string(body_.substr(i_, len)));
    i_ += len;
    return set;
  }

  absl::StatusOr<CharSet> Escape(bool in_class) {
    if (done()) return Unsupported("a trailing `\\`", p_);
    const char c = body_[i_++];
    ByteSet s;
    switch (c) {
      case 'd':
        return Ascii(ByteRange('0', '9'));
      case 'D': {
        CharSet set = Any();
        set.ascii &= ~ByteRange('0', '9');
        return set;
      }
      case 'w':
        return Ascii(ByteRange('0', '9') | ByteRange('a', 'z') | ByteRange('A', 'Z') |
                     ByteRange('_', '_'));
      case 'W': {
        CharSet set = Any();
        set.ascii &= ~(ByteRange('0', '9') | ByteRange('a', 'z') | ByteRange('A', 'Z') |
                       ByteRange('_', '_'));
        return set;
      }
      case 's':
        for (char w : {' ', '\t', '\n', '\r', '\f', '\v'}) s.set(static_cast<uint8_t>(w));
        return Ascii(s);
      case 'S': {
        CharSet set = Any();
        for (char w : {' ', '\t', '\n', '\r', '\f', '\v'}) set.ascii.reset(static_cast<uint8_t>(w));
        return set;
      }
      case 'n':
        s.set('\n');
        return Ascii(s);
      case 'r':
        s.set('\r');
        return Ascii(s);
      case 't':
        s.set('\t');
        return Ascii(s);
      case 'f':
        s.set('\f');
        return Ascii(s);
      case 'v':
        s.set('\v');
        return Ascii(s);
      case '0':
        s.set(0);
        return Ascii(s);
      case 'x':
      case 'u': {
        const size_t digits = c == 'x' ? 2 : 4;
        if (i_ + digits > body_.size())
          return Unsupported(absl::StrCat("a short `\\", std::string(1, c), "`"), p_);
        uint32_t cp = 0;
        for (size_t k = 0; k < digits; ++k) {
          const char h = body_[i_ + k];
          const int v = h >= '0' && h <= '9'   ? h - '0'
                        : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                               : -1;
          if (v < 0)
            return Unsupported(absl::StrCat("a bad `\\", std::string(1, c), "` escape"), p_);
          cp = cp * 16 + v;
        }
        i_ += digits;
        if (cp >= 0xd800 && cp <= 0xdfff) return Unsupported("a surrogate `\\u` escape", p_);
        if (cp < 0x80) {
          s.set(cp);
          return Ascii(s);
        }
        std::string utf8;
        if (cp < 0x800) {
          utf8 = {static_cast<char>(0xc0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3f))};
        } else {
          utf8 = {static_cast<char>(0xe0 | (cp >> 12)),
                  static_cast<char>(0x80 | ((cp >> 6) & 0x3f)),
                  static_cast<char>(0x80 | (cp & 0x3f))};
        }
        CharSet set;
        set.non_ascii.push_back(std::move(utf8));
        return set;
      }
      default:
        break;
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '1' && c <= '9')) {
      if (!(in_class && c == 'b')) {
        return Unsupported(absl::StrCat("`\\", std::string(1, c), "`"), p_);
      }
      s.set('\b');  // [\b] is a backspace
      return Ascii(s);
    }
    --i_;
    return Literal();  // an escaped metacharacter (or any other character) as itself
  }

  // The class after `[`, up to and including `]`.
  absl::StatusOr<CharSet> Class() {
    CharSet set;
    const bool negated = !done() && peek() == '^';
    if (negated) ++i_;
    bool first = true;
    while (true) {
      if (done()) return Unsupported("an unclosed `[`", p_);
      if (peek() == ']' && !first) {
        ++i_;
        break;
      }
      first = false;
      CharSet item;
      bool single = true;
      if (peek() == '\\') {
        ++i_;
        const char kind = done() ? 0 : peek();
        ASSIGN_OR_RETURN(item, Escape(true));
        single = !(kind == 'd' || kind == 'D' || kind == 'w' || kind == 'W' || kind == 's' ||
                   kind == 'S');
      } else {
        ASSIGN_OR_RETURN(item, Literal());
      }
      // A range a-z (a `-` before `]` is itself).
      if (single && i_ + 1 < body_.size() && peek() == '-' && body_[i_ + 1] != ']') {
        ++i_;
        CharSet hi;
        if (peek() == '\\') {
          ++i_;
          ASSIGN_OR_RETURN(hi, Escape(true));
        } else {
          ASSIGN_OR_RETURN(hi, Literal());
        }
        if (!item.non_ascii.empty() || !hi.non_ascii.empty() || item.ascii.count() != 1 ||
            hi.ascii.count() != 1) {
          return Unsupported("a class range that is not between two ASCII characters", p_);
        }
        int lo = 0, top = 0;
        for (int b = 0; b < 128; ++b) {
          if (item.ascii[b]) lo = b;
          if (hi.ascii[b]) top = b;
        }
        if (lo > top) return Unsupported("a class range whose ends are reversed", p_);
        item = Ascii(ByteRange(lo, top));
      }
      set.Add(item);
    }
    if (negated) {
      if (!set.non_ascii.empty()) {
        return Unsupported("a negated class with non-ASCII characters", p_);
      }
      set.ascii = kAscii & ~set.ascii;
      set.all_non_ascii = !set.all_non_ascii;
    }
    return set;
  }

  // A sequence matching one character of `set`, written as options_ say.
  Sequence Emit(const CharSet& set) {
    std::vector<Sequence> alts;
    ByteSet plain = set.ascii;
    if (options_.output == RegexOutput::kJsonString) {
      plain &= ~ByteRange(0, 0x1f);
      plain.reset('"');
      plain.reset('\\');
      for (int b = 0; b < 0x20; ++b) {
        if (!set.ascii[b]) continue;
        const char* named = b == '\n'   ? "\\n"
                            : b == '\t' ? "\\t"
                            : b == '\r' ? "\\r"
                            : b == '\f' ? "\\f"
                            : b == '\b' ? "\\b"
                                        : nullptr;
        alts.push_back(
            g_.Literal(named != nullptr ? std::string(named) : absl::StrFormat("\\u%04x", b)));
      }
      if (set.ascii['"']) alts.push_back(g_.Literal("\\\""));
      if (set.ascii['\\']) alts.push_back(g_.Literal("\\\\"));
    }
    if (plain.any()) alts.push_back({g_.Bytes(plain)});
    if (set.all_non_ascii) alts.push_back({Grammar::Ref(Utf8MultiByte(g_))});
    for (const std::string& c : set.non_ascii) alts.push_back(g_.Literal(c));
    if (alts.size() == 1 && alts[0].size() == 1) return alts[0];
    const int32_t rule = g_.NewRule();
    for (const Sequence& a : alts) g_.AddAlternative(rule, a);  // none: matches nothing
    return {Grammar::Ref(rule)};
  }

  Grammar& g_;
  const absl::string_view p_;
  absl::string_view body_;
  const RegexOptions options_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

int32_t Utf8MultiByte(Grammar& g) {
  const Grammar::Element cont = g.Bytes(ByteRange(0x80, 0xbf));
  auto b = [&](int lo, int hi) { return g.Bytes(ByteRange(lo, hi)); };
  return g.Choice({{b(0xc2, 0xdf), cont},
                   {b(0xe0, 0xe0), b(0xa0, 0xbf), cont},
                   {b(0xe1, 0xec), cont, cont},
                   {b(0xed, 0xed), b(0x80, 0x9f), cont},
                   {b(0xee, 0xef), cont, cont},
                   {b(0xf0, 0xf0), b(0x90, 0xbf), cont, cont},
                   {b(0xf1, 0xf3), cont, cont, cont},
                   {b(0xf4, 0xf4), b(0x80, 0x8f), cont, cont}});
}

Sequence Repeat(Grammar& g, const Sequence& one, const Sequence& sep, int min, int max) {
  Sequence tail_one = sep;
  tail_one.insert(tail_one.end(), one.begin(), one.end());
  const auto more = [&](int count) {
    if (max < 0) return g.Star(tail_one);
    int32_t rule = g.Choice({{}});
    for (int k = 0; k < count; ++k) {
      Sequence s = tail_one;
      s.push_back(Grammar::Ref(rule));
      rule = g.Choice({s, {}});
    }
    return rule;
  };
  if (min == 0) {
    if (max == 0) return {};
    Sequence first = one;
    first.push_back(Grammar::Ref(more(max < 0 ? -1 : max - 1)));
    return {Grammar::Ref(g.Optional(first))};
  }
  Sequence out = one;
  for (int k = 1; k < min; ++k) out.insert(out.end(), tail_one.begin(), tail_one.end());
  out.push_back(Grammar::Ref(more(max < 0 ? -1 : max - min)));
  return out;
}

absl::StatusOr<int32_t> AddRegex(Grammar& g, absl::string_view pattern, RegexOptions options) {
  return Parser(g, pattern, options).Run();
}

const char* FormatRegex(absl::string_view format) {
  static constexpr const char* kDate = "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])";
  static constexpr const char* kTime =
      "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9]"
      ")";
  if (format == "date") return "^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$";
  if (format == "time") {
    return "^([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-"
           "5][0-9])$";
  }
  if (format == "date-time") {
    static const std::string* const kDateTime =
        new std::string(absl::StrCat("^", kDate, "T", kTime, "$"));
    return kDateTime->c_str();
  }
  if (format == "uuid") {
    return "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$";
  }
  if (format == "email") {
    return "^[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(\\.[A-Za-z0-9-]{1,63}){1,4}$";
  }
  if (format == "ipv4") {
    return "^((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|"
           "[1-9]?[0-9])$";
  }
  return nullptr;
}

}  // namespace tandem::grammar
