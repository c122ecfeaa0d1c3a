// Prefill attention on the tensor cores, for a bf16 or f16 KV cache:
// mma.sync m16n8k16 with f32 accumulation, in the manner of
// FlashAttention-2. One block of 4 warps per (query head, tile of up to 64
// queries); each warp owns 16 query rows, holds them as mma operands in
// registers (scaled, rounded to the cache's type) for the whole pass, and
// walks the causal context in tiles of 64 keys staged in shared memory as
// they are stored (16-bit). Scores stay in registers: their accumulator
// layout is the operand layout of the next product, so P (rounded to the
// cache's type) never goes through shared memory. Softmax is online, in
// base 2, with the row max reduced over the 4 lanes that share a row.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "common/compute/cuda/elements.cuh"
#include "common/compute/cuda/kernels.h"
#include "common/compute/cuda/prefill_mma.h"

namespace tandem::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kQueryRows = 16 * kWarpsPerBlock;
static_assert(kQueryRows == kPrefillTileRows);
constexpr int kKeys = 64;  // keys per KV tile
constexpr int kPad = 8;    // 16 bytes per shared row: ldmatrix rows hit distinct banks

__device__ __forceinline__ uint32_t Pack(Bf16 lo, Bf16 hi) {
  return static_cast<uint32_t>(lo.bits) | (static_cast<uint32_t>(hi.bits) << 16);
}
__device__ __forceinline__ uint32_t Pack(F16 lo, F16 hi) {
  return static_cast<uint32_t>(lo.bits) | (static_cast<uint32_t>(hi.bits) << 16);
}
template <typename T>
__device__ __forceinline__ uint32_t PackFloats(float lo, float hi) {
  return Pack(FromFloat<T>(lo), FromFloat<T>(hi));
}

// c (16x8, f32) += a (16x16) * b (16x8), operands in T.
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                    Bf16) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                    F16) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 16-bit matrices, transposed: lanes 8i .. 8i + 7 give the row
// addresses of matrix i; r[i] receives the lane's pair of matrix i.
__device__ __forceinline__ void LoadMatricesTransposed(const uint16_t* row, uint32_t (&r)[4]) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

__device__ __forceinline__ float QuadMax(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float QuadSum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Fragment coordinates (PTX ISA, mma.m16n8k16): lane = 4 * g + c holds
// rows g and g + 8 of an accumulator, columns 2c and 2c + 1 of each 8-wide
// tile; an A operand holds the same rows, columns 2c, 2c + 1 (regs 0, 1)
// and 2c + 8, 2c + 9 (regs 2, 3).
template <typename T, int kHd>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    PrefillMmaKernel(const float* __restrict__ q, int q_stride, const int32_t* __restrict__ meta,
                     const int32_t* __restrict__ tiles, DeviceLayout<T> layout, int n_heads,
                     int group, float scale_log2, float* __restrict__ out) {
  static_assert(kHd % 16 == 0);
  constexpr int kV = kVec<T>;                                // 8 elements in 16 bytes
  __shared__ __align__(16) uint16_t k_s[kHd][kKeys + kPad];  // [dim][key]
  __shared__ __align__(16) uint16_t v_s[kKeys][kHd + kPad];  // [key][dim]
  __shared__ const T* slot_block[kKeys];
  __shared__ int slot_index[kKeys];

  const int head = blockIdx.x, tile = blockIdx.y;
  const int kv_off = head / group * kHd;
  const int first = tiles[2 * tile], count = tiles[2 * tile + 1];
  const int p0 = meta[2 * first];
  const int32_t* blocks = meta + meta[2 * first + 1];
  const int key_end = p0 + count;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
  const int row0 = warp * 16 + g;  // and row0 + 8
  const int bs = layout.block_size;
  const size_t values_at = static_cast<size_t>(bs) * layout.kv_dim;

  // The warp's queries as A operands, scaled by log2(e) / sqrt(head_dim):
  // scores come out in base 2. Rows past the tile's are zero.
  uint32_t qa[kHd / 16][4];
#pragma unroll
  for (int kk = 0; kk < kHd / 16; ++kk) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = row0 + 8 * (i % 2), col = kk * 16 + 8 * (i / 2) + 2 * c;
      float lo = 0.0f, hi = 0.0f;
      if (row < count) {
        const float* src =
            q + static_cast<size_t>(first + row) * q_stride + static_cast<size_t>(head) * kHd + col;
        lo = src[0] * scale_log2;
        hi = src[1] * scale_log2;
      }
      qa[kk][i] = PackFloats<T>(lo, hi);
    }
  }

  float o[kHd / 8][4];
#pragma unroll
  for (int dt = 0; dt < kHd / 8; ++dt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[dt][e] = 0.0f;
  }
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};  // this lane's columns only, summed over the quad at the end

  for (int t0 = 0; t0 < key_end; t0 += kKeys) {
    const int n = min(kKeys, key_end - t0);
    __syncthreads();  // the previous tile is consumed
    if (threadIdx.x < n) {
      const int t = t0 + threadIdx.x;
      slot_block[threadIdx.x] = layout.Block(blocks[t / bs]);
      slot_index[threadIdx.x] = t % bs;
    }
    __syncthreads();
    // Keys: 8 adjacent slots of one dimension per 16-byte load (t0 and the
    // block size are multiples of 8); slots past n are zero.
    for (int i = threadIdx.x; i < kHd * (kKeys / kV); i += blockDim.x) {
      const int d = i / (kKeys / kV), j0 = (i % (kKeys / kV)) * kV;
      uint4 raw = make_uint4(0, 0, 0, 0);
      if (j0 < n) {
        raw = __ldg(reinterpret_cast<const uint4*>(
            slot_block[j0] + static_cast<size_t>(kv_off + d) * bs + slot_index[j0]));
      }
      uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int e = 0; e < kV; ++e) {  // the context may end inside these slots
        if (j0 + e >= n) w[e / 2] &= e % 2 == 0 ? 0xffff0000u : 0x0000ffffu;
      }
      *reinterpret_cast<uint4*>(&k_s[d][j0]) = make_uint4(w[0], w[1], w[2], w[3]);
    }
    // Values: 8 adjacent dimensions of one slot per load; slots past n are
    // zero (their scores are masked, but 0 * NaN would not be).
    for (int i = threadIdx.x; i < kKeys * (kHd / kV); i += blockDim.x) {
      const int j = i / (kHd / kV), d0 = (i % (kHd / kV)) * kV;
      uint4 raw = make_uint4(0, 0, 0, 0);
      if (j < n) {
        raw = __ldg(reinterpret_cast<const uint4*>(
            slot_block[j] + values_at + static_cast<size_t>(slot_index[j]) * layout.kv_dim +
            kv_off + d0));
      }
      *reinterpret_cast<uint4*>(&v_s[j][d0]) = raw;
    }
    __syncthreads();

    // S = Q K^T: 8 tiles of 8 keys. ldmatrix.trans of k_s [dim][key] gives
    // the B operand (dims x keys, column-major) of two key tiles at once.
    float s[kKeys / 8][4];
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < kHd / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < kKeys / 16; ++np) {
        uint32_t b[4];
        LoadMatricesTransposed(
            &k_s[kk * 16 + lane % 8 + 8 * ((lane / 8) % 2)][np * 16 + 8 * (lane / 16)], b);
        Mma(s[2 * np], qa[kk], b[0], b[1], T{});
        Mma(s[2 * np + 1], qa[kk], b[2], b[3], T{});
      }
    }
    // Causal mask: only tiles that reach past the first query's position.
    if (t0 + kKeys - 1 > p0) {
#pragma unroll
      for (int nt = 0; nt < kKeys / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = t0 + nt * 8 + 2 * c + e % 2;
          if (key > p0 + row0 + 8 * (e / 2)) s[nt][e] = -INFINITY;
        }
      }
    }
    // Online softmax per row (h = 0: row0, h = 1: row0 + 8); finite maxima
    // since key 0 of the first tile is never masked.
    uint32_t pa[kKeys / 16][4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float top = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kKeys / 8; ++nt)
        top = fmaxf(top, fmaxf(s[nt][2 * h], s[nt][2 * h + 1]));
      const float m_new = fmaxf(m[h], QuadMax(top));
      const float correction = exp2f(m[h] - m_new);
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < kKeys / 8; ++nt) {
        s[nt][2 * h] = exp2f(s[nt][2 * h] - m_new);
        s[nt][2 * h + 1] = exp2f(s[nt][2 * h + 1] - m_new);
        sum += s[nt][2 * h] + s[nt][2 * h + 1];
      }
      l[h] = l[h] * correction + sum;
      m[h] = m_new;
#pragma unroll
      for (int dt = 0; dt < kHd / 8; ++dt) {
        o[dt][2 * h] *= correction;
        o[dt][2 * h + 1] *= correction;
      }
    }
    // P as A operands: key tiles 2kj and 2kj + 1 make the 16 keys of step kj.
#pragma unroll
    for (int kj = 0; kj < kKeys / 16; ++kj) {
      pa[kj][0] = PackFloats<T>(s[2 * kj][0], s[2 * kj][1]);
      pa[kj][1] = PackFloats<T>(s[2 * kj][2], s[2 * kj][3]);
      pa[kj][2] = PackFloats<T>(s[2 * kj + 1][0], s[2 * kj + 1][1]);
      pa[kj][3] = PackFloats<T>(s[2 * kj + 1][2], s[2 * kj + 1][3]);
    }
    // O += P V: ldmatrix.trans of v_s [key][dim] gives the B operand (keys
    // x dims, column-major) of two dimension tiles at once.
#pragma unroll
    for (int kj = 0; kj < kKeys / 16; ++kj) {
#pragma unroll
      for (int dp = 0; dp < kHd / 16; ++dp) {
        uint32_t b[4];
        LoadMatricesTransposed(
            &v_s[kj * 16 + lane % 8 + 8 * ((lane / 8) % 2)][dp * 16 + 8 * (lane / 16)], b);
        Mma(o[2 * dp], pa[kj], b[0], b[1], T{});
        Mma(o[2 * dp + 1], pa[kj], b[2], b[3], T{});
      }
    }
  }

  const size_t out_stride = static_cast<size_t>(n_heads) * kHd;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float inv = 1.0f / QuadSum(l[h]);
    const int row = row0 + 8 * h;
    if (row >= count) continue;
    float* dst = out + static_cast<size_t>(first + row) * out_stride +
                 static_cast<size_t>(head) * kHd + 2 * c;
#pragma unroll
    for (int dt = 0; dt < kHd / 8; ++dt) {
      *reinterpret_cast<float2*>(dst + dt * 8) =
          make_float2(o[dt][2 * h] * inv, o[dt][2 * h + 1] * inv);
    }
  }
}

template <typename T, int kHd>
cudaError_t Launch(const float* q, int q_stride, const int32_t* rows_meta, const int32_t* tiles,
                   int n_tiles, int layer, const KvLayout& layout, const void* cache, int n_heads,
                   int n_kv_heads, float* out) {
  const DeviceLayout<T> device_layout = MakeDeviceLayout<T>(layout, layer, cache);
  const dim3 grid(static_cast<unsigned>(n_heads), static_cast<unsigned>(n_tiles));
  const float scale_log2 = 1.4426950408889634f / sqrtf(static_cast<float>(kHd));
  PrefillMmaKernel<T, kHd><<<grid, kWarpsPerBlock * 32>>>(
      q, q_stride, rows_meta, tiles, device_layout, n_heads, n_heads / n_kv_heads, scale_log2, out);
  return cudaGetLastError();
}

}  // namespace

bool PrefillMmaApplies(const KvLayout& layout, int head_dim, const void* cache, const float* out) {
  return (layout.dtype == DType::kBF16 || layout.dtype == DType::kF16) &&
         (head_dim == 64 || head_dim == 128) && layout.block_size % 8 == 0 &&
         reinterpret_cast<uintptr_t>(cache) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 8 == 0;
}

cudaError_t LaunchPrefillMma(const float* q, int q_stride, const int32_t* rows_meta,
                             const int32_t* tiles, int n_tiles, int layer, const KvLayout& layout,
                             const void* cache, int n_heads, int n_kv_heads, int head_dim,
                             float* out) {
  return WithElement(layout.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if constexpr (std::is_same_v<T, float>) {
      return cudaErrorInvalidValue;  // PrefillMmaApplies refuses f32
    } else {
      return head_dim == 64 ? Launch<T, 64>(q, q_stride, rows_meta, tiles, n_tiles, layer, layout,
                                            cache, n_heads, n_kv_heads, out)
                            : Launch<T, 128>(q, q_stride, rows_meta, tiles, n_tiles, layer, layout,
                                             cache, n_heads, n_kv_heads, out);
    }
  });
}

}  // namespace tandem::cuda
