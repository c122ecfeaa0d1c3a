// IEEE binary16 and bfloat16 conversions of the bits as stored (round to
// nearest even on the way down; NaN stays NaN, overflow becomes infinity).
#ifndef TANDEM_COMMON_BASE_FLOAT16_H_
#define TANDEM_COMMON_BASE_FLOAT16_H_

#include <cstdint>

namespace tandem {

float Fp16ToFp32(uint16_t h);
uint16_t Fp32ToFp16(float f);
float Bf16ToFp32(uint16_t h);
uint16_t Fp32ToBf16(float f);

}  // namespace tandem

#endif  // TANDEM_COMMON_BASE_FLOAT16_H_
