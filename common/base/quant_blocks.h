// The block layouts of GGUF's quantized weight types, as llama.cpp writes
// them, and their reference dequantization.
//
// A block stores 32 (Q8_0, Q4_0, Q5_0, Q5_1) or 256 (the K types)
// consecutive weights of one row as small integers with shared fp16 scales:
//   Q8_0  w = d * q,                      q in [-128, 127]
//   Q4_0  w = d * (q - 8),                q in [0, 15]
//   Q5_0  w = d * (q - 16),               q in [0, 31]
//   Q5_1  w = d * q + m,                  q in [0, 31],  fp16 minimum m
//   Q4_K  w = d * sc_j * q - dmin * m_j,  q in [0, 15],  6-bit sc_j, m_j per 32
//   Q5_K  as Q4_K with a fifth bit,       q in [0, 31]
//   Q6_K  w = d * sc_j * (q - 32),        q in [0, 63],  int8 sc_j per 16
// Q4_K_M and Q5_K_M files mix these types tensor by tensor; where a row's
// length is no multiple of 256, llama-quantize writes Q5_0 for Q4_K, Q5_1
// for Q5_K and Q8_0 for Q6_K (DeepSeek-V2-Lite's 1408-wide experts).
#ifndef TANDEM_COMMON_BASE_QUANT_BLOCKS_H_
#define TANDEM_COMMON_BASE_QUANT_BLOCKS_H_

#include <cstdint>

#include "common/base/dtype.h"

namespace tandem {

struct BlockQ8_0 {
  uint16_t d;  // fp16
  int8_t qs[32];
};
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[16];  // element i in the low nibble of byte i, i + 16 in the high
};
// Q5_0 and Q5_1: element i's fifth bit is bit i of qh (read as a
// little-endian 32-bit word); its low four bits are packed as in Q4_0.
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[16];
};
// Q4_K and Q5_K: sub-block j of 32 has scale d * sc_j and minimum
// dmin * m_j; the eight 6-bit (sc, m) pairs are packed in `scales`
// (K4ScaleMin). Each 64 elements take 32 bytes of qs: the low nibbles are
// the first 32, the high nibbles the next 32.
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[32];  // bit 2c (2c + 1) of byte l: the fifth bit of element l of
                   // the low (high) 32 of chunk c
  uint8_t qs[128];
};
// Each 128 elements take 64 bytes of ql and 32 of qh: element l < 32 is
// ql[l] & 15 | (qh[l] & 3) << 4; l + 32 uses ql[l + 32] and qh bits 2-3;
// l + 64 the high nibble of ql[l] and bits 4-5; l + 96 of ql[l + 32], bits 6-7.
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};

static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_0) == 18 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176 &&
              sizeof(BlockQ6_K) == 210);

// The 6-bit scale and minimum of sub-block j (0..7) of a Q4_K or Q5_K block.
inline void K4ScaleMin(const uint8_t* scales, int j, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *m = scales[j + 4] & 63;
  } else {
    *sc = (scales[j + 4] & 0xf) | ((scales[j - 4] >> 6) << 4);
    *m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
  }
}

// Widens `n` elements of type `dtype` at `src` to f32, any type. For a
// quantized type `n` is a whole number of blocks and the values are those
// of GGUF's reference: each product rounded to f32 in the order the formula
// above reads (d * sc first), never fused. kI8 (a KV type, whose scales
// live apart from its bytes) and kQ8_0R16 (whose rows are interleaved:
// cpu/quant_repack.h reads them) give NaN.
void DequantizeRow(DType dtype, const void* src, float* dst, int64_t n);

}  // namespace tandem

#endif  // TANDEM_COMMON_BASE_QUANT_BLOCKS_H_
