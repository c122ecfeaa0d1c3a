#include "common/compute/cpu/small_matmul.h"

#include <immintrin.h>

// GCC 12 reports its own AVX-512 intrinsics (the undefined-vector idiom in
// the masked loads, shuffles and conversions) as used or maybe used
// uninitialized (GCC bug 105593, fixed in GCC 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <algorithm>
#include <cstdint>
#include <type_traits>

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

// The lane sums of acc[0..15], by a tree of in-register additions instead of
// 16 separate horizontal sums: lane b * 4 + a of the result is the sum of
// acc[a * 4 + b]. Each sum is added in HorizontalSum's order, bit for bit.
__attribute__((target("avx512f"), always_inline)) inline __m512 SumLanes16(const __m512* acc) {
  // Level 1: pairs (2i, 2i+1) -> 8 vectors, each holding two sums in halves
  // of 8 lanes (interleaving 128-bit pieces keeps lanes aligned).
  __m512 l1[8];
  for (int i = 0; i < 8; ++i) {
    const __m512 a = acc[2 * i], b = acc[2 * i + 1];
    // lo: a's 256-bit halves added; hi: b's; packed as [a_sum(8), b_sum(8)].
    const __m512 lo = _mm512_shuffle_f32x4(a, b, 0x44);  // a0 a1 b0 b1 (128-bit lanes)
    const __m512 hi = _mm512_shuffle_f32x4(a, b, 0xEE);  // a2 a3 b2 b3
    l1[i] = _mm512_add_ps(lo, hi);                       // [a0+a2, a1+a3, b0+b2, b1+b3]
  }
  __m512 l2[4];
  for (int i = 0; i < 4; ++i) {
    const __m512 a = l1[2 * i], b = l1[2 * i + 1];
    const __m512 lo = _mm512_shuffle_f32x4(a, b, 0x88);  // a0 a2 b0 b2
    const __m512 hi = _mm512_shuffle_f32x4(a, b, 0xDD);  // a1 a3 b1 b3
    l2[i] = _mm512_add_ps(lo, hi);  // 128-bit lane j holds 4 partials of vector (i*4 + j)
  }
  // Within each 128-bit lane: 4 partials of one sum -> transpose 4x4 and add.
  const __m512 t0 = _mm512_unpacklo_ps(l2[0], l2[1]);
  const __m512 t1 = _mm512_unpackhi_ps(l2[0], l2[1]);
  const __m512 t2 = _mm512_unpacklo_ps(l2[2], l2[3]);
  const __m512 t3 = _mm512_unpackhi_ps(l2[2], l2[3]);
  const __m512 u0 =
      _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t2)));
  const __m512 u1 =
      _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t2)));
  const __m512 u2 =
      _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t1), _mm512_castps_pd(t3)));
  const __m512 u3 =
      _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t1), _mm512_castps_pd(t3)));
  return _mm512_add_ps(_mm512_add_ps(u0, u2), _mm512_add_ps(u1, u3));
}

// Writes the JB x IB tile of sums acc[a * IB + b] (weight row a, input row
// b) to out, adding to it when `accumulate`.
template <int JB, int IB>
__attribute__((target("avx512f"), always_inline)) inline void StoreTile(const __m512* acc,
                                                                        float* out, int n,
                                                                        bool accumulate, int j0,
                                                                        int i0) {
  if constexpr (JB == 4 && IB == 4) {
    alignas(64) float sums[16];
    _mm512_store_ps(sums, SumLanes16(acc));
    for (int b = 0; b < IB; ++b) {
      float* o = out + static_cast<long>(i0 + b) * n + j0;
      for (int a = 0; a < JB; ++a) o[a] = accumulate ? o[a] + sums[b * 4 + a] : sums[b * 4 + a];
    }
  } else {
    for (int b = 0; b < IB; ++b) {
      float* o = out + static_cast<long>(i0 + b) * n + j0;
      for (int a = 0; a < JB; ++a) {
        const float v = HorizontalSum(acc[a * IB + b]);
        o[a] = accumulate ? o[a] + v : v;
      }
    }
  }
}

// JB weight rows against IB input rows, all of k.
template <int JB, int IB>
__attribute__((target("avx512f"))) inline void Tile(const float* x, const float* w, float* out,
                                                    int n, int k, bool accumulate, int j0, int i0) {
  __m512 acc[JB * IB];
  for (int a = 0; a < JB * IB; ++a) acc[a] = _mm512_setzero_ps();
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
      for (int a = 0; a < JB; ++a) acc[a * IB + b] = _mm512_fmadd_ps(wv[a], xv, acc[a * IB + b]);
    }
  }
  if (full < k) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (k - full)) - 1);
    __m512 wv[JB];
    for (int a = 0; a < JB; ++a) wv[a] = _mm512_maskz_loadu_ps(mask, wr[a] + full);
    for (int b = 0; b < IB; ++b) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, xr[b] + full);
      for (int a = 0; a < JB; ++a) acc[a * IB + b] = _mm512_fmadd_ps(wv[a], xv, acc[a * IB + b]);
    }
  }
  StoreTile<JB, IB>(acc, out, n, accumulate, j0, i0);
}

template <int JB>
__attribute__((target("avx512f"))) void Column(const float* x, const float* w, float* out, int m,
                                               int n, int k, bool accumulate, int j0) {
  int i0 = 0;
  for (; i0 + 4 <= m; i0 += 4) Tile<JB, 4>(x, w, out, n, k, accumulate, j0, i0);
  switch (m - i0) {
    case 3:
      Tile<JB, 3>(x, w, out, n, k, accumulate, j0, i0);
      break;
    case 2:
      Tile<JB, 2>(x, w, out, n, k, accumulate, j0, i0);
      break;
    case 1:
      Tile<JB, 1>(x, w, out, n, k, accumulate, j0, i0);
      break;
    default:
      break;
  }
}

// 16 weights widened to f32: bf16 by shifting into the high half, f16 by
// the AVX-512 conversion. `count` < 16 loads a masked tail (zeros after).
#define TANDEM_AVX512_16 __attribute__((target("avx512f,avx512bw,avx512vl")))

template <DType kType>
TANDEM_AVX512_16 inline __m512 LoadWeights(const uint16_t* p, __mmask16 mask) {
  const __m256i h = _mm256_maskz_loadu_epi16(mask, p);
  if constexpr (kType == DType::kBF16) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    return _mm512_cvtph_ps(h);
  }
}

template <DType kType, int JB, int IB>
TANDEM_AVX512_16 inline void Tile16(const float* x, const uint16_t* w, float* out, int n, int k,
                                    bool accumulate, int j0, int i0) {
  __m512 acc[JB * IB];
  for (int a = 0; a < JB * IB; ++a) acc[a] = _mm512_setzero_ps();
  const uint16_t* wr[JB];
  const float* xr[IB];
  for (int a = 0; a < JB; ++a) wr[a] = w + static_cast<long>(j0 + a) * k;
  for (int b = 0; b < IB; ++b) xr[b] = x + static_cast<long>(i0 + b) * k;
  for (int kk = 0; kk < k; kk += 16) {
    const __mmask16 mask = k - kk >= 16 ? static_cast<__mmask16>(0xffff)
                                        : static_cast<__mmask16>((1u << (k - kk)) - 1);
    __m512 wv[JB];
    for (int a = 0; a < JB; ++a) wv[a] = LoadWeights<kType>(wr[a] + kk, mask);
    for (int b = 0; b < IB; ++b) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, xr[b] + kk);
      for (int a = 0; a < JB; ++a) acc[a * IB + b] = _mm512_fmadd_ps(wv[a], xv, acc[a * IB + b]);
    }
  }
  StoreTile<JB, IB>(acc, out, n, accumulate, j0, i0);
}

#define TANDEM_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

// 32 bf16 weights (or inputs) as one vector of pairs; masked tail as above.
TANDEM_AVX512_BF16 inline __m512bh LoadPairs(const uint16_t* p, __mmask32 mask) {
  return reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(mask, p));
}

// Values of each weight row that a skinny product prefetches ahead of its
// loads (1 KiB): with one or two input rows per weight row, the product is
// bound by how many weight lines are in flight, not by the multiply-adds.
constexpr int kPrefetchAhead = 512;

template <int JB, int IB, bool kPrefetch = false>
TANDEM_AVX512_BF16 inline void TileDot(const uint16_t* x, const uint16_t* w, float* out, int n,
                                       int k, bool accumulate, int j0, int i0) {
  __m512 acc[JB * IB];
  for (int a = 0; a < JB * IB; ++a) acc[a] = _mm512_setzero_ps();
  const uint16_t* wr[JB];
  const uint16_t* xr[IB];
  for (int a = 0; a < JB; ++a) wr[a] = w + static_cast<long>(j0 + a) * k;
  for (int b = 0; b < IB; ++b) xr[b] = x + static_cast<long>(i0 + b) * k;
  const int full = k & ~31;
  for (int kk = 0; kk < full; kk += 32) {
    __m512bh wv[JB];
    for (int a = 0; a < JB; ++a) {
      // A prefetch past the matrix's end is harmless: prefetches never fault.
      if constexpr (kPrefetch) {
        _mm_prefetch(reinterpret_cast<const char*>(wr[a] + kk + kPrefetchAhead), _MM_HINT_T0);
      }
      wv[a] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(wr[a] + kk));
    }
    for (int b = 0; b < IB; ++b) {
      const __m512bh xv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(xr[b] + kk));
      for (int a = 0; a < JB; ++a) acc[a * IB + b] = _mm512_dpbf16_ps(acc[a * IB + b], wv[a], xv);
    }
  }
  if (full < k) {
    const __mmask32 mask = static_cast<__mmask32>((1u << (k - full)) - 1);
    __m512bh wv[JB];
    for (int a = 0; a < JB; ++a) wv[a] = LoadPairs(wr[a] + full, mask);
    for (int b = 0; b < IB; ++b) {
      const __m512bh xv = LoadPairs(xr[b] + full, mask);
      for (int a = 0; a < JB; ++a) acc[a * IB + b] = _mm512_dpbf16_ps(acc[a * IB + b], wv[a], xv);
    }
  }
  StoreTile<JB, IB>(acc, out, n, accumulate, j0, i0);
}

// Runs Tile(JB, IB) over output columns [n_begin, n_end) and all m rows in
// 4x4 tiles with smaller edge tiles. `tile` is a generic lambda taking
// std::integral_constant JB and IB.
template <typename TileFn>
inline void ForEachTile(int m, int n_begin, int n_end, TileFn tile) {
  auto column = [&](auto jb, int j0) {
    int i0 = 0;
    for (; i0 + 4 <= m; i0 += 4) tile(jb, std::integral_constant<int, 4>{}, j0, i0);
    switch (m - i0) {
      case 3:
        tile(jb, std::integral_constant<int, 3>{}, j0, i0);
        break;
      case 2:
        tile(jb, std::integral_constant<int, 2>{}, j0, i0);
        break;
      case 1:
        tile(jb, std::integral_constant<int, 1>{}, j0, i0);
        break;
      default:
        break;
    }
  };
  int j0 = n_begin;
  for (; j0 + 4 <= n_end; j0 += 4) column(std::integral_constant<int, 4>{}, j0);
  switch (n_end - j0) {
    case 3:
      column(std::integral_constant<int, 3>{}, j0);
      break;
    case 2:
      column(std::integral_constant<int, 2>{}, j0);
      break;
    case 1:
      column(std::integral_constant<int, 1>{}, j0);
      break;
    default:
      break;
  }
}

template <DType kType>
TANDEM_AVX512_16 void SmallMatMul16T(const float* x, const uint16_t* w, float* out, int m, int n,
                                     int k, bool accumulate, int n_begin, int n_end) {
  ForEachTile(m, n_begin, n_end, [&](auto jb, auto ib, int j0, int i0) {
    Tile16<kType, decltype(jb)::value, decltype(ib)::value>(x, w, out, n, k, accumulate, j0, i0);
  });
}

}  // namespace

bool SmallMatMul16Supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
}

void SmallMatMul16(const float* x, const void* w, DType w_type, float* out, int m, int n, int k,
                   bool accumulate, int n_begin, int n_end) {
  const uint16_t* w16 = static_cast<const uint16_t*>(w);
  if (w_type == DType::kBF16) {
    SmallMatMul16T<DType::kBF16>(x, w16, out, m, n, k, accumulate, n_begin, n_end);
  } else {
    SmallMatMul16T<DType::kF16>(x, w16, out, m, n, k, accumulate, n_begin, n_end);
  }
}

bool DotBf16Supported() {
  __builtin_cpu_init();
  return SmallMatMul16Supported() && __builtin_cpu_supports("avx512bf16");
}

TANDEM_AVX512_BF16 void MatMulDotBf16(const uint16_t* x_bf16, const void* w, float* out, int ldo,
                                      int m, int k, bool accumulate, int n_begin, int n_end) {
  const uint16_t* w16 = static_cast<const uint16_t*>(w);
  if (m <= 3) {
    // A skinny product (a decode step's expert with its few rows): wider
    // tiles of prefetched weight rows keep more of memory's lines in flight;
    // 8 (6 at 3 rows) weight rows a tile still fit the 32 registers.
    // Each output is summed in the same order as in the 4x4 tiles.
    auto wide = [&](auto jb, auto ib) {
      constexpr int JB = decltype(jb)::value, IB = decltype(ib)::value;
      int j0 = n_begin;
      for (; j0 + JB <= n_end; j0 += JB) {
        TileDot<JB, IB, true>(x_bf16, w16, out, ldo, k, accumulate, j0, 0);
      }
      ForEachTile(IB, j0, n_end, [&](auto jr, auto ir, int j, int i) {
        TileDot<decltype(jr)::value, decltype(ir)::value, true>(x_bf16, w16, out, ldo, k,
                                                                accumulate, j, i);
      });
    };
    if (m == 1) wide(std::integral_constant<int, 8>{}, std::integral_constant<int, 1>{});
    if (m == 2) wide(std::integral_constant<int, 8>{}, std::integral_constant<int, 2>{});
    if (m == 3) wide(std::integral_constant<int, 6>{}, std::integral_constant<int, 3>{});
    return;
  }
  // About 256 KiB of inputs per block, in whole 4-row tiles.
  const int block = std::max(4, (128 << 10) / std::max(k, 1) / 4 * 4);
  for (int r0 = 0; r0 < m; r0 += block) {
    const int rows = std::min(block, m - r0);
    const uint16_t* xb = x_bf16 + static_cast<long>(r0) * k;
    float* ob = out + static_cast<long>(r0) * ldo;
    ForEachTile(rows, n_begin, n_end, [&](auto jb, auto ib, int j0, int i0) {
      TileDot<decltype(jb)::value, decltype(ib)::value>(xb, w16, ob, ldo, k, accumulate, j0, i0);
    });
  }
}

bool SmallMatMulSupported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}

void SmallMatMul(const float* x, const float* w, float* out, int m, int n, int k, bool accumulate,
                 int n_begin, int n_end) {
  int j0 = n_begin;
  for (; j0 + 4 <= n_end; j0 += 4) Column<4>(x, w, out, m, n, k, accumulate, j0);
  switch (n_end - j0) {
    case 3:
      Column<3>(x, w, out, m, n, k, accumulate, j0);
      break;
    case 2:
      Column<2>(x, w, out, m, n, k, accumulate, j0);
      break;
    case 1:
      Column<1>(x, w, out, m, n, k, accumulate, j0);
      break;
    default:
      break;
  }
}

}  // namespace tandem::cpu
