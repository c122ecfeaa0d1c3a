// out[m, n] (+)= x[m, k] * w[n, k]^T for few rows m (decode batches), in a
// way bound by reading w once: each 4x4 tile of (weight rows, input rows)
// stays in registers while k streams by. BLAS packs w into panels first,
// which for small m costs more than the product itself.
//
// Every element is summed in the same order whatever m is, so a row's
// result does not depend on the other rows of its batch.
#ifndef TANDEM_COMMON_COMPUTE_CPU_SMALL_MATMUL_H_
#define TANDEM_COMMON_COMPUTE_CPU_SMALL_MATMUL_H_

#include <cstdint>

#include "common/base/dtype.h"

namespace tandem::cpu {

// Most rows the small-m path takes; larger products go to BLAS.
inline constexpr int kSmallMatMulMaxRows = 32;

// True when this CPU runs the small-m kernel (it needs AVX-512F).
bool SmallMatMulSupported();

// Computes output columns [n_begin, n_end) of out; callers split n among
// threads. Requires SmallMatMulSupported().
void SmallMatMul(const float* x, const float* w, float* out, int m, int n, int k, bool accumulate,
                 int n_begin, int n_end);

// The same with 16-bit weights (kF16 or kBF16), widened in registers.
// Requires SmallMatMul16Supported().
bool SmallMatMul16Supported();
void SmallMatMul16(const float* x, const void* w, DType w_type, float* out, int m, int n, int k,
                   bool accumulate, int n_begin, int n_end);

// bf16 weights against inputs already rounded to bf16 (x_bf16[m, k]), with
// the AVX512-BF16 dot-product instruction: twice the multiply-adds per
// instruction of the f32 path. Any m: rows are taken in blocks whose inputs
// stay in the L2 cache while the weights stream by, so prefill-sized
// products run at the instruction's rate too, and a row's result still
// does not depend on the other rows. out[r, j] for output columns
// [n_begin, n_end), its rows `ldo` apart. Requires DotBf16Supported().
bool DotBf16Supported();
void MatMulDotBf16(const uint16_t* x_bf16, const void* w, float* out, int ldo, int m, int k,
                   bool accumulate, int n_begin, int n_end);

}  // namespace tandem::cpu

#endif  // TANDEM_COMMON_COMPUTE_CPU_SMALL_MATMUL_H_
