#include "common/tokenizer/byte_level.h"

#include <array>

#include "common/tokenizer/symbols.h"

namespace tandem {
namespace {

bool IsPrintableLatin1(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct ByteTables {
  std::array<uint32_t, 256> to_code_point;
  std::array<int16_t, 324> to_byte;  // Indexed by code point; -1 for none.
};

const ByteTables& Tables() {
  static const ByteTables tables = [] {
    ByteTables t;
    t.to_byte.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      t.to_code_point[b] = IsPrintableLatin1(b) ? static_cast<uint32_t>(b) : next++;
      t.to_byte[t.to_code_point[b]] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return tables;
}

}  // namespace

uint32_t ByteToCodePoint(uint8_t b) { return Tables().to_code_point[b]; }

std::optional<uint8_t> CodePointToByte(uint32_t cp) {
  const ByteTables& t = Tables();
  if (cp >= t.to_byte.size() || t.to_byte[cp] < 0) return std::nullopt;
  return static_cast<uint8_t>(t.to_byte[cp]);
}

std::optional<std::string> ByteLevelToBytes(std::string_view token) {
  std::string bytes;
  bytes.reserve(token.size());
  for (size_t i = 0; i < token.size();) {
    const int len = Utf8CharLength(token.substr(i));
    if (len == 0) return std::nullopt;
    const std::optional<uint8_t> b = CodePointToByte(DecodeUtf8(token.substr(i), len));
    if (!b.has_value()) return std::nullopt;
    bytes.push_back(static_cast<char>(*b));
    i += len;
  }
  return bytes;
}

int Utf8CharLength(std::string_view s) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const auto trail = [&](size_t i) { return i < s.size() && (byte(i) & 0xC0) == 0x80; };
  const uint8_t c = byte(0);
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) {
    if (!trail(1)) return 0;
    return ((uint32_t{c} & 0x1F) << 6 | (byte(1) & 0x3F)) >= 0x80 ? 2 : 0;
  }
  if ((c & 0xF0) == 0xE0) {
    if (!trail(1) || !trail(2)) return 0;
    const uint32_t cp = (uint32_t{c} & 0x0F) << 12 | (byte(1) & 0x3F) << 6 | (byte(2) & 0x3F);
    return cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF) ? 3 : 0;
  }
  if ((c & 0xF8) == 0xF0) {
    if (!trail(1) || !trail(2) || !trail(3)) return 0;
    const uint32_t cp = (uint32_t{c} & 0x07) << 18 | (byte(1) & 0x3F) << 12 |
                        (byte(2) & 0x3F) << 6 | (byte(3) & 0x3F);
    return cp >= 0x10000 && cp <= 0x10FFFF ? 4 : 0;
  }
  return 0;
}

uint32_t DecodeUtf8(std::string_view s, int len) {
  const auto byte = [&](int i) { return static_cast<uint32_t>(static_cast<uint8_t>(s[i])); };
  switch (len) {
    case 1:
      return byte(0);
    case 2:
      return (byte(0) & 0x1F) << 6 | (byte(1) & 0x3F);
    case 3:
      return (byte(0) & 0x0F) << 12 | (byte(1) & 0x3F) << 6 | (byte(2) & 0x3F);
    default:
      return (byte(0) & 0x07) << 18 | (byte(1) & 0x3F) << 12 | (byte(2) & 0x3F) << 6 |
             (byte(3) & 0x3F);
  }
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const int len = Utf8CharLength(s.substr(i));
    if (len == 0) return false;
    i += len;
  }
  return true;
}

std::string SanitizeUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  for (size_t i = 0; i < s.size();) {
    const int len = Utf8CharLength(s.substr(i));
    if (len == 0) {
      out.append(kReplacementChar);
      ++i;
    } else {
      out.append(s.substr(i, len));
      i += len;
    }
  }
  return out;
}

}  // namespace tandem
