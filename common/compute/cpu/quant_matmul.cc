#include "common/compute/cpu/quant_matmul.h"

#include <immintrin.h>

// GCC 12 reports its own AVX-512 intrinsics (the undefined-vector idiom in
// the masked loads, inserts and conversions) as used or maybe used
// uninitialized (GCC bug 105593, fixed in GCC 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "common/base/quant_blocks.h"
#include "common/compute/cpu/quant_repack.h"

namespace tandem::cpu {
namespace {

#define TANDEM_VNNI \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
// The row kernels are inlined into Row so that the accumulators live in
// registers, not on the stack behind a pointer.
#define TANDEM_VNNI_INLINE                                                              \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni"), \
                 always_inline)) inline

// Activation rows taken together per pass over a weight row: each pass
// unpacks the row's weights once for all of them.
constexpr int kRowGroup = 8;

// neg_sums index of each offset's shift: 8 = 1 << 3, 128 = 1 << 7.
constexpr int kOffset8 = 0, kOffset128 = 1;

// The rows of one pass: activations r0 .. r0 + R - 1.
struct Pass {
  const QuantizedRows& x;
  int r0;
};

// Runs f(pass, rows) over x's activation rows in passes of 8, then of 4,
// then the 1 to 3 left; rows is a std::integral_constant, for the kernels'
// template argument.
template <typename F>
void ForEachPass(const QuantizedRows& x, F&& f) {
  for (int r0 = 0, rows = 0; r0 < x.m; r0 += rows) {
    const Pass pass{x, r0};
    rows = x.m - r0 >= 8 ? 8 : std::min(4, x.m - r0);
    switch (rows) {
      case 1:
        f(pass, std::integral_constant<int, 1>{});
        break;
      case 2:
        f(pass, std::integral_constant<int, 2>{});
        break;
      case 3:
        f(pass, std::integral_constant<int, 3>{});
        break;
      case 4:
        f(pass, std::integral_constant<int, 4>{});
        break;
      default:
        f(pass, std::integral_constant<int, 8>{});
        break;
    }
  }
}

// Q8_0 and Q4_0: 64 weights starting at element e (16 lanes of 4; `lanes`
// 0x00ff for a row's last 32), unsigned bytes `wq` with per-lane scales
// `ws`, offset by neg_sums[offset], times the activations' per-lane scales.
template <int R>
TANDEM_VNNI_INLINE void SmallChunk(const Pass& p, int e, __m512i wq, __m512 ws, int offset,
                                   __mmask16 lanes, __m512* acc) {
  const QuantizedRows& x = p.x;
  const int k = x.k, k4 = x.k / 4;
  const __mmask64 bytes = lanes == 0xffff ? ~__mmask64{0} : __mmask64{0xffffffff};
  for (int r = 0; r < R; ++r) {
    const int row = p.r0 + r;
    __m512i sum = _mm512_maskz_loadu_epi32(lanes, x.neg_sums[offset].data() + row * k4 + e / 4);
    sum = _mm512_dpbusd_epi32(sum, wq, _mm512_maskz_loadu_epi8(bytes, x.q.data() + row * k + e));
    const __m512 scale =
        _mm512_mul_ps(ws, _mm512_maskz_loadu_ps(lanes, x.lane_scale.data() + row * k4 + e / 4));
    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scale, acc[r]);
  }
}

// K types: 64 weights against the 64 activations stored at e (in the
// type's order), into the block's sums `t`; the activations' scale, one a
// block, multiplies `t` once a block.
template <int R>
TANDEM_VNNI_INLINE void KChunk(const Pass& p, int e, __m512i wq, __m512 ws, __m512* t) {
  for (int r = 0; r < R; ++r) {
    const __m512i sum = _mm512_dpbusd_epi32(
        _mm512_setzero_si512(), wq, _mm512_loadu_si512(p.x.q.data() + (p.r0 + r) * p.x.k + e));
    t[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), ws, t[r]);
  }
}

TANDEM_VNNI_INLINE float Half(uint16_t h) { return _cvtsh_ss(h); }

// Permutations that spread a block's scales over the 16 lanes of a chunk.
// Q4_K and Q5_K (a scale per 32 values, 8 lanes): kLowNibbles[h] lane i
// takes scale 4h + 2 (i / 8), kHighNibbles[h] 4h + 1 + 2 (i / 8) (see
// QuantizeRows for the order). Q6_K (a scale per 16 values, 4 lanes):
// kByFour[q] lane i takes scale 4q + i / 4.
constexpr auto kLowNibbles = [] {
  std::array<std::array<int32_t, 16>, 2> idx{};
  for (int h = 0; h < 2; ++h) {
    for (int i = 0; i < 16; ++i) idx[h][i] = 4 * h + 2 * (i / 8);
  }
  return idx;
}();
constexpr auto kHighNibbles = [] {
  std::array<std::array<int32_t, 16>, 2> idx{};
  for (int h = 0; h < 2; ++h) {
    for (int i = 0; i < 16; ++i) idx[h][i] = 4 * h + 1 + 2 * (i / 8);
  }
  return idx;
}();
constexpr auto kByFour = [] {
  std::array<std::array<int32_t, 16>, 4> idx{};
  for (int q = 0; q < 4; ++q) {
    for (int i = 0; i < 16; ++i) idx[q][i] = 4 * q + i / 4;
  }
  return idx;
}();

TANDEM_VNNI_INLINE __m512i Index(const std::array<int32_t, 16>& idx) {
  return _mm512_loadu_si512(idx.data());
}

TANDEM_VNNI_INLINE __m512i Join(__m256i lo, __m256i hi) {
  return _mm512_inserti64x4(_mm512_zextsi256_si512(lo), hi, 1);
}

TANDEM_VNNI_INLINE __m512 TwoScales(float a, float b) {
  return _mm512_insertf32x8(_mm512_set1_ps(a), _mm256_set1_ps(b), 1);
}

// Block b of a Q8_0 or Q4_0 row as 32 unsigned bytes, and its scale.
template <bool kQ8>
TANDEM_VNNI_INLINE __m256i UnpackSmall(const uint8_t* row, int b) {
  if constexpr (kQ8) {
    const auto* blk = reinterpret_cast<const BlockQ8_0*>(row) + b;
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qs)),
                            _mm256_set1_epi8(static_cast<char>(0x80)));
  } else {
    const auto* blk = reinterpret_cast<const BlockQ4_0*>(row) + b;
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk->qs));
    const __m256i both =
        _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
  }
}

template <bool kQ8>
TANDEM_VNNI_INLINE float SmallScale(const uint8_t* row, int b) {
  return Half(kQ8 ? reinterpret_cast<const BlockQ8_0*>(row)[b].d
                  : reinterpret_cast<const BlockQ4_0*>(row)[b].d);
}

// Q8_0 and Q4_0: pairs of 32-value blocks, a lone last block masked.
template <int R, bool kQ8>
TANDEM_VNNI_INLINE void RowSmallBlocks(const Pass& p, const uint8_t* row, __m512* acc) {
  const int blocks = p.x.k / 32;
  const int offset = kQ8 ? kOffset128 : kOffset8;
  int b = 0;
  for (; b + 1 < blocks; b += 2) {
    SmallChunk<R>(p, 32 * b, Join(UnpackSmall<kQ8>(row, b), UnpackSmall<kQ8>(row, b + 1)),
                  TwoScales(SmallScale<kQ8>(row, b), SmallScale<kQ8>(row, b + 1)), offset, 0xffff,
                  acc);
  }
  if (b < blocks) {
    SmallChunk<R>(p, 32 * b, _mm512_zextsi256_si512(UnpackSmall<kQ8>(row, b)),
                  _mm512_set1_ps(SmallScale<kQ8>(row, b)), offset, 0x00ff, acc);
  }
}

// Adds a block's sums, times each row's activation scale for the block.
template <int R>
TANDEM_VNNI_INLINE void EndBlock(const Pass& p, int sb, __m512* t, __m512* acc) {
  const int blocks = p.x.k / 256;
  for (int r = 0; r < R; ++r) {
    acc[r] =
        _mm512_fmadd_ps(t[r], _mm512_set1_ps(p.x.block_scale[(p.r0 + r) * blocks + sb]), acc[r]);
    t[r] = _mm512_setzero_ps();
  }
}

// Q4_K and Q5_K: 64 bytes of nibbles at a time, the low nibbles (values
// 0-31 and 64-95 of 128) then the high ones; the minima come off with the
// activations' sums.
template <int R, bool kQ5>
TANDEM_VNNI_INLINE void RowK4(const Pass& p, const uint8_t* row, __m512* acc) {
  const QuantizedRows& x = p.x;
  const int blocks = x.k / 256, k32 = x.k / 32;
  const __m512i low4 = _mm512_set1_epi8(0x0f), one = _mm512_set1_epi8(1);
  __m512 t[R];
  for (int r = 0; r < R; ++r) t[r] = _mm512_setzero_ps();
  for (int sb = 0; sb < blocks; ++sb) {
    const uint8_t* block = row + sb * DTypeBlockBytes(kQ5 ? DType::kQ5_K : DType::kQ4_K);
    const uint8_t* scales = block + 4;
    const uint8_t* qh = scales + 12;
    const uint8_t* qs = kQ5 ? qh + 32 : qh;
    uint16_t half[2];
    std::memcpy(half, block, 4);
    // The eight 6-bit scales and minima (K4ScaleMin), four bytes at a time.
    uint32_t w[3];
    std::memcpy(w, scales, 12);
    const uint32_t sc[2] = {w[0] & 0x3f3f3f3f, (w[2] & 0x0f0f0f0f) | ((w[0] >> 2) & 0x30303030)};
    const uint32_t mn[2] = {w[1] & 0x3f3f3f3f,
                            ((w[2] >> 4) & 0x0f0f0f0f) | ((w[1] >> 2) & 0x30303030)};
    const __m128i sc8 = _mm_set_epi32(0, 0, static_cast<int>(sc[1]), static_cast<int>(sc[0]));
    const __m128i mn8 = _mm_set_epi32(0, 0, static_cast<int>(mn[1]), static_cast<int>(mn[0]));
    const __m512 sv =
        _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sc8)), _mm512_set1_ps(Half(half[0])));
    // Minima in lanes 0-7, times each row's sums of its 32-value sub-blocks.
    const __m512 mv =
        _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(mn8)), _mm512_set1_ps(Half(half[1])));
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm512_fnmadd_ps(
          mv, _mm512_maskz_loadu_ps(0x00ff, x.block_sum.data() + (p.r0 + r) * k32 + 8 * sb),
          acc[r]);
    }
    __m256i qh32 = _mm256_setzero_si256();
    if constexpr (kQ5) qh32 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
    for (int h = 0; h < 2; ++h) {
      const __m512i q = _mm512_loadu_si512(qs + 64 * h);
      __m512i lo = _mm512_and_si512(q, low4);
      __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), low4);
      if constexpr (kQ5) {
        // Fifth bits of chunks 2h (bits 4h, 4h + 1) and 2h + 1 (4h + 2, 4h + 3).
        const __m512i bits = Join(qh32, _mm256_srli_epi16(qh32, 2));
        lo = _mm512_or_si512(lo, _mm512_slli_epi16(_mm512_and_si512(bits, one), 4));
        hi = _mm512_or_si512(
            hi, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(bits, 1), one), 4));
        qh32 = _mm256_srli_epi16(qh32, 4);
      }
      const int e = 256 * sb + 128 * h;
      KChunk<R>(p, e, lo, _mm512_permutexvar_ps(Index(kLowNibbles[h]), sv), t);
      KChunk<R>(p, e + 64, hi, _mm512_permutexvar_ps(Index(kHighNibbles[h]), sv), t);
    }
    EndBlock<R>(p, sb, t, acc);
  }
}

// Q6_K: two halves of 128 per block, each two chunks of 64; the offset of
// 32 comes off with the activations' sums of 16.
template <int R>
TANDEM_VNNI_INLINE void RowQ6K(const Pass& p, const uint8_t* row, __m512* acc) {
  const int blocks = p.x.k / 256, k16 = p.x.k / 16;
  const __m512i low4 = _mm512_set1_epi8(0x0f), low2 = _mm512_set1_epi8(0x03);
  __m512 t[R];
  for (int r = 0; r < R; ++r) t[r] = _mm512_setzero_ps();
  for (int sb = 0; sb < blocks; ++sb) {
    const auto* b = reinterpret_cast<const BlockQ6_K*>(row) + sb;
    const __m512 sv = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                                        reinterpret_cast<const __m128i*>(b->scales)))),
                                    _mm512_set1_ps(Half(b->d)));
    const __m512 sv32 = _mm512_mul_ps(sv, _mm512_set1_ps(32.0f));
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm512_fnmadd_ps(
          sv32, _mm512_loadu_ps(p.x.sum16.data() + (p.r0 + r) * k16 + 16 * sb), acc[r]);
    }
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = _mm512_loadu_si512(b->ql + 64 * h);
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qh + 32 * h));
      const __m512i qh_a = Join(qh, _mm256_srli_epi16(qh, 2));
      const __m512i qh_b = Join(_mm256_srli_epi16(qh, 4), _mm256_srli_epi16(qh, 6));
      const __m512i a = _mm512_or_si512(_mm512_and_si512(ql, low4),
                                        _mm512_slli_epi16(_mm512_and_si512(qh_a, low2), 4));
      const __m512i bq = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4),
                                         _mm512_slli_epi16(_mm512_and_si512(qh_b, low2), 4));
      const int e = 256 * sb + 128 * h;
      KChunk<R>(p, e, a, _mm512_permutexvar_ps(Index(kByFour[2 * h]), sv), t);
      KChunk<R>(p, e + 64, bq, _mm512_permutexvar_ps(Index(kByFour[2 * h + 1]), sv), t);
    }
    EndBlock<R>(p, sb, t, acc);
  }
}

template <int R>
TANDEM_VNNI void Row(const Pass& p, const uint8_t* row, DType dtype, float* sums) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  switch (dtype) {
    case DType::kQ8_0:
      RowSmallBlocks<R, true>(p, row, acc);
      break;
    case DType::kQ4_0:
      RowSmallBlocks<R, false>(p, row, acc);
      break;
    case DType::kQ4_K:
      RowK4<R, false>(p, row, acc);
      break;
    case DType::kQ5_K:
      RowK4<R, true>(p, row, acc);
      break;
    case DType::kQ6_K:
      RowQ6K<R>(p, row, acc);
      break;
    default:
      break;
  }
  for (int r = 0; r < R; ++r) {
    sums[r] = _mm512_reduce_add_ps(acc[r]);
  }
}

// kQ8_0R16: one group of 16 weight rows against R activation rows, the 16
// rows' sums in the lanes of one register per activation row. Each block
// starts each row's integer sums at -128 times its activations' sum (the
// weights' bytes are q + 128), adds eight dot products of 64 weight bytes
// with four activations broadcast, and is scaled once: by the 16 rows'
// block scales times the row's activation scale. With few rows, two chains
// of dot products per row, so that each waits on half as many. (The
// conversions are the masked forms with every lane set: GCC 12 warns of an
// uninitialised register in the plain ones.)
template <int R>
TANDEM_VNNI void GroupR16(const Pass& p, const uint8_t* group, float* out, int ldo,
                          bool accumulate) {
  const QuantizedRows& x = p.x;
  const int k = x.k, blocks = k / 32, k4 = k / 4;
  constexpr int kChains = R <= 4 ? 2 : 1;
  const uint16_t* scales = reinterpret_cast<const uint16_t*>(group);
  const uint8_t* quants = group + k;
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int b = 0; b < blocks; ++b) {
    __m512i s[kChains][R];
    for (int r = 0; r < R; ++r) {
      s[0][r] = _mm512_set1_epi32(x.block_neg_sums[(p.r0 + r) * blocks + b]);
      if constexpr (kChains == 2) s[1][r] = _mm512_setzero_si512();
    }
    const uint8_t* qb = quants + 512 * b;
#pragma GCC unroll 8
    for (int c = 0; c < 8; c += kChains) {
#pragma GCC unroll 2
      for (int h = 0; h < kChains; ++h) {
        const __m512i w = _mm512_loadu_si512(qb + 64 * (c + h));
        for (int r = 0; r < R; ++r) {
          int32_t a;
          std::memcpy(&a, x.q.data() + (p.r0 + r) * k + 32 * b + 4 * (c + h), 4);
          s[h][r] = _mm512_dpbusd_epi32(s[h][r], w, _mm512_set1_epi32(a));
        }
      }
    }
    const __m512 ws = _mm512_maskz_cvtph_ps(
        0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + kRepackRows * b)));
    for (int r = 0; r < R; ++r) {
      __m512i sum = s[0][r];
      if constexpr (kChains == 2) sum = _mm512_add_epi32(sum, s[1][r]);
      const __m512 scale = _mm512_mul_ps(ws, _mm512_set1_ps(x.lane_scale[(p.r0 + r) * k4 + 8 * b]));
      acc[r] = _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(0xffff, sum), scale, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float* o = out + static_cast<int64_t>(p.r0 + r) * ldo;
    _mm512_storeu_ps(o, accumulate ? _mm512_add_ps(_mm512_loadu_ps(o), acc[r]) : acc[r]);
  }
}

// kQ8_0R16 over the groups of columns [n_begin, n_end), in passes of 8,
// then 4, then 1 to 3 activation rows.
TANDEM_VNNI void MatMulR16(const QuantizedRows& x, const void* w, float* out, int ldo,
                           bool accumulate, int n_begin, int n_end) {
  const size_t group_bytes = static_cast<size_t>(17) * x.k;
  for (int j = n_begin; j < n_end; j += kRepackRows) {
    const uint8_t* group = static_cast<const uint8_t*>(w) + group_bytes * (j / kRepackRows);
    ForEachPass(x, [&](const Pass& pass, auto rows) {
      GroupR16<decltype(rows)::value>(pass, group, out + j, ldo, accumulate);
    });
  }
}

}  // namespace

bool QuantMatMulSupported() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vnni");
}

bool QuantMatMulHandles(DType dtype) {
  switch (dtype) {
    case DType::kQ8_0:
    case DType::kQ8_0R16:
    case DType::kQ4_0:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      return true;
    default:
      return false;
  }
}

void QuantizeRows(const float* x, int m, int k, DType dtype, QuantizedRows* rows) {
  rows->m = m;
  rows->k = k;
  rows->dtype = dtype;
  const size_t n = static_cast<size_t>(m) * k;
  rows->q.resize(n);
  const bool repacked = dtype == DType::kQ8_0R16;
  const bool small = dtype == DType::kQ8_0 || dtype == DType::kQ4_0 || repacked;
  // Values per activation scale: as llama.cpp rounds activations for each
  // type (its Q8_0 and Q8_K).
  const int group = small ? 32 : 256;
  if (small) {
    rows->lane_scale.resize(n / 4);
    for (auto& sums : rows->neg_sums) sums.resize(n / 4);
    if (repacked) rows->block_neg_sums.resize(n / 32);
  } else {
    rows->block_scale.resize(n / 256);
    rows->block_sum.resize(n / 32);
    rows->sum16.resize(n / 16);
  }
  int8_t rounded[256];
  for (size_t g = 0; g < n / group; ++g) {
    const float* in = x + group * g;
    float amax = 0;
    for (int i = 0; i < group; ++i) amax = std::max(amax, std::fabs(in[i]));
    const float scale = amax / 127, inverse = amax > 0 ? 127 / amax : 0;
    for (int i = 0; i < group; ++i) {
      rounded[i] =
          static_cast<int8_t>(std::clamp(std::nearbyint(in[i] * inverse), -127.0f, 127.0f));
    }
    int8_t* q = rows->q.data() + group * g;
    if (small) {
      std::memcpy(q, rounded, 32);
      if (repacked) {
        int32_t sum = 0;
        for (int i = 0; i < 32; ++i) sum += rounded[i];
        rows->block_neg_sums[g] = -sum * 128;
      }
      for (int lane = 0; lane < 8; ++lane) {
        const int32_t sum = rounded[4 * lane] + rounded[4 * lane + 1] + rounded[4 * lane + 2] +
                            rounded[4 * lane + 3];
        const size_t at = 8 * g + lane;
        rows->lane_scale[at] = scale;
        rows->neg_sums[kOffset8][at] = -sum * 8;
        rows->neg_sums[kOffset128][at] = -sum * 128;
      }
      continue;
    }
    rows->block_scale[g] = scale;
    for (int j = 0; j < 16; ++j) {
      int32_t sum = 0;
      for (int i = 16 * j; i < 16 * j + 16; ++i) sum += rounded[i];
      rows->sum16[16 * g + j] = scale * static_cast<float>(sum);
    }
    for (int j = 0; j < 8; ++j) {
      rows->block_sum[8 * g + j] = rows->sum16[16 * g + 2 * j] + rows->sum16[16 * g + 2 * j + 1];
    }
    if (dtype == DType::kQ6_K) {
      std::memcpy(q, rounded, 256);
    } else {
      // Q4_K and Q5_K read 64 bytes of nibbles at a time: the low nibbles
      // are values 0-31 and 64-95 of each 128, the high ones 32-63 and
      // 96-127; the activations are stored in that order.
      for (int h = 0; h < 2; ++h) {
        const int8_t* from = rounded + 128 * h;
        int8_t* to = q + 128 * h;
        std::memcpy(to, from, 32);
        std::memcpy(to + 32, from + 64, 32);
        std::memcpy(to + 64, from + 32, 32);
        std::memcpy(to + 96, from + 96, 32);
      }
    }
  }
}

void QuantMatMul(const QuantizedRows& x, const void* w, float* out, int ldo, bool accumulate,
                 int n_begin, int n_end) {
  const DType dtype = x.dtype;
  if (dtype == DType::kQ8_0R16) {
    MatMulR16(x, w, out, ldo, accumulate, n_begin, n_end);
    return;
  }
  const size_t row_bytes = DTypeBytes(dtype, x.k);
  float sums[kRowGroup];
  for (int j = n_begin; j < n_end; ++j) {
    const uint8_t* row = static_cast<const uint8_t*>(w) + row_bytes * j;
    ForEachPass(x, [&](const Pass& pass, auto rows) {
      Row<decltype(rows)::value>(pass, row, dtype, sums);
      for (int r = 0; r < rows; ++r) {
        float& o = out[static_cast<int64_t>(pass.r0 + r) * ldo + j];
        o = accumulate ? o + sums[r] : sums[r];
      }
    });
  }
}

}  // namespace tandem::cpu
