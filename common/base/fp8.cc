#include "common/base/fp8.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

constexpr std::array<float, 256> MakeTable() {
  std::array<float, 256> table{};
  for (int code = 0; code < 256; ++code) table[code] = Fp8E4M3ToFloat(static_cast<uint8_t>(code));
  return table;
}

constexpr std::array<float, 256> kTable = MakeTable();

absl::Status CheckSizes(const float* w, int rows, int cols) {
  if (rows < 0 || cols < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("FP8 quantization of a ", rows, " x ", cols, " matrix: negative size"));
  }
  if (w == nullptr && rows > 0 && cols > 0) {
    return absl::InvalidArgumentError("FP8 quantization: no weights given");
  }
  return absl::OkStatus();
}

// The largest magnitude in w[0, n); refuses a NaN or an infinity, naming
// its row and column (the first element of the block is at `row`, col 0).
absl::StatusOr<float> Amax(const float* w, size_t n, int row, int cols) {
  float amax = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(w[i])) {
      const int r = row + static_cast<int>(i / static_cast<size_t>(cols));
      const int c = static_cast<int>(i % static_cast<size_t>(cols));
      return absl::InvalidArgumentError(absl::StrCat("FP8 quantization: weight at row ", r,
                                                     ", column ", c, " is ", w[i],
                                                     "; only finite weights have a scale"));
    }
    amax = std::max(amax, std::fabs(w[i]));
  }
  return amax;
}

void QuantizeBlock(const float* w, size_t n, float scale, uint8_t* out) {
  for (size_t i = 0; i < n; ++i) out[i] = FloatToFp8E4M3(w[i] / scale);
}

}  // namespace

const std::array<float, 256>& Fp8E4M3Table() { return kTable; }

float Fp8ScaleForAmax(float amax) {
  const float scale = amax / kFp8E4M3Max;
  return scale > 0.0f ? scale : 1.0f;
}

absl::StatusOr<Fp8Quantized> QuantizeFp8PerChannel(const float* w, int rows, int cols) {
  if (absl::Status s = CheckSizes(w, rows, cols); !s.ok()) return s;
  Fp8Quantized q;
  q.rows = rows;
  q.cols = cols;
  q.codes.resize(static_cast<size_t>(rows) * cols);
  q.scales.resize(rows);
  for (int r = 0; r < rows; ++r) {
    const size_t offset = static_cast<size_t>(r) * cols;
    absl::StatusOr<float> amax = Amax(w + offset, cols, r, cols);
    if (!amax.ok()) return amax.status();
    q.scales[r] = Fp8ScaleForAmax(*amax);
    QuantizeBlock(w + offset, cols, q.scales[r], q.codes.data() + offset);
  }
  return q;
}

absl::StatusOr<Fp8Quantized> QuantizeFp8PerTensor(const float* w, int rows, int cols) {
  if (absl::Status s = CheckSizes(w, rows, cols); !s.ok()) return s;
  const size_t n = static_cast<size_t>(rows) * cols;
  absl::StatusOr<float> amax = Amax(w, n, 0, cols);
  if (!amax.ok()) return amax.status();
  Fp8Quantized q;
  q.rows = rows;
  q.cols = cols;
  q.codes.resize(n);
  q.scales = {Fp8ScaleForAmax(*amax)};
  QuantizeBlock(w, n, q.scales[0], q.codes.data());
  return q;
}

void DequantizeFp8(const Fp8Quantized& q, float* out) {
  for (int r = 0; r < q.rows; ++r) {
    const float scale = q.scale_of_row(r);
    const size_t offset = static_cast<size_t>(r) * q.cols;
    for (int c = 0; c < q.cols; ++c) out[offset + c] = kTable[q.codes[offset + c]] * scale;
  }
}

}  // namespace tandem
