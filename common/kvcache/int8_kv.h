// The rounding of an int8 KV cache (kv_layout.h), shared by the CPU
// backend's QuantizeInt8 and the CUDA backend's WriteKv kernel so that both
// write the same bytes and scales: each token's KV head is scaled by its
// largest magnitude over 127 and rounded to the nearest step, ties to even.
// A head holding a NaN or an infinity gets a NaN scale and zero bytes, so
// that it reads NaN, as a float cache would.
#ifndef TANDEM_COMMON_KVCACHE_INT8_KV_H_
#define TANDEM_COMMON_KVCACHE_INT8_KV_H_

#include <cmath>
#include <cstdint>

#include "common/base/host_device.h"

namespace tandem {

// The scale of a head whose largest magnitude is `amax` (finite).
TANDEM_HOST_DEVICE inline float Int8KvScale(float amax) { return amax / 127.0f; }

// What the head's values are multiplied by before rounding: 0 for a head of
// zeros (whose scale is 0).
TANDEM_HOST_DEVICE inline float Int8KvInverse(float amax) {
  return amax > 0.0f ? 127.0f / amax : 0.0f;
}

// x * inverse rounded to the nearest integer (ties to even; rintf under
// the default rounding mode), kept within [-127, 127]. A head whose largest
// magnitude is below 127 / FLT_MAX (about 3.7e-37) has an infinite inverse:
// its non-zero values round to +-127 and its zeros (0 times infinity, NaN)
// to 0.
TANDEM_HOST_DEVICE inline int8_t Int8KvRound(float x, float inverse) {
  const float q = rintf(x * inverse);
  if (q != q) return 0;
  return static_cast<int8_t>(q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q));
}

}  // namespace tandem

#endif  // TANDEM_COMMON_KVCACHE_INT8_KV_H_
