// What the fuzz targets share: FUZZ_CHECK, an invariant that must hold for
// every input (a failure aborts, which libFuzzer and the regression driver
// both report as a crash), and helpers to view the input bytes.
#ifndef TANDEM_TESTS_FUZZ_FUZZ_CHECK_H_
#define TANDEM_TESTS_FUZZ_FUZZ_CHECK_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string_view>
#include <vector>

#define FUZZ_CHECK(cond)                                                                 \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

namespace tandem::fuzz {

inline std::string_view AsText(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// The input cut at NUL bytes into at most `max_parts` parts (the last one
// keeps any further NULs). Targets that take several texts (a tokenizer.json
// and its configs) use NUL as the separator because no JSON text contains
// one.
inline std::vector<std::string_view> SplitAtNul(std::string_view text, size_t max_parts) {
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < max_parts) {
    const size_t nul = text.find('\0');
    if (nul == std::string_view::npos) break;
    parts.push_back(text.substr(0, nul));
    text.remove_prefix(nul + 1);
  }
  parts.push_back(text);
  return parts;
}

}  // namespace tandem::fuzz

#endif  // TANDEM_TESTS_FUZZ_FUZZ_CHECK_H_
