#include "common/chat/internal/py_string.h"

#include <algorithm>

namespace tandem::jinja {

std::u32string DecodeUtf8(absl::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int n = 0;
    char32_t cp = 0;
    if (c < 0x80) {
      cp = c;
      n = 1;
    } else if ((c & 0xE0) == 0xC0) {
      cp = c & 0x1F;
      n = 2;
    } else if ((c & 0xF0) == 0xE0) {
      cp = c & 0x0F;
      n = 3;
    } else if ((c & 0xF8) == 0xF0) {
      cp = c & 0x07;
      n = 4;
    }
    bool ok = n > 0 && i + n <= s.size();
    for (int k = 1; ok && k < n; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) ok = false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (ok && ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) ||
               cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))) {
      ok = false;
    }
    if (!ok) {
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += n;
  }
  return out;
}

void AppendUtf8(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string EncodeUtf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) AppendUtf8(c, &out);
  return out;
}

int64_t Utf8Length(absl::string_view s) {
  bool ascii = true;
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) {
      ascii = false;
      break;
    }
  }
  if (ascii) return static_cast<int64_t>(s.size());
  return static_cast<int64_t>(DecodeUtf8(s).size());
}

bool IsPySpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

std::string PyStrip(absl::string_view s, const std::optional<std::string>& chars, bool left,
                    bool right) {
  const std::u32string text = DecodeUtf8(s);
  std::u32string set;
  if (chars.has_value()) set = DecodeUtf8(*chars);
  auto strip_it = [&](char32_t c) {
    return chars.has_value() ? set.find(c) != std::u32string::npos : IsPySpace(c);
  };
  size_t b = 0, e = text.size();
  if (left) {
    while (b < e && strip_it(text[b])) ++b;
  }
  if (right) {
    while (e > b && strip_it(text[e - 1])) --e;
  }
  return EncodeUtf8(std::u32string_view(text).substr(b, e - b));
}

std::vector<std::string> PySplit(absl::string_view s, const std::optional<std::string>& sep,
                                 int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (maxsplit < 0) maxsplit = INT64_MAX;
  if (sep.has_value()) {
    if (!from_right) {
      size_t pos = 0;
      int64_t splits = 0;
      while (splits < maxsplit) {
        const size_t hit = s.find(*sep, pos);
        if (hit == absl::string_view::npos) break;
        parts.emplace_back(s.substr(pos, hit - pos));
        pos = hit + sep->size();
        ++splits;
      }
      parts.emplace_back(s.substr(pos));
    } else {
      size_t end = s.size();
      int64_t splits = 0;
      while (splits < maxsplit && end >= sep->size()) {
        const size_t hit = s.rfind(*sep, end - sep->size());
        if (hit == absl::string_view::npos) break;
        parts.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
        end = hit;
        ++splits;
      }
      parts.emplace_back(s.substr(0, end));
      std::reverse(parts.begin(), parts.end());
    }
    return parts;
  }
  // Whitespace runs; leading/trailing whitespace yields no empty parts.
  const std::u32string text = DecodeUtf8(s);
  const int64_t n = static_cast<int64_t>(text.size());
  if (!from_right) {
    int64_t i = 0, splits = 0;
    while (i < n) {
      while (i < n && IsPySpace(text[i])) ++i;
      if (i >= n) break;
      if (splits >= maxsplit) {
        int64_t e = n;
        while (e > i && IsPySpace(text[e - 1])) --e;
        parts.push_back(EncodeUtf8(std::u32string_view(text).substr(i, e - i)));
        break;
      }
      int64_t j = i;
      while (j < n && !IsPySpace(text[j])) ++j;
      parts.push_back(EncodeUtf8(std::u32string_view(text).substr(i, j - i)));
      ++splits;
      i = j;
    }
  } else {
    int64_t e = n, splits = 0;
    while (e > 0) {
      while (e > 0 && IsPySpace(text[e - 1])) --e;
      if (e <= 0) break;
      if (splits >= maxsplit) {
        int64_t b = 0;
        while (b < e && IsPySpace(text[b])) ++b;
        parts.push_back(EncodeUtf8(std::u32string_view(text).substr(b, e - b)));
        break;
      }
      int64_t j = e;
      while (j > 0 && !IsPySpace(text[j - 1])) --j;
      parts.push_back(EncodeUtf8(std::u32string_view(text).substr(j, e - j)));
      ++splits;
      e = j;
    }
    std::reverse(parts.begin(), parts.end());
  }
  return parts;
}

std::string AsciiUpper(absl::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return out;
}

std::string AsciiLower(absl::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

std::string PyCapitalize(absl::string_view s) {
  std::string out = AsciiLower(s);
  if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = static_cast<char>(out[0] - 32);
  return out;
}

std::string PyTitle(absl::string_view s) {
  std::string out(s);
  bool prev_cased = false;
  for (char& c : out) {
    const bool lower = c >= 'a' && c <= 'z';
    const bool upper = c >= 'A' && c <= 'Z';
    if (lower && !prev_cased) c = static_cast<char>(c - 32);
    if (upper && prev_cased) c = static_cast<char>(c + 32);
    prev_cased = lower || upper;
  }
  return out;
}

std::string PyStrRepr(absl::string_view s) {
  const bool has_single = s.find('\'') != absl::string_view::npos;
  const bool has_double = s.find('"') != absl::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : DecodeUtf8(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F || (c >= 0x80 && c < 0xA0)) {
      static const char kHex[] = "0123456789abcdef";
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    } else {
      AppendUtf8(c, &out);
    }
  }
  out.push_back(quote);
  return out;
}

std::vector<int64_t> SliceIndices(int64_t len, std::optional<int64_t> start,
                                  std::optional<int64_t> stop, std::optional<int64_t> step) {
  const int64_t st = step.value_or(1);
  int64_t b, e;
  if (st > 0) {
    b = start.value_or(0);
    e = stop.value_or(len);
    if (b < 0) b = std::max<int64_t>(0, b + len);
    if (e < 0) e = std::max<int64_t>(0, e + len);
    b = std::min(b, len);
    e = std::min(e, len);
  } else {
    b = start.value_or(len - 1);
    e = stop.has_value() ? *stop : -1 - len;  // "before the first element"
    if (start.has_value()) {
      if (b < 0) b = std::max<int64_t>(-1, b + len);
      if (b >= len) b = len - 1;
    }
    if (stop.has_value()) {
      if (e < 0) e = std::max<int64_t>(-1, e + len);
      if (e >= len) e = len - 1;
    } else {
      e = -1;
    }
  }
  std::vector<int64_t> out;
  if (st > 0) {
    for (int64_t i = b; i < e;) {
      out.push_back(i);
      if (e - i <= st) break;  // no overflow for huge steps
      i += st;
    }
  } else {
    for (int64_t i = b; i > e;) {
      out.push_back(i);
      if (i - e <= -st) break;
      i += st;
    }
  }
  return out;
}

}  // namespace tandem::jinja
