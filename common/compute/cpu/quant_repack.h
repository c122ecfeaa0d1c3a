// Q8_0 weights repacked for the CPU backend's products (DType::kQ8_0R16):
// rows in groups of 16, each group in the bytes its 16 rows held before,
// laid out so that one 64-byte load holds four consecutive weights of each
// of the 16 rows. One AVX512-VNNI dot product then multiplies them by the
// same four activations broadcast, and its 16 sums are the 16 rows'
// partial outputs: no per-row scale work inside a block and no horizontal
// sum at the end, where the row-by-row Q8_0 product spends most of its
// instructions.
//
// A group of 16 rows of k weights (k / 32 blocks each) is 17 k bytes:
//
//   scales[k / 32][16]      the rows' f16 block scales, block-major
//   quants[k / 32][8][64]   block b, weights 4c .. 4c + 3 of row r at
//                           quants[b][c][4r ..], each byte q + 128
//
// A row's bytes are 34 per 32 weights, as in Q8_0.
#ifndef TANDEM_COMMON_COMPUTE_CPU_QUANT_REPACK_H_
#define TANDEM_COMMON_COMPUTE_CPU_QUANT_REPACK_H_

#include <cstdint>

namespace tandem::cpu {

inline constexpr int kRepackRows = 16;

// Whether a Q8_0 matrix of `rows` rows of k weights can be repacked: whole
// groups of 16 rows and whole blocks.
bool CanRepackQ8_0(int64_t rows, int64_t k);

// Rearranges the Q8_0 matrix at `data` in place into kQ8_0R16. Requires
// CanRepackQ8_0(rows, k). Runs over `threads` threads.
void RepackQ8_0(void* data, int64_t rows, int64_t k, int threads);

// Row j of a kQ8_0R16 matrix of k-weight rows, widened to f32: the values
// DequantizeRow gives for the row before repacking, bit for bit.
void DequantizeRepackedRow(const void* data, int64_t k, int64_t j, float* out);

}  // namespace tandem::cpu

#endif  // TANDEM_COMMON_COMPUTE_CPU_QUANT_REPACK_H_
