#include "common/compute/cpu/small_matmul.h"

#include <immintrin.h>

namespace tandem::cpu {
namespace {

// Sum of the 16 lanes in a fixed order. (_mm512_reduce_add_ps trips a false
// -Wuninitialized in GCC 12's headers.)
__attribute__((target("avx512f"))) inline float HorizontalSum(__m512 v) {
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, v);
  float s[8];
  for (int i = 0; i < 8; ++i) s[i] = lanes[i] + lanes[i + 8];
  for (int i = 0; i < 4; ++i) s[i] += s[i + 4];
  return (s[0] + s[2]) + (s[1] + s[3]);
}

// JB weight rows against IB input rows, all of k.
template <int JB, int IB>
__attribute__((target("avx512f"))) inline void Tile(const float* x, const float* w, float* out,
                                                    int n, int k, bool accumulate, int j0,
                                                    int i0) {
  __m512 acc[JB][IB];
  for (int a = 0; a < JB; ++a) {
    for (int b = 0; b < IB; ++b) acc[a][b] = _mm512_setzero_ps();
  }
  const float* wr[JB];
  const float* xr[IB];
  for (int a = 0; a < JB; ++a) wr[a] = w + static_cast<long>(j0 + a) * k;
  for (int b = 0; b < IB; ++b) xr[b] = x + static_cast<long>(i0 + b) * k;
  const int full = k & ~15;
  for (int kk = 0; kk < full; kk += 16) {
    __m512 wv[JB];
    for (int a = 0; a < JB; ++a) wv[a] = _mm512_loadu_ps(wr[a] + kk);
    for (int b = 0; b < IB; ++b) {
      const __m512 xv = _mm512_loadu_ps(xr[b] + kk);
      for (int a = 0; a < JB; ++a) acc[a][b] = _mm512_fmadd_ps(wv[a], xv, acc[a][b]);
    }
  }
  if (full < k) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (k - full)) - 1);
    __m512 wv[JB];
    for (int a = 0; a < JB; ++a) wv[a] = _mm512_maskz_loadu_ps(mask, wr[a] + full);
    for (int b = 0; b < IB; ++b) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, xr[b] + full);
      for (int a = 0; a < JB; ++a) acc[a][b] = _mm512_fmadd_ps(wv[a], xv, acc[a][b]);
    }
  }
  for (int b = 0; b < IB; ++b) {
    float* o = out + static_cast<long>(i0 + b) * n + j0;
    for (int a = 0; a < JB; ++a) {
      const float v = HorizontalSum(acc[a][b]);
      o[a] = accumulate ? o[a] + v : v;
    }
  }
}

template <int JB>
__attribute__((target("avx512f"))) void Column(const float* x, const float* w, float* out, int m,
                                               int n, int k, bool accumulate, int j0) {
  int i0 = 0;
  for (; i0 + 4 <= m; i0 += 4) Tile<JB, 4>(x, w, out, n, k, accumulate, j0, i0);
  switch (m - i0) {
    case 3: Tile<JB, 3>(x, w, out, n, k, accumulate, j0, i0); break;
    case 2: Tile<JB, 2>(x, w, out, n, k, accumulate, j0, i0); break;
    case 1: Tile<JB, 1>(x, w, out, n, k, accumulate, j0, i0); break;
    default: break;
  }
}

}  // namespace

bool SmallMatMulSupported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}

void SmallMatMul(const float* x, const float* w, float* out, int m, int n, int k, bool accumulate,
                 int n_begin, int n_end) {
  int j0 = n_begin;
  for (; j0 + 4 <= n_end; j0 += 4) Column<4>(x, w, out, m, n, k, accumulate, j0);
  switch (n_end - j0) {
    case 3: Column<3>(x, w, out, m, n, k, accumulate, j0); break;
    case 2: Column<2>(x, w, out, m, n, k, accumulate, j0); break;
    case 1: Column<1>(x, w, out, m, n, k, accumulate, j0); break;
    default: break;
  }
}

}  // namespace tandem::cpu
