// Deterministic bytes shared by the two processes of the KV transfer tests:
// both sides compute what layer `layer` must hold without exchanging it.
#ifndef TANDEM_TESTS_E2E_KV_PATTERN_H_
#define TANDEM_TESTS_E2E_KV_PATTERN_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace tandem::testing {

inline void FillKvPattern(uint64_t seed, uint32_t layer, uint8_t* out, size_t n) {
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + layer * 0xD1B54A32D192ED03ull + 1;
  for (size_t i = 0; i < n; i += 8) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    std::memcpy(out + i, &z, n - i < 8 ? n - i : 8);
  }
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_E2E_KV_PATTERN_H_
