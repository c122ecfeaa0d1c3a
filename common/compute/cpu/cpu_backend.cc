#include "common/compute/cpu/cpu_backend.h"

#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/quant_blocks.h"
#include "common/base/status_macros.h"
#include "common/compute/cpu/blas_library.h"
#include "common/compute/cpu/cpu_kernels.h"
#include "common/compute/cpu/quant_matmul.h"
#include "common/compute/cpu/quant_repack.h"
#include "common/compute/cpu/small_matmul.h"

namespace tandem {
namespace {

class HostBuffer final : public DeviceBuffer {
 public:
  HostBuffer(void* data, size_t size) : data_(data), size_(size) {}
  ~HostBuffer() override { std::free(data_); }
  void* data() override { return data_; }
  size_t size() const override { return size_; }

 private:
  void* data_;
  size_t size_;
};

// Below this many floats of work a kernel runs on the calling thread: waking
// the team costs more than it saves.
constexpr int64_t kParallelThreshold = 1 << 14;

// Prefill runs at least this long use the matrix-product attention path,
// in tiles of at most kAttentionTileRows query rows.
constexpr size_t kAttentionGemmRows = 16;
constexpr int kAttentionTileRows = 64;

// Runs f(begin, end) on each of up to `threads` threads over its share of
// the output columns [0, n), in multiples of `unit` columns (a kernel's
// tile or a repacked group), on the calling thread alone below the
// threshold of work.
template <typename F>
void SplitColumns(int threads, int n, int unit, int64_t work, F&& f) {
#pragma omp parallel num_threads(threads) if (work > kParallelThreshold * 16)
  {
    const int team = omp_get_num_threads(), t = omp_get_thread_num();
    const int per = ((n + unit - 1) / unit + team - 1) / team * unit;
    const int begin = std::min(n, t * per), end = std::min(n, begin + per);
    if (begin < end) f(begin, end);
  }
}

// Rows of the weight panels that products of many rows take at a time:
// about 1M values (4 MiB of f32, 2 MiB of bf16), large enough for the
// products to run at full speed, small enough to stay in the last-level
// cache.
int PanelRows(int n, int k) { return std::clamp((1 << 20) / std::max(k, 1), 16, std::max(n, 16)); }

// Row j of the quantized matrix w (rows of k values), widened to f32.
void DequantizeMatrixRow(MatrixRef w, int64_t k, int64_t j, float* out) {
  if (w.dtype == DType::kQ8_0R16) {
    cpu::DequantizeRepackedRow(w.data, k, j, out);
    return;
  }
  DequantizeRow(w.dtype, static_cast<const uint8_t*>(w.data) + DTypeBytes(w.dtype, k) * j, out, k);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(CpuBackendOptions options) {
  if (options.num_threads < 0 || options.num_threads > kMaxCpuThreads) {
    return absl::InvalidArgumentError(absl::StrCat("CPU backend threads are ", options.num_threads,
                                                   "; give 0 (every core) to ", kMaxCpuThreads));
  }
  ASSIGN_OR_RETURN(const cpu::BlasLibrary* blas, cpu::LoadBlasLibrary());
  const int threads = options.num_threads > 0 ? options.num_threads : omp_get_num_procs();
  std::unique_ptr<CpuBackend> backend(new CpuBackend(blas, threads));
  backend->prefault_ = options.prefault;
  return backend;
}

CpuBackend::CpuBackend(const cpu::BlasLibrary* blas, int num_threads)
    : blas_(blas),
      num_threads_(num_threads),
      small_matmul_(cpu::SmallMatMulSupported()),
      small_matmul16_(cpu::SmallMatMul16Supported()),
      dot_bf16_(cpu::DotBf16Supported()),
      quant_matmul_(cpu::QuantMatMulSupported()) {
  // omp_set_num_threads only sets the calling thread's default, and a
  // worker's scheduling thread is not the one that created the backend: so
  // every parallel region below names num_threads_ itself.
  omp_set_num_threads(num_threads_);
  blas_->set_num_threads(num_threads_);
  // Start the thread team now rather than inside a request's first step.
#pragma omp parallel num_threads(num_threads_)
  { (void)omp_get_thread_num(); }
}

std::string CpuBackend::Describe() const {
  const int parallel = blas_->get_parallel();
  return absl::StrCat("OpenBLAS core ", blas_->get_corename(), " (",
                      parallel == 2   ? "openmp"
                      : parallel == 1 ? "pthreads"
                                      : "serial",
                      "), kernels ", cpu::KernelIsa(), dot_bf16_ ? " +avx512bf16" : "",
                      quant_matmul_ ? " +avx512vnni" : "", ", ", num_threads_, " threads");
}

absl::Status CpuBackend::Supports(DType, DType) const { return absl::OkStatus(); }

absl::StatusOr<std::unique_ptr<DeviceBuffer>> CpuBackend::Allocate(size_t bytes) {
  // Weights and the KV cache are streamed whole every step: 2 MiB pages cut
  // their TLB misses and the page faults of first touch (the kernel's
  // transparent huge pages are often on only where asked for).
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t align = bytes >= kHugePage ? kHugePage : 64;
  const size_t rounded = (bytes + align - 1) / align * align;
  // Every byte is touched below: more than the machine has cannot work.
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (prefault_ && pages > 0 && page > 0 &&
      rounded / static_cast<size_t>(page) > static_cast<size_t>(pages)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate ", bytes >> 20, " MiB: the machine has ",
        (static_cast<size_t>(pages) * static_cast<size_t>(page)) >> 20, " MiB of memory"));
  }
  void* p = std::aligned_alloc(align, rounded == 0 ? align : rounded);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
  }
  if (align == kHugePage && prefault_) {
    ::madvise(p, rounded, MADV_HUGEPAGE);  // a hint; failure is harmless
    // Fault every page in now rather than on first touch inside a step: the
    // KV pool hands out blocks no request has touched yet for as long as
    // its prefix cache keeps the freed ones.
    std::memset(p, 0, rounded);
  }
  return std::make_unique<HostBuffer>(p, bytes);
}

void CpuBackend::CopyToDevice(const void* host, void* device, size_t bytes) {
  std::memcpy(device, host, bytes);
}

void CpuBackend::CopyToHost(const void* device, void* host, size_t bytes) {
  std::memcpy(host, device, bytes);
}

void CpuBackend::MatMul(const float* x, MatrixRef weights, float* out, int m, int n, int k,
                        bool accumulate) {
  if (IsQuantized(weights.dtype)) {
    MatMulQuantized(x, weights, out, n, m, n, k, accumulate);
    return;
  }
  if (weights.dtype != DType::kF32) {
    const int64_t work = int64_t{m} * n * k;
    if (dot_bf16_ && weights.dtype == DType::kBF16) {
      const uint16_t* xb = RoundToBf16(x, m, k);
      // Many rows (prefill) go over w a panel at a time, each panel staying
      // in the cache while every row block passes over it, instead of
      // streaming all of w from memory once per row block.
      const int rows = m > cpu::kQuantMatMulMaxRows ? PanelRows(n, k) : n;
      const auto* w16 = static_cast<const uint16_t*>(weights.data);
      for (int j0 = 0; j0 < n; j0 += rows) {
        MatMulBf16(xb, w16 + int64_t{j0} * k, out + j0, n, m, std::min(rows, n - j0), k,
                   accumulate);
      }
      return;
    }
    if (m <= cpu::kSmallMatMulMaxRows && small_matmul16_) {
      SplitColumns(num_threads_, n, 4, work, [&](int begin, int end) {
        cpu::SmallMatMul16(x, weights.data, weights.dtype, out, m, n, k, accumulate, begin, end);
      });
      return;
    }
    MatMulWidened(x, weights, out, n, m, n, k, accumulate);
    return;
  }
  const float* w = static_cast<const float*>(weights.data);
  if (small_matmul_ && m > 1 && m <= cpu::kSmallMatMulMaxRows) {
    // Split the outputs among threads in multiples of the 4-row tile.
    SplitColumns(num_threads_, n, 4, int64_t{m} * n * k, [&](int begin, int end) {
      cpu::SmallMatMul(x, w, out, m, n, k, accumulate, begin, end);
    });
    return;
  }
  const float beta = accumulate ? 1.0f : 0.0f;
  // OpenBLAS (OpenMP flavour) sizes its team from the calling thread's
  // omp_get_max_threads(), a per-thread setting: a scheduler thread other
  // than the one that created the backend would otherwise use every core.
  if (omp_get_max_threads() != num_threads_) omp_set_num_threads(num_threads_);
  if (m == 1) {
    // A single row is a matrix-vector product: bound by reading w once.
    blas_->sgemv(CblasRowMajor, CblasNoTrans, n, k, 1.0f, w, k, x, 1, beta, out, 1);
  } else {
    blas_->sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x, k, w, k, beta, out, n);
  }
}

void CpuBackend::MatMulColumns(const float* x, MatrixRef w, float* out, int ldo, int m, int n,
                               int k, bool accumulate) {
  if (IsQuantized(w.dtype)) {
    MatMulQuantized(x, w, out, ldo, m, n, k, accumulate);
    return;
  }
  Backend::MatMulColumns(x, w, out, ldo, m, n, k, accumulate);
}

const uint16_t* CpuBackend::RoundToBf16(const float* x, int m, int k) {
  x_bf16_.resize(static_cast<size_t>(m) * k);
  uint16_t* xb = x_bf16_.data();
  // Rows rounded in parallel: a prefill's inputs are megabytes.
#pragma omp parallel for num_threads(num_threads_) if (int64_t{m} * k > kParallelThreshold * 16)
  for (int r = 0; r < m; ++r) {
    cpu::Narrow(x + int64_t{r} * k, DType::kBF16, xb + int64_t{r} * k, k, 1);
  }
  return xb;
}

void CpuBackend::MatMulBf16(const uint16_t* xb, const void* w, float* out, int ldo, int m, int n,
                            int k, bool accumulate) {
  SplitColumns(num_threads_, n, 4, int64_t{m} * n * k, [&](int begin, int end) {
    cpu::MatMulDotBf16(xb, w, out, ldo, m, k, accumulate, begin, end);
  });
}

void CpuBackend::MatMulQuantized(const float* x, MatrixRef w, float* out, int ldo, int m, int n,
                                 int k, bool accumulate) {
  // The repacked kernel writes whole groups of 16 columns: a product over
  // some other count of rows than the matrix was repacked with widens rows.
  if (w.dtype == DType::kQ8_0R16 && n % cpu::kRepackRows != 0) {
    MatMulWidened(x, w, out, ldo, m, n, k, accumulate);
    return;
  }
  if (m > cpu::kQuantMatMulMaxRows && dot_bf16_) {
    MatMulQuantizedBf16(x, w, out, ldo, m, n, k, accumulate);
    return;
  }
  if (!quant_matmul_ || m > cpu::kQuantMatMulMaxRows || !cpu::QuantMatMulHandles(w.dtype)) {
    MatMulWidened(x, w, out, ldo, m, n, k, accumulate);
    return;
  }
  cpu::QuantizeRows(x, m, k, w.dtype, &quantized_rows_);
  // Threads take whole groups of a repacked matrix's rows.
  const int unit = w.dtype == DType::kQ8_0R16 ? cpu::kRepackRows : 4;
  SplitColumns(num_threads_, n, unit, int64_t{m} * n * k, [&](int begin, int end) {
    cpu::QuantMatMul(quantized_rows_, w.data, out, ldo, accumulate, begin, end);
  });
}

void CpuBackend::MatMulWidened(const float* x, MatrixRef w, float* out, int ldo, int m, int n,
                               int k, bool accumulate) {
  if (omp_get_max_threads() != num_threads_) omp_set_num_threads(num_threads_);
  const int rows = PanelRows(n, k);
  panel_.resize(static_cast<size_t>(std::min(rows, n)) * k);
  const size_t row_bytes = DTypeBytes(w.dtype, k);
  for (int j0 = 0; j0 < n; j0 += rows) {
    const int nb = std::min(rows, n - j0);
    const uint8_t* src = static_cast<const uint8_t*>(w.data) + size_t(j0) * row_bytes;
#pragma omp parallel for num_threads(num_threads_) if (int64_t{nb} * k > kParallelThreshold)
    for (int j = 0; j < nb; ++j) {
      if (IsQuantized(w.dtype)) {
        DequantizeMatrixRow(w, k, j0 + j, panel_.data() + size_t(j) * k);
      } else {
        cpu::Widen(src + size_t(j) * row_bytes, w.dtype, panel_.data() + size_t(j) * k, k);
      }
    }
    const float beta = accumulate ? 1.0f : 0.0f;
    if (m <= cpu::kSmallMatMulMaxRows) {
      // Decode-sized products take a row at a time, so that a row's result
      // does not depend on the rows batched with it: OpenBLAS sums in
      // another order for other row counts.
      for (int r = 0; r < m; ++r) {
        blas_->sgemv(CblasRowMajor, CblasNoTrans, nb, k, 1.0f, panel_.data(), k, x + int64_t{r} * k,
                     1, beta, out + int64_t{r} * ldo + j0, 1);
      }
      continue;
    }
    blas_->sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, nb, k, 1.0f, x, k, panel_.data(), k,
                 beta, out + j0, ldo);
  }
}

void CpuBackend::MatMulQuantizedBf16(const float* x, MatrixRef w, float* out, int ldo, int m, int n,
                                     int k, bool accumulate) {
  const uint16_t* xb = RoundToBf16(x, m, k);
  // Panels widened a row at a time through f32.
  const int rows = PanelRows(n, k);
  panel_bf16_.resize(static_cast<size_t>(std::min(rows, n)) * k);
  panel_.resize(static_cast<size_t>(num_threads_) * k);
  for (int j0 = 0; j0 < n; j0 += rows) {
    const int nb = std::min(rows, n - j0);
#pragma omp parallel num_threads(num_threads_) if (int64_t{nb} * k > kParallelThreshold)
    {
      float* wide = panel_.data() + size_t(omp_get_thread_num()) * k;
#pragma omp for
      for (int j = 0; j < nb; ++j) {
        DequantizeMatrixRow(w, k, j0 + j, wide);
        cpu::Narrow(wide, DType::kBF16, panel_bf16_.data() + size_t(j) * k, k, 1);
      }
    }
    MatMulBf16(xb, panel_bf16_.data(), out + j0, ldo, m, nb, k, accumulate);
  }
}

MatrixRef CpuBackend::PrepareWeights(MatrixRef w, int64_t rows, int64_t k) {
  if (w.dtype != DType::kQ8_0 || !quant_matmul_ || !cpu::CanRepackQ8_0(rows, k)) return w;
  cpu::RepackQ8_0(const_cast<void*>(w.data), rows, k, num_threads_);
  return MatrixRef{w.data, DType::kQ8_0R16};
}

void CpuBackend::Embed(MatrixRef table, std::span<const int32_t> ids, int dim, float* out) {
  const size_t row_bytes = DTypeBytes(table.dtype, dim);
  for (size_t r = 0; r < ids.size(); ++r) {
    const uint8_t* row = static_cast<const uint8_t*>(table.data) + size_t(ids[r]) * row_bytes;
    if (IsQuantized(table.dtype)) {
      DequantizeMatrixRow(table, dim, ids[r], out + r * dim);
    } else {
      cpu::Widen(row, table.dtype, out + r * dim, dim);
    }
  }
}

void CpuBackend::AddBias(float* x, int stride, const float* bias, int rows, int n) {
  for (int r = 0; r < rows; ++r) {
    float* row = x + int64_t{r} * stride;
#pragma omp simd
    for (int i = 0; i < n; ++i) row[i] += bias[i];
  }
}

void CpuBackend::RmsNorm(const float* x, const float* weight, float* out, int rows, int dim,
                         float eps) {
#pragma omp parallel for num_threads(num_threads_) if (int64_t{rows} * dim > kParallelThreshold)
  for (int r = 0; r < rows; ++r) {
    cpu::RmsNormRow(x + int64_t{r} * dim, weight, out + int64_t{r} * dim, dim, eps);
  }
}

void CpuBackend::RmsNormHeads(float* x, int stride, const float* weight, int rows, int heads,
                              int head_dim, float eps) {
  const int64_t groups = int64_t{rows} * heads;
#pragma omp parallel for num_threads(num_threads_) if (groups * head_dim > kParallelThreshold)
  for (int64_t g = 0; g < groups; ++g) {
    float* group = x + g / heads * stride + g % heads * head_dim;
    cpu::RmsNormRow(group, weight, group, head_dim, eps);  // reads all before it writes
  }
}

void CpuBackend::GatherRows(const float* src, std::span<const int32_t> rows, int n, float* dst) {
  for (size_t i = 0; i < rows.size(); ++i) {
    std::memcpy(dst + i * n, src + int64_t{rows[i]} * n, sizeof(float) * n);
  }
}

void CpuBackend::ScatterAddRows(const float* src, std::span<const int32_t> rows,
                                std::span<const float> weights, int n, float* dst) {
  for (size_t i = 0; i < rows.size(); ++i) {
    float* out = dst + int64_t{rows[i]} * n;
    const float* in = src + i * n;
    const float w = weights[i];
#pragma omp simd
    for (int j = 0; j < n; ++j) out[j] += w * in[j];
  }
}

void CpuBackend::Rope(float* q, int q_stride, float* k, int k_stride,
                      std::span<const int32_t> positions, const AttentionShape& shape,
                      const float* cos_sin) {
  const int rows = static_cast<int>(positions.size());
  const int half = shape.head_dim / 2;
#pragma omp parallel for num_threads(num_threads_) if (int64_t{rows} * q_stride > \
                                                       kParallelThreshold)
  for (int r = 0; r < rows; ++r) {
    const float* cs = cos_sin + int64_t{positions[r]} * half * 2;
    cpu::RopeRow(q + int64_t{r} * q_stride, shape.n_heads, shape.head_dim, cs,
                 shape.rope_half_split);
    cpu::RopeRow(k + int64_t{r} * k_stride, shape.n_kv_heads, shape.head_dim, cs,
                 shape.rope_half_split);
  }
}

void CpuBackend::SwiGlu(const float* gate_up, float* out, int rows, int hidden) {
#pragma omp parallel for num_threads(num_threads_) if (int64_t{rows} * hidden > kParallelThreshold)
  for (int r = 0; r < rows; ++r) {
    const float* row = gate_up + int64_t{r} * 2 * hidden;
    cpu::SwiGluRow(row, row + hidden, out + int64_t{r} * hidden, hidden);
  }
}

void CpuBackend::Argmax(const float* x, int rows, int n, int32_t* out) {
  for (int r = 0; r < rows; ++r) {
    const float* row = x + int64_t{r} * n;
    int32_t best = 0;
    for (int i = 1; i < n; ++i) {
      // As the device: a NaN in front loses to any number.
      if (row[i] > row[best] || (std::isnan(row[best]) && !std::isnan(row[i]))) best = i;
    }
    out[r] = best;
  }
}

void CpuBackend::WriteKv(const float* k, int k_stride, const float* v, int v_stride,
                         std::span<const AttentionRow> rows, int layer, const KvLayout& layout,
                         void* cache) {
  uint8_t* base = static_cast<uint8_t*>(cache);
  const size_t element = layout.element_bytes();
  for (size_t r = 0; r < rows.size(); ++r) {
    const int pos = rows[r].position;
    const int32_t block = rows[r].blocks[pos / layout.block_size];
    const int slot = pos % layout.block_size;
    if (layout.dtype == DType::kI8) {
      // Each token's head is rounded on its own, its scale beside the block's.
      const int head_dim = layout.kv_dim / layout.kv_heads;
      if (layout.latent) {
        cpu::QuantizeInt8(
            k + r * k_stride, layout.kv_dim,
            reinterpret_cast<int8_t*>(base + layout.KeyOffset(layer, block, slot, 0)),
            layout.block_size,
            reinterpret_cast<float*>(base + layout.KeyScaleOffset(layer, block, 0)) + slot);
        continue;
      }
      for (int h = 0; h < layout.kv_heads; ++h) {
        const int off = h * head_dim;
        auto* key_scales = reinterpret_cast<float*>(base + layout.KeyScaleOffset(layer, block, h));
        auto* value_scales =
            reinterpret_cast<float*>(base + layout.ValueScaleOffset(layer, block, h));
        cpu::QuantizeInt8(
            k + r * k_stride + off, head_dim,
            reinterpret_cast<int8_t*>(base + layout.KeyOffset(layer, block, slot, off)),
            layout.block_size, key_scales + slot);
        cpu::QuantizeInt8(
            v + r * v_stride + off, head_dim,
            reinterpret_cast<int8_t*>(base + layout.ValueOffset(layer, block, slot) + off), 1,
            value_scales + slot);
      }
      continue;
    }
    // Keys are stored dimension-major: one element every block_size.
    cpu::Narrow(k + r * k_stride, layout.dtype,
                base + layout.KeyOffset(layer, block, slot, 0) * element, layout.kv_dim,
                layout.block_size);
    if (layout.latent) continue;
    cpu::Narrow(v + r * v_stride, layout.dtype,
                base + layout.ValueOffset(layer, block, slot) * element, layout.kv_dim, 1);
  }
}

void CpuBackend::PagedAttention(const float* q, int q_stride, std::span<const AttentionRow> rows,
                                int layer, const KvLayout& layout, const void* cache,
                                const AttentionShape& shape, float* out) {
  // Rows of one sequence at consecutive positions (a prefill chunk) share
  // every key and value: long runs go through matrix products, the rest
  // (decode rows, short chunks) through the row kernel.
  struct Run {
    int64_t first;
    int n;
  };
  std::vector<Run> gemm_runs;
  std::vector<int64_t> single_rows;
  for (size_t r = 0; r < rows.size();) {
    size_t e = r + 1;
    while (e < rows.size() && rows[e].blocks.data() == rows[r].blocks.data() &&
           rows[e].position == rows[e - 1].position + 1) {
      ++e;
    }
    if (e - r >= kAttentionGemmRows) {
      gemm_runs.push_back({static_cast<int64_t>(r), static_cast<int>(e - r)});
    } else {
      for (size_t i = r; i < e; ++i) single_rows.push_back(static_cast<int64_t>(i));
    }
    r = e;
  }

  const int group = shape.n_heads / shape.n_kv_heads;
  const int out_stride = shape.n_heads * shape.head_dim;
  // Task lists: (row, kv head) for single rows, (run tile, kv head) for runs.
  struct Tile {
    int64_t first;
    int n;
  };
  std::vector<Tile> tiles;
  for (const Run& run : gemm_runs) {
    for (int at = 0; at < run.n; at += kAttentionTileRows) {
      tiles.push_back({run.first + at, std::min(kAttentionTileRows, run.n - at)});
    }
  }
  const int64_t single_tasks = static_cast<int64_t>(single_rows.size()) * shape.n_kv_heads;
  const int64_t tasks = single_tasks + static_cast<int64_t>(tiles.size()) * shape.n_kv_heads;
  int64_t work = 0;
  for (const AttentionRow& row : rows) work += int64_t{row.position + 1} * shape.head_dim;

#pragma omp parallel num_threads(num_threads_) if (work * shape.n_heads > kParallelThreshold)
  {
    // The tiles' products below run on this task's thread. With one thread
    // (or below the threshold) this region is inactive, and OpenBLAS would
    // size its own team from this task's default (every core) and start
    // threads for each product.
    omp_set_num_threads(1);
    thread_local std::vector<float> scratch;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int kv_head = static_cast<int>(task % shape.n_kv_heads);
      const int64_t head0 = int64_t{kv_head} * group * shape.head_dim;
      if (task < single_tasks) {
        const int64_t r = single_rows[task / shape.n_kv_heads];
        const size_t need = static_cast<size_t>(group) * (rows[r].position + 1);
        if (scratch.size() < need) scratch.resize(need);
        cpu::AttendGroup(q + r * q_stride + head0, rows[r], kv_head, group, shape.head_dim, layer,
                         layout, cache, scratch.data(), out + r * out_stride + head0);
      } else {
        const Tile& tile = tiles[(task - single_tasks) / shape.n_kv_heads];
        AttendTile(q + tile.first * q_stride + head0, q_stride, rows.subspan(tile.first, tile.n),
                   kv_head, group, shape.head_dim, layer, layout, cache, scratch,
                   out + tile.first * out_stride + head0, out_stride);
      }
    }
  }
}

void CpuBackend::AttendTile(const float* q, int q_stride, std::span<const AttentionRow> rows,
                            int kv_head, int group, int head_dim, int layer, const KvLayout& layout,
                            const void* cache, std::vector<float>& scratch, float* out,
                            int out_stride) const {
  // Keys (transposed, [head_dim][ctx]) and values ([ctx][head_dim]) of
  // positions [0, last] gathered contiguous, then for each query head:
  // S = Q K^T, causal softmax per row, O = S V.
  const int n = static_cast<int>(rows.size());
  const int ctx = rows.back().position + 1;
  const size_t kv_floats = static_cast<size_t>(ctx) * head_dim;
  const size_t need = 2 * kv_floats + static_cast<size_t>(n) * ctx;
  if (scratch.size() < need) scratch.resize(need);
  float* keys = scratch.data();
  float* values = keys + kv_floats;
  float* scores = values + kv_floats;
  const int bs = layout.block_size;
  const std::span<const int32_t> blocks = rows[0].blocks;
  const uint8_t* base = static_cast<const uint8_t*>(cache);
  const size_t element = layout.element_bytes();
  for (int t0 = 0; t0 < ctx; t0 += bs) {
    const int32_t block = blocks[t0 / bs];
    const int valid = std::min(bs, ctx - t0);
    if (layout.dtype == DType::kI8) {
      // Bytes times each slot's scale.
      const auto* key_scales =
          reinterpret_cast<const float*>(base + layout.KeyScaleOffset(layer, block, kv_head));
      const auto* value_scales =
          reinterpret_cast<const float*>(base + layout.ValueScaleOffset(layer, block, kv_head));
      for (int d = 0; d < head_dim; ++d) {
        cpu::WidenInt8(reinterpret_cast<const int8_t*>(
                           base + layout.KeyOffset(layer, block, 0, kv_head * head_dim + d)),
                       key_scales, 0.0f, keys + size_t(d) * ctx + t0, valid);
      }
      for (int j = 0; j < valid; ++j) {
        cpu::WidenInt8(reinterpret_cast<const int8_t*>(base + layout.ValueOffset(layer, block, j) +
                                                       kv_head * head_dim),
                       nullptr, value_scales[j], values + size_t(t0 + j) * head_dim, head_dim);
      }
      continue;
    }
    for (int d = 0; d < head_dim; ++d) {
      cpu::Widen(base + layout.KeyOffset(layer, block, 0, kv_head * head_dim + d) * element,
                 layout.dtype, keys + size_t(d) * ctx + t0, valid);
    }
    for (int j = 0; j < valid; ++j) {
      cpu::Widen(base + (layout.ValueOffset(layer, block, j) + kv_head * head_dim) * element,
                 layout.dtype, values + size_t(t0 + j) * head_dim, head_dim);
    }
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  for (int g = 0; g < group; ++g) {
    blas_->sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, ctx, head_dim, scale,
                 q + g * head_dim, q_stride, keys, ctx, 0.0f, scores, ctx);
    for (int i = 0; i < n; ++i) {
      cpu::CausalSoftmaxRow(scores + size_t(i) * ctx, rows[i].position + 1, ctx);
    }
    blas_->sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, head_dim, ctx, 1.0f, scores, ctx,
                 values, head_dim, 0.0f, out + g * head_dim, out_stride);
  }
}

}  // namespace tandem
