#include "common/compute/cpu/cpu_kernels.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "common/compute/cpu/half.h"
#include "common/kvcache/int8_kv.h"

// Vec16 values never cross a call boundary (every helper is inlined into its
// caller's clone), so GCC's note that their ABI depends on the ISA is moot.
#pragma GCC diagnostic ignored "-Wpsabi"

// Plain loops the compiler vectorises for each target; `omp simd
// reduction` lets it reorder sums into lanes without -ffast-math. Sanitizer
// builds that define TANDEM_NO_TARGET_CLONES (ThreadSanitizer: the clones'
// IFUNC resolvers run, instrumented, before its runtime starts, and crash)
// get the default version only.
#ifdef TANDEM_NO_TARGET_CLONES
#define TANDEM_MULTIVERSION
#else
#define TANDEM_MULTIVERSION __attribute__((target_clones("avx512f", "arch=haswell", "default")))
#endif

namespace tandem::cpu {
namespace {

// e^x from arithmetic and bit operations only, so that loops calling it
// vectorise (libm's expf does not without -ffast-math). Cody-Waite range
// reduction x = n ln2 + r, then a degree-6 polynomial for e^r (the Cephes
// coefficients); relative error about 1e-7, at the level of float rounding.
// Inputs are clamped to [-87, 88], inside float's normal range (so e^x for
// x < -87 is 1.6e-38 rather than smaller; far below any tolerance). The
// comparisons are written so that NaN maps to -87 instead of reaching the
// integer conversion.
inline float Exp(float x) {
  x = x >= -87.0f ? (x > 88.0f ? 88.0f : x) : -87.0f;
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
}

}  // namespace

const char* KernelIsa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return "avx512f";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "avx2+fma";
  return "x86-64";
}

TANDEM_MULTIVERSION
void RmsNormRow(const float* x, const float* weight, float* out, int dim, float eps) {
  float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
  for (int i = 0; i < dim; ++i) ss += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
#pragma omp simd
  for (int i = 0; i < dim; ++i) out[i] = weight[i] * (scale * x[i]);
}

TANDEM_MULTIVERSION
void SwiGluRow(const float* gate, const float* up, float* out, int n) {
#pragma omp simd
  for (int i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + Exp(-g)) * up[i];
  }
}

TANDEM_MULTIVERSION
void RopeRow(float* x, int n_heads, int head_dim, const float* cos_sin, bool half_split) {
  const int half = head_dim / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim;
    if (half_split) {
#pragma omp simd
      for (int i = 0; i < half; ++i) {
        const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
        const float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = a * s + b * c;
      }
      continue;
    }
#pragma omp simd
    for (int i = 0; i < half; ++i) {
      const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
      const float a = v[2 * i], b = v[2 * i + 1];
      v[2 * i] = a * c - b * s;
      v[2 * i + 1] = a * s + b * c;
    }
  }
}

namespace {

template <typename T>
__attribute__((always_inline)) inline void WidenT(const T* src, float* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = ToFloat(src[i]);
}

template <typename T>
__attribute__((always_inline)) inline void NarrowT(const float* src, T* dst, int64_t n,
                                                   int64_t stride) {
  for (int64_t i = 0; i < n; ++i) dst[i * stride] = FromFloat<T>(src[i]);
}

}  // namespace

TANDEM_MULTIVERSION
void Widen(const void* src, DType dtype, float* dst, int64_t n) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kBF16:
      WidenT(static_cast<const Bf16*>(src), dst, n);
      return;
    case DType::kF16:
      WidenT(static_cast<const Fp16*>(src), dst, n);
      return;
    default:  // element types only: quantized rows go through DequantizeRow, int8 WidenInt8
      return;
  }
}

TANDEM_MULTIVERSION
void Narrow(const float* src, DType dtype, void* dst, int64_t n, int64_t stride) {
  switch (dtype) {
    case DType::kF32:
      NarrowT(src, static_cast<float*>(dst), n, stride);
      return;
    case DType::kBF16:
      NarrowT(src, static_cast<Bf16*>(dst), n, stride);
      return;
    case DType::kF16:
      NarrowT(src, static_cast<Fp16*>(dst), n, stride);
      return;
    default:  // int8 goes through QuantizeInt8; nothing is narrowed to a weight block type
      return;
  }
}

TANDEM_MULTIVERSION
void WidenInt8(const int8_t* src, const float* scales, float scale, float* dst, int64_t n) {
  if (scales == nullptr) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]) * scale;
    return;
  }
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]) * scales[i];
}

TANDEM_MULTIVERSION
void QuantizeInt8(const float* src, int64_t n, int8_t* dst, int64_t stride, float* scale) {
  float amax = 0.0f;
#pragma omp simd reduction(max : amax)
  for (int64_t i = 0; i < n; ++i) {
    // NaN compares false, so a NaN leaves amax alone; the check below finds it.
    const float a = std::fabs(src[i]);
    amax = a > amax ? a : amax;
  }
  bool finite = std::isfinite(amax);
  for (int64_t i = 0; i < n && finite; ++i) finite = !std::isnan(src[i]);
  if (!finite) {
    // As a float cache would hold them: every value of this head reads NaN.
    *scale = std::numeric_limits<float>::quiet_NaN();
    for (int64_t i = 0; i < n; ++i) dst[i * stride] = 0;
    return;
  }
  *scale = Int8KvScale(amax);
  const float inverse = Int8KvInverse(amax);
  if (stride == 1) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] = Int8KvRound(src[i], inverse);
    return;
  }
  for (int64_t i = 0; i < n; ++i) dst[i * stride] = Int8KvRound(src[i], inverse);
}

TANDEM_MULTIVERSION
void CausalSoftmaxRow(float* row, int valid, int width) {
  float max = row[0];
  for (int t = 1; t < valid; ++t) max = row[t] > max ? row[t] : max;
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int t = 0; t < valid; ++t) {
    row[t] = Exp(row[t] - max);
    sum += row[t];
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (int t = 0; t < valid; ++t) row[t] *= inv;
#pragma omp simd
  for (int t = valid; t < width; ++t) row[t] = 0.0f;
}

namespace {

// 16 floats as one value; lowers to whatever vector width the clone has.
typedef float Vec16 __attribute__((vector_size(64)));

typedef uint16_t U16x16 __attribute__((vector_size(32)));
typedef uint32_t U32x16 __attribute__((vector_size(64)));
typedef _Float16 H16 __attribute__((vector_size(32)));
typedef int8_t I8x16 __attribute__((vector_size(16)));

__attribute__((always_inline)) inline Vec16 Load16(const float* p) {
  Vec16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
__attribute__((always_inline)) inline Vec16 Load16(const Bf16* p) {
  U16x16 h;
  std::memcpy(&h, p, sizeof(h));
  const U32x16 w = __builtin_convertvector(h, U32x16) << 16;
  Vec16 v;
  std::memcpy(&v, &w, sizeof(v));
  return v;
}
__attribute__((always_inline)) inline Vec16 Load16(const Fp16* p) {
  H16 h;
  std::memcpy(&h, p, sizeof(h));
  return __builtin_convertvector(h, Vec16);
}
__attribute__((always_inline)) inline Vec16 Load16(const int8_t* p) {
  I8x16 b;
  std::memcpy(&b, p, sizeof(b));
  return __builtin_convertvector(b, Vec16);
}

// The f32 scales of an int8 block at byte offset `offset` of the cache.
__attribute__((always_inline)) inline const float* ScalesAt(const void* cache, size_t offset) {
  return reinterpret_cast<const float*>(static_cast<const uint8_t*>(cache) + offset);
}

// Scores of the 16 slots of a full block for one query head: keys are
// dimension-major, so each dimension is one vector FMA; four accumulators
// hide the FMA latency.
template <typename T>
__attribute__((always_inline)) inline Vec16 BlockScores16(const float* qh, const T* keys,
                                                          int head_dim, float scale) {
  Vec16 acc[4] = {};
  int d = 0;
  for (; d + 4 <= head_dim; d += 4) {
    for (int u = 0; u < 4; ++u) acc[u] += (qh[d + u] * scale) * Load16(keys + (d + u) * 16);
  }
  for (; d < head_dim; ++d) acc[0] += (qh[d] * scale) * Load16(keys + d * 16);
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

// out[0, 16 * C) = sum over t of p[t] * values(t), accumulated in registers.
template <int C, typename T>
__attribute__((always_inline)) inline void WeightedValues(const float* p, int n,
                                                          const AttentionRow& row, int layer,
                                                          const KvLayout& layout, const T* cache,
                                                          int kv_off, float* out) {
  Vec16 acc[C] = {};
  const int bs = layout.block_size;
  for (int t = 0; t < n; ++t) {
    const T* v = cache + layout.ValueOffset(layer, row.blocks[t / bs], t % bs) + kv_off;
    for (int c = 0; c < C; ++c) acc[c] += p[t] * Load16(v + 16 * c);
  }
  std::memcpy(out, acc, sizeof(acc));
}

template <typename T>
__attribute__((always_inline)) inline void AttendGroupT(const float* q, const AttentionRow& row,
                                                        int kv_head, int group, int head_dim,
                                                        int layer, const KvLayout& layout,
                                                        const T* cache, float* scores, float* out) {
  constexpr bool kScaled = std::is_same_v<T, int8_t>;
  const int n = row.position + 1;
  const int bs = layout.block_size;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const int kv_off = kv_head * head_dim;

  // Scores a block at a time: keys are stored dimension-major within a
  // block, so each key dimension updates all the block's slots at once.
  for (int t0 = 0; t0 < n; t0 += bs) {
    const int valid = n - t0 < bs ? n - t0 : bs;
    const int32_t block_id = row.blocks[t0 / bs];
    const T* keys = cache + layout.KeyOffset(layer, block_id, 0, kv_off);
    // int8: each slot's scores take its key scale once the bytes are summed.
    const float* key_scales = nullptr;
    if constexpr (kScaled) {
      key_scales = ScalesAt(cache, layout.KeyScaleOffset(layer, block_id, kv_head));
    }
    for (int g = 0; g < group; ++g) {
      const float* qh = q + g * head_dim;
      float* s = scores + g * n + t0;
      if (bs == 16 && valid == 16) {
        Vec16 block = BlockScores16(qh, keys, head_dim, scale);
        if constexpr (kScaled) block *= Load16(key_scales);
        std::memcpy(s, &block, sizeof(block));
        continue;
      }
      for (int j = 0; j < valid; ++j) s[j] = 0.0f;
      for (int d = 0; d < head_dim; ++d) {
        const float qd = qh[d] * scale;
        const T* kd = keys + d * bs;
#pragma omp simd
        for (int j = 0; j < valid; ++j) s[j] += qd * ToFloat(kd[j]);
      }
      if constexpr (kScaled) {
        for (int j = 0; j < valid; ++j) s[j] *= key_scales[j];
      }
    }
  }

  for (int g = 0; g < group; ++g) {
    const float* p = scores + g * n;
    CausalSoftmaxRow(scores + g * n, n, n);
    if constexpr (kScaled) {
      // Each slot's weight takes its value scale, so the sum below reads bytes.
      for (int t0 = 0; t0 < n; t0 += bs) {
        const float* value_scales =
            ScalesAt(cache, layout.ValueScaleOffset(layer, row.blocks[t0 / bs], kv_head));
        float* w = scores + g * n + t0;
        for (int j = 0; j < bs && t0 + j < n; ++j) w[j] *= value_scales[j];
      }
    }
    float* o = out + g * head_dim;
    switch (head_dim) {
      case 32:
        WeightedValues<2>(p, n, row, layer, layout, cache, kv_off, o);
        continue;
      case 48:
        WeightedValues<3>(p, n, row, layer, layout, cache, kv_off, o);
        continue;
      case 64:
        WeightedValues<4>(p, n, row, layer, layout, cache, kv_off, o);
        continue;
      case 96:
        WeightedValues<6>(p, n, row, layer, layout, cache, kv_off, o);
        continue;
      case 128:
        WeightedValues<8>(p, n, row, layer, layout, cache, kv_off, o);
        continue;
      default:
        break;
    }
    for (int i = 0; i < head_dim; ++i) o[i] = 0.0f;
    for (int t = 0; t < n; ++t) {
      const T* v = cache + layout.ValueOffset(layer, row.blocks[t / bs], t % bs) + kv_off;
#pragma omp simd
      for (int i = 0; i < head_dim; ++i) o[i] += p[t] * ToFloat(v[i]);
    }
  }
}

}  // namespace

TANDEM_MULTIVERSION
void AttendGroup(const float* q, const AttentionRow& row, int kv_head, int group, int head_dim,
                 int layer, const KvLayout& layout, const void* cache, float* scores, float* out) {
  switch (layout.dtype) {
    case DType::kF32:
      AttendGroupT(q, row, kv_head, group, head_dim, layer, layout,
                   static_cast<const float*>(cache), scores, out);
      return;
    case DType::kBF16:
      AttendGroupT(q, row, kv_head, group, head_dim, layer, layout, static_cast<const Bf16*>(cache),
                   scores, out);
      return;
    case DType::kF16:
      AttendGroupT(q, row, kv_head, group, head_dim, layer, layout, static_cast<const Fp16*>(cache),
                   scores, out);
      return;
    case DType::kI8:
      AttendGroupT(q, row, kv_head, group, head_dim, layer, layout,
                   static_cast<const int8_t*>(cache), scores, out);
      return;
    default:  // a KV cache is never block-quantized
      return;
  }
}

}  // namespace tandem::cpu
