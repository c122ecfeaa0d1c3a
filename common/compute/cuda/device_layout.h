// The KV cache of one layer as the CUDA kernels address it: the layout of
// common/kvcache/kv_layout.h, with the int8 cache's scales. Host and device
// code (TANDEM_HOST_DEVICE), so that a test on a machine without a device
// checks the kernels' addressing against KvLayout's offsets.
#ifndef TANDEM_COMMON_COMPUTE_CUDA_DEVICE_LAYOUT_H_
#define TANDEM_COMMON_COMPUTE_CUDA_DEVICE_LAYOUT_H_

#include <cstddef>
#include <cstdint>

#include "common/base/host_device.h"
#include "common/kvcache/kv_layout.h"

namespace tandem::cuda {

// T is the cache's storage type: float, a 16-bit type or int8_t; for
// int8_t an element is a byte and block_elements counts the scales' bytes.
template <typename T>
struct DeviceLayout {
  int block_size;
  int kv_dim;
  int kv_heads;
  size_t block_elements;  // KvLayout::block_elements()
  const T* layer_base;    // the layer's first block (WriteKv casts const away)

  // A block holds the keys transposed (element d of slot s at
  // d * block_size + s), then the values by slot (slot s's kv_dim elements
  // at block_size * kv_dim + s * kv_dim); an int8 block then the key scales
  // [kv_heads][block_size] and the value scales, f32.
  TANDEM_HOST_DEVICE const T* Block(int32_t block) const {
    return layer_base + static_cast<size_t>(block) * block_elements;
  }
  // int8 only: the block_size key (value) scales of KV head `head` in the
  // block that starts at `block`.
  TANDEM_HOST_DEVICE const float* KeyScales(const T* block, int head) const {
    return reinterpret_cast<const float*>(block + size_t{2} * block_size * kv_dim) +
           static_cast<size_t>(head) * block_size;
  }
  TANDEM_HOST_DEVICE const float* ValueScales(const T* block, int head) const {
    return KeyScales(block, head) + static_cast<size_t>(kv_heads) * block_size;
  }
};

// Layer `layer` of the cache at `cache`, whose elements are of type T.
template <typename T>
DeviceLayout<T> MakeDeviceLayout(const KvLayout& layout, int layer, const void* cache) {
  return DeviceLayout<T>{layout.block_size, layout.kv_dim, layout.kv_heads, layout.block_elements(),
                         static_cast<const T*>(cache) + layer * layout.layer_elements()};
}

}  // namespace tandem::cuda

#endif  // TANDEM_COMMON_COMPUTE_CUDA_DEVICE_LAYOUT_H_
