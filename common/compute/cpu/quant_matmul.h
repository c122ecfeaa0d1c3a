// Products with GGUF quantized weights for few rows (decode batches), bound
// by reading the weights once: the activations are rounded to int8 with an
// f32 scale per 32 values (Q8_0, Q4_0) or per 256 (the K types), as
// llama.cpp rounds them; each weight block is unpacked to unsigned bytes in
// registers, and the AVX512-VNNI dot product sums 64 byte products per
// instruction. The block scales multiply the exact integer sums; a type's
// offset (Q8_0 128, Q4_0 8, Q6_K 32) and the K types' minima are taken off
// with the activations' sums.
//
// The error against f32 is the activations' rounding: at most half a step
// of the scale (max |x| / 127 over the values sharing it) per value.
#ifndef TANDEM_COMMON_COMPUTE_CPU_QUANT_MATMUL_H_
#define TANDEM_COMMON_COMPUTE_CPU_QUANT_MATMUL_H_

#include <cstdint>
#include <vector>

#include "common/base/dtype.h"

namespace tandem::cpu {

// Most rows the int8 path takes; more go to widened panels and BLAS.
inline constexpr int kQuantMatMulMaxRows = 32;

// True when this CPU has AVX512-VNNI (with F, BW and VL).
bool QuantMatMulSupported();

// The weight types QuantMatMul has kernels for: Q8_0 (and kQ8_0R16), Q4_0
// and the K types. Q5_0 and Q5_1 have none; their products widen panels.
bool QuantMatMulHandles(DType dtype);

// Rows of activations rounded for a product with one weight type; reused
// between calls.
struct QuantizedRows {
  int m = 0;
  int k = 0;  // a whole number of the type's blocks
  DType dtype = DType::kQ8_0;
  std::vector<int8_t> q;  // [m, k], for Q4_K and Q5_K in their nibbles' order
  // Q8_0, Q4_0:
  std::vector<float> lane_scale;     // [m, k / 4]: the scale of each 4 values
  std::vector<int32_t> neg_sums[2];  // [m, k / 4]: -(sum of 4 q) * 8 and * 128
  // Q8_0 repacked (kQ8_0R16), also the above:
  std::vector<int32_t> block_neg_sums;  // [m, k / 32]: -(sum of 32 q) * 128
  // K types:
  std::vector<float> block_scale;  // [m, k / 256]
  std::vector<float> block_sum;    // [m, k / 32]: scale * the sum of 32 q
  std::vector<float> sum16;        // [m, k / 16]: scale * the sum of 16 q
};

// Rounds x[m, k] for a product with `dtype` weights.
void QuantizeRows(const float* x, int m, int k, DType dtype, QuantizedRows* rows);

// out[r, j] (+)= sum_i x[r, i] * w[j, i] for output columns [n_begin,
// n_end), out's rows `ldo` apart; w's rows are k values of x.dtype. For
// kQ8_0R16 (quant_repack.h) n_begin and n_end are multiples of 16.
// Requires QuantMatMulSupported() and QuantMatMulHandles(x.dtype).
void QuantMatMul(const QuantizedRows& x, const void* w, float* out, int ldo, bool accumulate,
                 int n_begin, int n_end);

}  // namespace tandem::cpu

#endif  // TANDEM_COMMON_COMPUTE_CPU_QUANT_MATMUL_H_
