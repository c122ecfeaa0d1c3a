#include "common/compute/cpu/cpu_backend.h"

#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/compute/cpu/blas_library.h"
#include "common/compute/cpu/cpu_kernels.h"

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

}  // namespace

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(CpuBackendOptions options) {
  if (options.num_threads < 0) {
    return absl::InvalidArgumentError("CPU backend threads must be >= 0 (0 = every core)");
  }
  ASSIGN_OR_RETURN(const cpu::BlasLibrary* blas, cpu::LoadBlasLibrary());
  const int threads = options.num_threads > 0 ? options.num_threads : omp_get_num_procs();
  return std::unique_ptr<CpuBackend>(new CpuBackend(blas, threads));
}

CpuBackend::CpuBackend(const cpu::BlasLibrary* blas, int num_threads)
    : blas_(blas), num_threads_(num_threads) {
  omp_set_num_threads(num_threads_);
  blas_->set_num_threads(num_threads_);
}

std::string CpuBackend::Describe() const {
  const int parallel = blas_->get_parallel();
  return absl::StrCat("OpenBLAS core ", blas_->get_corename(), " (",
                      parallel == 2 ? "openmp" : parallel == 1 ? "pthreads" : "serial",
                      "), kernels ", cpu::KernelIsa(), ", ", num_threads_, " threads");
}

absl::StatusOr<std::unique_ptr<DeviceBuffer>> CpuBackend::Allocate(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
  }
  return std::make_unique<HostBuffer>(p, bytes);
}

void CpuBackend::CopyToDevice(const void* host, void* device, size_t bytes) {
  std::memcpy(device, host, bytes);
}

void CpuBackend::CopyToHost(const void* device, void* host, size_t bytes) {
  std::memcpy(host, device, bytes);
}

void CpuBackend::MatMul(const float* x, const float* w, float* out, int m, int n, int k,
                        bool accumulate) {
  const float beta = accumulate ? 1.0f : 0.0f;
  if (m == 1) {
    // A single row is a matrix-vector product: bound by reading w once.
    blas_->sgemv(CblasRowMajor, CblasNoTrans, n, k, 1.0f, w, k, x, 1, beta, out, 1);
  } else {
    blas_->sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x, k, w, k, beta, out, n);
  }
}

void CpuBackend::Embed(const float* table, std::span<const int32_t> ids, int dim, float* out) {
  for (size_t r = 0; r < ids.size(); ++r) {
    std::memcpy(out + r * dim, table + static_cast<size_t>(ids[r]) * dim, dim * sizeof(float));
  }
}

void CpuBackend::RmsNorm(const float* x, const float* weight, float* out, int rows, int dim,
                         float eps) {
#pragma omp parallel for if (int64_t{rows} * dim > kParallelThreshold)
  for (int r = 0; r < rows; ++r) {
    cpu::RmsNormRow(x + int64_t{r} * dim, weight, out + int64_t{r} * dim, dim, eps);
  }
}

void CpuBackend::Rope(float* q, int q_stride, float* k, int k_stride,
                      std::span<const int32_t> positions, const AttentionShape& shape,
                      const float* cos_sin) {
  const int rows = static_cast<int>(positions.size());
  const int half = shape.head_dim / 2;
#pragma omp parallel for if (int64_t{rows} * q_stride > kParallelThreshold)
  for (int r = 0; r < rows; ++r) {
    const float* cs = cos_sin + int64_t{positions[r]} * half * 2;
    cpu::RopeRow(q + int64_t{r} * q_stride, shape.n_heads, shape.head_dim, cs);
    cpu::RopeRow(k + int64_t{r} * k_stride, shape.n_kv_heads, shape.head_dim, cs);
  }
}

void CpuBackend::SwiGlu(const float* gate_up, float* out, int rows, int hidden) {
#pragma omp parallel for if (int64_t{rows} * hidden > kParallelThreshold)
  for (int r = 0; r < rows; ++r) {
    const float* row = gate_up + int64_t{r} * 2 * hidden;
    cpu::SwiGluRow(row, row + hidden, out + int64_t{r} * hidden, hidden);
  }
}

void CpuBackend::WriteKv(const float* k, int k_stride, const float* v, int v_stride,
                         std::span<const AttentionRow> rows, int layer, const KvLayout& layout,
                         float* cache) {
  const size_t bytes = sizeof(float) * layout.kv_dim;
  for (size_t r = 0; r < rows.size(); ++r) {
    const int pos = rows[r].position;
    const int32_t block = rows[r].blocks[pos / layout.block_size];
    const int slot = pos % layout.block_size;
    std::memcpy(cache + layout.KeyOffset(layer, block, slot), k + r * k_stride, bytes);
    std::memcpy(cache + layout.ValueOffset(layer, block, slot), v + r * v_stride, bytes);
  }
}

void CpuBackend::PagedAttention(const float* q, int q_stride, std::span<const AttentionRow> rows,
                                int layer, const KvLayout& layout, const float* cache,
                                const AttentionShape& shape, float* out) {
  const int group = shape.n_heads / shape.n_kv_heads;
  const int64_t tasks = static_cast<int64_t>(rows.size()) * shape.n_kv_heads;
  int64_t work = 0;
  for (const AttentionRow& row : rows) work += int64_t{row.position + 1} * shape.head_dim;
  const int out_stride = shape.n_heads * shape.head_dim;
#pragma omp parallel if (work * shape.n_heads > kParallelThreshold)
  {
    thread_local std::vector<float> scores;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t r = task / shape.n_kv_heads;
      const int kv_head = static_cast<int>(task % shape.n_kv_heads);
      const size_t need = static_cast<size_t>(group) * (rows[r].position + 1);
      if (scores.size() < need) scores.resize(need);
      const int64_t head0 = int64_t{kv_head} * group * shape.head_dim;
      cpu::AttendGroup(q + r * q_stride + head0, rows[r], kv_head, group, shape.head_dim, layer,
                       layout, cache, scores.data(), out + r * out_stride + head0);
    }
  }
}

}  // namespace tandem
