#include "common/base/quant_blocks.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "common/base/float16.h"

// Built with -ffp-contract=off (CMakeLists.txt): a fused multiply-add would
// round once where the reference rounds twice.
namespace tandem {
namespace {

template <typename Block>
const Block* Blocks(const void* src) {
  return static_cast<const Block*>(src);
}

void Q8_0(const BlockQ8_0& b, float* y) {
  const float d = Fp16ToFp32(b.d);
  for (int i = 0; i < 32; ++i) y[i] = d * static_cast<float>(b.qs[i]);
}

void Q4_0(const BlockQ4_0& b, float* y) {
  const float d = Fp16ToFp32(b.d);
  for (int i = 0; i < 16; ++i) {
    y[i] = d * static_cast<float>((b.qs[i] & 0xf) - 8);
    y[i + 16] = d * static_cast<float>((b.qs[i] >> 4) - 8);
  }
}

// The 32 five-bit values of a Q5_0 or Q5_1 block, unsigned.
void Five(const uint8_t* qh_bytes, const uint8_t* qs, int* q) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  for (int i = 0; i < 16; ++i) {
    q[i] = (qs[i] & 0xf) | static_cast<int>(((qh >> i) & 1) << 4);
    q[i + 16] = (qs[i] >> 4) | static_cast<int>(((qh >> (i + 16)) & 1) << 4);
  }
}

void Q5_0(const BlockQ5_0& b, float* y) {
  const float d = Fp16ToFp32(b.d);
  int q[32];
  Five(b.qh, b.qs, q);
  for (int i = 0; i < 32; ++i) y[i] = d * static_cast<float>(q[i] - 16);
}

void Q5_1(const BlockQ5_1& b, float* y) {
  const float d = Fp16ToFp32(b.d), m = Fp16ToFp32(b.m);
  int q[32];
  Five(b.qh, b.qs, q);
  for (int i = 0; i < 32; ++i) y[i] = d * static_cast<float>(q[i]) + m;
}

// Q4_K without qh; Q5_K with it.
void K4(uint16_t d_bits, uint16_t dmin_bits, const uint8_t* scales, const uint8_t* qs,
        const uint8_t* qh, float* y) {
  const float d = Fp16ToFp32(d_bits), dmin = Fp16ToFp32(dmin_bits);
  for (int c = 0; c < 4; ++c) {
    uint8_t sc0, m0, sc1, m1;
    K4ScaleMin(scales, 2 * c, &sc0, &m0);
    K4ScaleMin(scales, 2 * c + 1, &sc1, &m1);
    const float d0 = d * sc0, min0 = dmin * m0, d1 = d * sc1, min1 = dmin * m1;
    const uint8_t* q = qs + 32 * c;
    for (int l = 0; l < 32; ++l) {
      int lo = q[l] & 0xf, hi = q[l] >> 4;
      if (qh != nullptr) {
        lo += ((qh[l] >> (2 * c)) & 1) << 4;
        hi += ((qh[l] >> (2 * c + 1)) & 1) << 4;
      }
      y[64 * c + l] = d0 * static_cast<float>(lo) - min0;
      y[64 * c + 32 + l] = d1 * static_cast<float>(hi) - min1;
    }
  }
}

void Q6_K(const BlockQ6_K& b, float* y) {
  const float d = Fp16ToFp32(b.d);
  for (int half = 0; half < 2; ++half) {
    const uint8_t* ql = b.ql + 64 * half;
    const uint8_t* qh = b.qh + 32 * half;
    const int8_t* sc = b.scales + 8 * half;
    float* out = y + 128 * half;
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      out[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      out[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      out[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      out[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
  }
}

}  // namespace

void DequantizeRow(DType dtype, const void* src, float* dst, int64_t n) {
  const int64_t blocks = n / DTypeBlockElements(dtype);
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kF16:
    case DType::kBF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) {
        dst[i] = dtype == DType::kF16 ? Fp16ToFp32(h[i]) : Bf16ToFp32(h[i]);
      }
      return;
    }
    case DType::kQ8_0:
      for (int64_t i = 0; i < blocks; ++i) Q8_0(Blocks<BlockQ8_0>(src)[i], dst + 32 * i);
      return;
    case DType::kQ4_0:
      for (int64_t i = 0; i < blocks; ++i) Q4_0(Blocks<BlockQ4_0>(src)[i], dst + 32 * i);
      return;
    case DType::kQ5_0:
      for (int64_t i = 0; i < blocks; ++i) Q5_0(Blocks<BlockQ5_0>(src)[i], dst + 32 * i);
      return;
    case DType::kQ5_1:
      for (int64_t i = 0; i < blocks; ++i) Q5_1(Blocks<BlockQ5_1>(src)[i], dst + 32 * i);
      return;
    case DType::kQ4_K:
      for (int64_t i = 0; i < blocks; ++i) {
        const BlockQ4_K& b = Blocks<BlockQ4_K>(src)[i];
        K4(b.d, b.dmin, b.scales, b.qs, nullptr, dst + 256 * i);
      }
      return;
    case DType::kQ5_K:
      for (int64_t i = 0; i < blocks; ++i) {
        const BlockQ5_K& b = Blocks<BlockQ5_K>(src)[i];
        K4(b.d, b.dmin, b.scales, b.qs, b.qh, dst + 256 * i);
      }
      return;
    case DType::kQ6_K:
      for (int64_t i = 0; i < blocks; ++i) Q6_K(Blocks<BlockQ6_K>(src)[i], dst + 256 * i);
      return;
    case DType::kI8:       // no weight is int8, and its bytes alone have no scale
    case DType::kQ8_0R16:  // rows are interleaved: DequantizeRepackedRow (cpu/quant_repack.h)
      std::fill(dst, dst + n, std::numeric_limits<float>::quiet_NaN());
      return;
  }
}

}  // namespace tandem
