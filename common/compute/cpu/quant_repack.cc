#include "common/compute/cpu/quant_repack.h"

#include <omp.h>

#include <cstring>
#include <vector>

#include "common/base/float16.h"
#include "common/base/quant_blocks.h"

namespace tandem::cpu {

bool CanRepackQ8_0(int64_t rows, int64_t k) {
  return rows > 0 && k > 0 && rows % kRepackRows == 0 && k % 32 == 0;
}

void RepackQ8_0(void* data, int64_t rows, int64_t k, int threads) {
  const int64_t blocks = k / 32, groups = rows / kRepackRows;
  const size_t group_bytes = static_cast<size_t>(17 * k);
#pragma omp parallel num_threads(threads)
  {
    std::vector<uint8_t> copy(group_bytes);
#pragma omp for
    for (int64_t g = 0; g < groups; ++g) {
      uint8_t* group = static_cast<uint8_t*>(data) + g * group_bytes;
      std::memcpy(copy.data(), group, group_bytes);
      const auto* in = reinterpret_cast<const BlockQ8_0*>(copy.data());
      uint16_t* scales = reinterpret_cast<uint16_t*>(group);
      uint8_t* quants = group + k;
      for (int r = 0; r < kRepackRows; ++r) {
        for (int64_t b = 0; b < blocks; ++b) {
          const BlockQ8_0& block = in[r * blocks + b];
          scales[b * kRepackRows + r] = block.d;
          for (int c = 0; c < 8; ++c) {
            uint8_t* to = quants + b * 512 + c * 64 + 4 * r;
            for (int i = 0; i < 4; ++i) {
              to[i] = static_cast<uint8_t>(static_cast<uint8_t>(block.qs[4 * c + i]) ^ 0x80u);
            }
          }
        }
      }
    }
  }
}

void DequantizeRepackedRow(const void* data, int64_t k, int64_t j, float* out) {
  const int64_t blocks = k / 32;
  const uint8_t* group =
      static_cast<const uint8_t*>(data) + (j / kRepackRows) * static_cast<size_t>(17 * k);
  const int r = static_cast<int>(j % kRepackRows);
  const uint16_t* scales = reinterpret_cast<const uint16_t*>(group);
  const uint8_t* quants = group + k;
  for (int64_t b = 0; b < blocks; ++b) {
    const float d = Fp16ToFp32(scales[b * kRepackRows + r]);
    for (int c = 0; c < 8; ++c) {
      const uint8_t* from = quants + b * 512 + c * 64 + 4 * r;
      for (int i = 0; i < 4; ++i) {
        const int8_t q = static_cast<int8_t>(from[i] ^ 0x80u);
        out[32 * b + 4 * c + i] = d * static_cast<float>(q);
      }
    }
  }
}

}  // namespace tandem::cpu
