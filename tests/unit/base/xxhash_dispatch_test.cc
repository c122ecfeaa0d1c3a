#include "common/base/xxhash_dispatch.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

// Bytes from a fixed linear congruential sequence.
std::vector<unsigned char> Bytes(size_t n) {
  std::vector<unsigned char> b(n);
  uint32_t x = 12345;
  for (unsigned char& c : b) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<unsigned char>(x >> 24);
  }
  return b;
}

struct Known {
  size_t length;
  uint64_t h64, high128, low128;
};

// Hashes of Bytes(length) from the library's plain (SSE2) entry points. Block
// keys and the checksums of records on disk must stay what they were, so the
// dispatched entry points must give these on every CPU, from the short-input
// paths up to the long one, one-shot and streaming.
TEST(XxhashDispatch, GivesThePlainLibrarysHashes) {
  const Known known[] = {
      {0, 0x2d06800538d394c2ULL, 0x99aa06d3014798d8ULL, 0x6001c324468d497fULL},
      {1, 0x929e358d27ae3ee2ULL, 0xe1325e21416bcdb2ULL, 0x929e358d27ae3ee2ULL},
      {17, 0xe0516e36333d945eULL, 0x97f3f96673f3ef78ULL, 0x6779b0bd8ff8db9eULL},
      {129, 0xd5c6a55b2fa7ec7bULL, 0xdffd86de7bdab44aULL, 0x3fe62aa5b62ea610ULL},
      {241, 0xf6e31830f6b8d622ULL, 0x96fa5f26d299f115ULL, 0xf6e31830f6b8d622ULL},
      {4096, 0x5ead6d2e8c9a742dULL, 0x405095600aaa7487ULL, 0x5ead6d2e8c9a742dULL},
      {65536, 0x1b031e1b8460b394ULL, 0xc72e6cb195ae882eULL, 0x1b031e1b8460b394ULL},
      {1048576, 0x6bfc3c9b3909a1b3ULL, 0xacc76cafe7a853a9ULL, 0x6bfc3c9b3909a1b3ULL},
  };
  const std::vector<unsigned char> bytes = Bytes(1 << 20);
  for (const Known& k : known) {
    SCOPED_TRACE(k.length);
    EXPECT_EQ(XXH3_64bits(bytes.data(), k.length), k.h64);
    const XXH128_hash_t h = XXH3_128bits(bytes.data(), k.length);
    EXPECT_EQ(h.high64, k.high128);
    EXPECT_EQ(h.low64, k.low128);

    // Streaming, in uneven pieces.
    XXH3_state_t* state = XXH3_createState();
    ASSERT_NE(state, nullptr);
    ASSERT_EQ(XXH3_64bits_reset(state), XXH_OK);
    for (size_t at = 0; at < k.length;) {
      const size_t piece = std::min<size_t>(k.length - at, 1 + (at * 7) % 5000);
      ASSERT_EQ(XXH3_64bits_update(state, bytes.data() + at, piece), XXH_OK);
      at += piece;
    }
    EXPECT_EQ(XXH3_64bits_digest(state), k.h64);
    XXH3_freeState(state);
  }
}

// Where the library exports the dispatching entry points, the build uses
// them: CMake's check found them (a broken check would quietly leave every
// checksum at a third of the speed).
TEST(XxhashDispatch, IsUsedWhereTheLibraryHasIt) {
  const bool library_has_it = dlsym(RTLD_DEFAULT, "XXH3_64bits_update_dispatch") != nullptr;
#if defined(TANDEM_XXH_DISPATCH)
  EXPECT_TRUE(library_has_it);
#else
  EXPECT_FALSE(library_has_it) << "the library dispatches, but this build calls its SSE2 code";
#endif
}

}  // namespace
}  // namespace tandem
