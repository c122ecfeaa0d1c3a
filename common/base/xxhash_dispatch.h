#pragma once

// XXH3 as fast as this machine runs it. The library's plain XXH3 entry points
// run the SSE2 code it was built with; where the library also has entry
// points that pick AVX2 or AVX-512 at run time (Debian's x86-64 build does,
// as xxh_x86dispatch.h declares them), this header makes XXH3_64bits,
// XXH3_128bits and their streaming forms those. They return the same hashes:
// only the speed differs (37 against 12-16 GB/s on a Zen 3 core).
// CMake defines TANDEM_XXH_DISPATCH where the library links with them.

#include <xxhash.h>  // IWYU pragma: export

#if defined(TANDEM_XXH_DISPATCH)
#include <xxh_x86dispatch.h>  // IWYU pragma: export
#endif
