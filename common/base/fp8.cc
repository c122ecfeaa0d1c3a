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

// The largest magnitude of the block_rows x block_cols block at (row, col)
// of the matrix w, `cols` wide; refuses a NaN or an infinity, naming its row and
// column.
absl::StatusOr<float> BlockAmax(const float* w, int cols, int row, int col, int block_rows,
                                int block_cols) {
  float amax = 0.0f;
  for (int r = row; r < row + block_rows; ++r) {
    for (int c = col; c < col + block_cols; ++c) {
      const float x = w[static_cast<size_t>(r) * cols + c];
      if (!std::isfinite(x)) {
        return absl::InvalidArgumentError(absl::StrCat("FP8 quantization: weight at row ", r,
                                                       ", column ", c, " is ", x,
                                                       "; only finite weights have a scale"));
      }
      amax = std::max(amax, std::fabs(x));
    }
  }
  return amax;
}

}  // namespace

const std::array<float, 256>& Fp8E4M3Table() { return kTable; }

float Fp8ScaleForAmax(float amax) {
  const float scale = amax / kFp8E4M3Max;
  return scale > 0.0f ? scale : 1.0f;
}

absl::StatusOr<Fp8Quantized> QuantizeFp8PerBlock(const float* w, int rows, int cols, int block_rows,
                                                 int block_cols) {
  if (absl::Status s = CheckSizes(w, rows, cols); !s.ok()) return s;
  if (block_rows < 1 || block_cols < 1) {
    return absl::InvalidArgumentError(absl::StrCat("FP8 quantization in ", block_rows, " x ",
                                                   block_cols,
                                                   " blocks: blocks need 1 x 1 or more"));
  }
  Fp8Quantized q;
  q.rows = rows;
  q.cols = cols;
  q.block_rows = block_rows;
  q.block_cols = block_cols;
  q.codes.resize(static_cast<size_t>(rows) * cols);
  const int grid_rows = (rows + block_rows - 1) / block_rows;
  q.scales.resize(static_cast<size_t>(grid_rows) * q.grid_cols());
  for (int br = 0; br < grid_rows; ++br) {
    const int r0 = br * block_rows, nr = std::min(block_rows, rows - r0);
    for (int bc = 0; bc < q.grid_cols(); ++bc) {
      const int c0 = bc * block_cols, nc = std::min(block_cols, cols - c0);
      absl::StatusOr<float> amax = BlockAmax(w, cols, r0, c0, nr, nc);
      if (!amax.ok()) return amax.status();
      const float scale = Fp8ScaleForAmax(*amax);
      q.scales[static_cast<size_t>(br) * q.grid_cols() + bc] = scale;
      for (int r = r0; r < r0 + nr; ++r) {
        for (int c = c0; c < c0 + nc; ++c) {
          const size_t i = static_cast<size_t>(r) * cols + c;
          q.codes[i] = FloatToFp8E4M3(w[i] / scale);
        }
      }
    }
  }
  return q;
}

absl::StatusOr<Fp8Quantized> QuantizeFp8PerChannel(const float* w, int rows, int cols) {
  return QuantizeFp8PerBlock(w, rows, cols, 1, std::max(cols, 1));
}

absl::StatusOr<Fp8Quantized> QuantizeFp8PerTensor(const float* w, int rows, int cols) {
  return QuantizeFp8PerBlock(w, rows, cols, std::max(rows, 1), std::max(cols, 1));
}

void DequantizeFp8(const Fp8Quantized& q, float* out) {
  for (int r = 0; r < q.rows; ++r) {
    const size_t offset = static_cast<size_t>(r) * q.cols;
    for (int c = 0; c < q.cols; ++c)
      out[offset + c] = kTable[q.codes[offset + c]] * q.scale_at(r, c);
  }
}

}  // namespace tandem
