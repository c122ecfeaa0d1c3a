#include "common/compute/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/compute/cuda/cuda_kv_copier.h"
#include "common/compute/cuda/cuda_status.h"
#include "common/compute/cuda/kernels.h"

namespace tandem {
namespace {

class CudaBuffer final : public DeviceBuffer {
 public:
  CudaBuffer(int device, void* data, size_t size) : device_(device), data_(data), size_(size) {}
  ~CudaBuffer() override {
    // Errors cannot be reported from here; a failed free leaks.
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current != device_) cudaSetDevice(device_);
    cudaFree(data_);
    if (current >= 0 && current != device_) cudaSetDevice(current);
  }
  void* data() override { return data_; }
  size_t size() const override { return size_; }

 private:
  int device_;
  void* data_;
  size_t size_;
};

// The shortest of five timed runs of `work` on the legacy stream, after one
// that warms up, in seconds (device events around each run).
absl::StatusOr<double> BestSeconds(const std::function<absl::Status()>& work) {
  cudaEvent_t start = nullptr, stop = nullptr;
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  absl::Status status = TANDEM_CUDA_STATUS(cudaEventCreate(&stop));
  float best_ms = 0.0f;
  for (int rep = 0; rep < 6 && status.ok(); ++rep) {
    status = TANDEM_CUDA_STATUS(cudaEventRecord(start, nullptr));
    if (status.ok()) status = work();
    if (status.ok()) status = TANDEM_CUDA_STATUS(cudaEventRecord(stop, nullptr));
    if (status.ok()) status = TANDEM_CUDA_STATUS(cudaEventSynchronize(stop));
    float ms = 0.0f;
    if (status.ok()) status = TANDEM_CUDA_STATUS(cudaEventElapsedTime(&ms, start, stop));
    if (status.ok() && rep > 0 && (best_ms == 0.0f || ms < best_ms)) best_ms = ms;
  }
  if (stop != nullptr) cudaEventDestroy(stop);
  cudaEventDestroy(start);
  RETURN_IF_ERROR(status);
  return best_ms * 1e-3;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(CudaBackendOptions options) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || count == 0) {
    // Clear the error so that it does not surface in a later call.
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "no CUDA device: ",
        error != cudaSuccess
            ? absl::StrCat(cudaGetErrorName(error), " (", cudaGetErrorString(error), ")")
            : std::string("the runtime reports 0 devices"),
        "; use the CPU backend"));
  }
  if (options.device < 0 || options.device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", options.device, " does not exist (", count, " present)"));
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));
  cudaDeviceProp prop{};
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, options.device));
  cublasHandle_t handle = nullptr, handle16 = nullptr;
  CUBLAS_RETURN_IF_ERROR(cublasCreate(&handle));
  // fp32 products stay fp32: no TF32 tensor cores, so results match the CPU.
  // The pedantic mode may keep 16-bit products off the tensor cores too, so
  // those get a handle of their own in the default mode.
  absl::Status status = TANDEM_CUBLAS_STATUS(cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH));
  if (status.ok()) status = TANDEM_CUBLAS_STATUS(cublasSetStream(handle, nullptr));
  if (status.ok()) status = TANDEM_CUBLAS_STATUS(cublasCreate(&handle16));
  if (status.ok()) status = TANDEM_CUBLAS_STATUS(cublasSetMathMode(handle16, CUBLAS_DEFAULT_MATH));
  if (status.ok()) status = TANDEM_CUBLAS_STATUS(cublasSetStream(handle16, nullptr));
  if (!status.ok()) {
    if (handle16 != nullptr) cublasDestroy(handle16);
    cublasDestroy(handle);
    return status;
  }
  std::string description =
      absl::StrCat(prop.name, " (sm_", prop.major, prop.minor, ", ", prop.totalGlobalMem >> 30,
                   " GiB), device ", options.device);
  return std::unique_ptr<CudaBackend>(new CudaBackend(options.device, prop.multiProcessorCount,
                                                      handle, handle16, std::move(description)));
}

CudaBackend::CudaBackend(int device, int sm_count, cublasContext* cublas, cublasContext* cublas16,
                         std::string description)
    : device_(device),
      sm_count_(sm_count),
      cublas_(cublas),
      cublas16_(cublas16),
      description_(std::move(description)),
      // On an H200 (tandem-engine-bench, a 28672 x 4096 bf16 product) the
      // kernel streamed 3.72 TB/s at 1 row against cuBLAS's 3.51, tied at
      // 2, and fell behind from 4 rows (3.07 against 3.51).
      skinny_max_rows_(2) {}

void CudaBackend::set_skinny_max_rows(int rows) {
  skinny_max_rows_ = std::clamp(rows, 0, cuda::kMaxSkinnyRows);
}

CudaBackend::~CudaBackend() {
  cudaSetDevice(device_);
  cudaDeviceSynchronize();
  for (Upload* upload : {&ids_upload_, &positions_upload_, &rows_upload_}) {
    if (upload->scratch.data != nullptr) cudaFree(upload->scratch.data);
  }
  for (Scratch* scratch : {&attention_scratch_, &narrow_scratch_}) {
    if (scratch->data != nullptr) cudaFree(scratch->data);
  }
  for (cudaEvent_t event : events_) cudaEventDestroy(event);
  cublasDestroy(cublas16_);
  cublasDestroy(cublas_);
}

bool CudaBackend::Begin(const char* op) {
  if (!status_.ok()) return false;
  Keep(TANDEM_CUDA_STATUS(cudaSetDevice(device_)));
  if (profiling_ && op != nullptr && status_.ok()) Mark(op);
  if (status_.ok() && fault_countdown_ >= 0 && fault_countdown_-- == 0) {
    Keep(TANDEM_CUDA_STATUS(cuda::LaunchFaultyKernel()));
  }
  return status_.ok();
}

void CudaBackend::Mark(const char* op) {
  cudaEvent_t event = nullptr;
  if (marks_.size() < events_.size()) {
    event = events_[marks_.size()];
  } else {
    Keep(TANDEM_CUDA_STATUS(cudaEventCreate(&event)));
    if (!status_.ok()) return;
    events_.push_back(event);
  }
  Keep(TANDEM_CUDA_STATUS(cudaEventRecord(event, nullptr)));
  marks_.push_back(op);
}

void CudaBackend::StartOpProfile() {
  profiling_ = true;
  marks_.clear();
}

absl::StatusOr<std::vector<std::pair<std::string, double>>> CudaBackend::TakeOpProfile() {
  if (Begin()) Mark("");
  profiling_ = false;
  RETURN_IF_ERROR(Synchronize());
  std::vector<std::pair<std::string, double>> profile;
  for (size_t i = 0; i + 1 < marks_.size(); ++i) {
    float ms = 0;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, events_[i], events_[i + 1]));
    auto at = std::find_if(profile.begin(), profile.end(),
                           [&](const auto& entry) { return entry.first == marks_[i]; });
    if (at == profile.end()) at = profile.insert(profile.end(), {marks_[i], 0.0});
    at->second += ms * 1e-3;
  }
  marks_.clear();
  return profile;
}

void CudaBackend::InjectFaultForTesting(int after_operations) {
  fault_countdown_ = std::max(0, after_operations);
}

void CudaBackend::Keep(absl::Status status) {
  if (status_.ok() && !status.ok()) status_ = std::move(status);
}

std::optional<DeviceMemory> CudaBackend::QueryDeviceMemory() {
  DeviceMemory memory;
  if (!Begin()) return std::nullopt;
  const absl::Status status =
      TANDEM_CUDA_STATUS(cudaMemGetInfo(&memory.free_bytes, &memory.total_bytes));
  if (!status.ok()) {
    Keep(status);
    return std::nullopt;
  }
  return memory;
}

KvCopier* CudaBackend::kv_copier() {
  if (copier_ == nullptr && Begin()) {
    absl::StatusOr<std::unique_ptr<CudaKvCopier>> copier = CudaKvCopier::Create(device_);
    if (copier.ok()) {
      copier_ = *std::move(copier);
    } else {
      Keep(copier.status());
    }
  }
  return copier_.get();
}

absl::Status CudaBackend::Synchronize() {
  if (Begin()) Keep(TANDEM_CUDA_STATUS(cudaDeviceSynchronize()));
  return status_;
}

absl::StatusOr<double> CudaBackend::MeasureCopyBandwidth(size_t bytes) {
  RETURN_IF_ERROR(Synchronize());
  ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> from, Allocate(bytes));
  ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> to, Allocate(bytes));
  ASSIGN_OR_RETURN(const double seconds, BestSeconds([&] {
                     return TANDEM_CUDA_STATUS(cudaMemcpyAsync(to->data(), from->data(), bytes,
                                                               cudaMemcpyDeviceToDevice, nullptr));
                   }));
  return 2.0 * static_cast<double>(bytes) / seconds;
}

absl::StatusOr<double> CudaBackend::MeasureGemmRate(DType dtype, int m, int n, int k) {
  if (m <= 0 || n <= 0 || k <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a GEMM of ", m, "x", n, "x", k, "; every size must be positive"));
  }
  RETURN_IF_ERROR(Synchronize());
  const size_t element = DTypeSize(dtype);
  ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> x, Allocate(size_t(m) * k * element));
  ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> w, Allocate(size_t(n) * k * element));
  ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> out, Allocate(size_t(m) * n * sizeof(float)));
  // Random operands: zeros would flatter the rate (less switching power).
  CUDA_RETURN_IF_ERROR(cuda::LaunchFillRandom(x->data(), dtype, size_t(m) * k, 1));
  CUDA_RETURN_IF_ERROR(cuda::LaunchFillRandom(w->data(), dtype, size_t(n) * k, 2));
  ASSIGN_OR_RETURN(
      const double seconds, BestSeconds([&] {
        return Product(x->data(), MatrixRef{w->data(), dtype}, out->floats(), m, n, k, 0.0f);
      }));
  return 2.0 * m * n * static_cast<double>(k) / seconds;
}

void* CudaBackend::Grow(Scratch& scratch, size_t bytes) {
  if (bytes <= scratch.bytes && scratch.data != nullptr) return scratch.data;
  // Kernels queued earlier may still use the old memory.
  Keep(TANDEM_CUDA_STATUS(cudaDeviceSynchronize()));
  if (scratch.data != nullptr) Keep(TANDEM_CUDA_STATUS(cudaFree(scratch.data)));
  scratch.data = nullptr;
  scratch.bytes = 0;
  if (!status_.ok()) return nullptr;
  const size_t grown = std::max<size_t>(bytes * 2, 1 << 16);
  Keep(TANDEM_CUDA_STATUS(cudaMalloc(&scratch.data, grown)));
  if (!status_.ok()) return nullptr;
  scratch.bytes = grown;
  return scratch.data;
}

const int32_t* CudaBackend::UploadInts(Upload& upload, std::span<const int32_t> ints) {
  // The engine passes the same positions and rows to every layer of a step:
  // uploading them once keeps the host from waiting on the GPU (a copy from
  // pageable memory first waits for the work queued before it).
  if (upload.scratch.data != nullptr &&
      std::equal(ints.begin(), ints.end(), upload.last.begin(), upload.last.end())) {
    return static_cast<const int32_t*>(upload.scratch.data);
  }
  upload.last.clear();
  void* scratch = Grow(upload.scratch, ints.size_bytes());
  if (scratch == nullptr) return nullptr;
  if (!ints.empty()) {
    // Pageable source: the copy has read it when the call returns, and it
    // runs after every kernel queued before (which may read the scratch).
    Keep(TANDEM_CUDA_STATUS(
        cudaMemcpyAsync(scratch, ints.data(), ints.size_bytes(), cudaMemcpyHostToDevice, nullptr)));
  }
  if (!status_.ok()) return nullptr;
  upload.last.assign(ints.begin(), ints.end());
  return static_cast<const int32_t*>(scratch);
}

bool CudaBackend::UploadRows(std::span<const AttentionRow> rows, DeviceRows& out) {
  host_ints_.assign(2 * rows.size(), 0);
  // Consecutive rows of one sequence (a prefill chunk) share one list.
  for (size_t r = 0; r < rows.size();) {
    size_t e = r + 1, longest = rows[r].blocks.size();
    while (e < rows.size() && rows[e].blocks.data() == rows[r].blocks.data()) {
      longest = std::max(longest, rows[e].blocks.size());
      ++e;
    }
    const int32_t offset = static_cast<int32_t>(host_ints_.size());
    host_ints_.insert(host_ints_.end(), rows[r].blocks.data(), rows[r].blocks.data() + longest);
    for (size_t i = r; i < e; ++i) {
      host_ints_[2 * i] = rows[i].position;
      host_ints_[2 * i + 1] = offset;
    }
    r = e;
  }
  // Runs of one list at consecutive positions: long ones are cut into
  // prefill tiles, the rest are rows of the per-row kernel.
  struct Tile {
    int32_t last_position, first, count;
  };
  std::vector<Tile> tiles;
  std::vector<int32_t> singles;
  out.decode_max_context = 0;
  for (size_t r = 0; r < rows.size();) {
    size_t e = r + 1;
    while (e < rows.size() && rows[e].blocks.data() == rows[r].blocks.data() &&
           rows[e].position == rows[e - 1].position + 1) {
      ++e;
    }
    if (e - r >= static_cast<size_t>(cuda::kMinPrefillRun)) {
      for (size_t at = r; at < e; at += cuda::kPrefillTileRows) {
        const size_t count = std::min<size_t>(cuda::kPrefillTileRows, e - at);
        tiles.push_back(
            {rows[at + count - 1].position, static_cast<int32_t>(at), static_cast<int32_t>(count)});
      }
    } else {
      for (size_t i = r; i < e; ++i) {
        singles.push_back(static_cast<int32_t>(i));
        out.decode_max_context = std::max(out.decode_max_context, rows[i].position + 1);
      }
    }
    r = e;
  }
  // The longest contexts first, so that they do not finish last.
  std::sort(tiles.begin(), tiles.end(), [](const Tile& a, const Tile& b) {
    return a.last_position != b.last_position ? a.last_position > b.last_position
                                              : a.first < b.first;
  });
  const size_t tiles_at = host_ints_.size();
  for (const Tile& t : tiles) {
    host_ints_.push_back(t.first);
    host_ints_.push_back(t.count);
  }
  const size_t singles_at = host_ints_.size();
  host_ints_.insert(host_ints_.end(), singles.begin(), singles.end());
  const int32_t* base = UploadInts(rows_upload_, host_ints_);
  if (base == nullptr) return false;
  out.meta = base;
  out.tiles = base + tiles_at;
  out.n_tiles = static_cast<int>(tiles.size());
  out.decode_rows = base + singles_at;
  out.n_decode = static_cast<int>(singles.size());
  return true;
}

absl::StatusOr<std::unique_ptr<DeviceBuffer>> CudaBackend::Allocate(size_t bytes) {
  if (absl::Status s = TANDEM_CUDA_STATUS(cudaSetDevice(device_)); !s.ok()) return s;
  void* p = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&p, std::max<size_t>(bytes, 1)));
  return std::make_unique<CudaBuffer>(device_, p, bytes);
}

void CudaBackend::CopyToDevice(const void* host, void* device, size_t bytes) {
  if (!Begin("CopyToDevice") || bytes == 0) return;
  Keep(TANDEM_CUDA_STATUS(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice)));
}

void CudaBackend::CopyToHost(const void* device, void* host, size_t bytes) {
  if (!Begin("CopyToHost") || bytes == 0) return;
  Keep(TANDEM_CUDA_STATUS(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost)));
}

absl::Status CudaBackend::Supports(DType weights, DType kv) const {
  auto known = [](DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; };
  if (!known(weights) || !(known(kv) || kv == DType::kI8)) {
    return absl::UnimplementedError(absl::StrCat(
        "the CUDA backend computes with f32, bf16 or f16 weights and an f32, bf16, f16 or int8 "
        "KV cache; got ",
        std::string(DTypeName(weights)), " weights and ", std::string(DTypeName(kv)), " KV"));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::Product(const void* x, MatrixRef weights, float* out, int m, int n, int k,
                                  float beta) {
  // Row-major out[m, n] = x[m, k] w[n, k]^T is column-major
  // out^T[n, m] = w^T x^T with w read as a column-major [k, n] matrix.
  const float alpha = 1.0f;
  if (weights.dtype == DType::kF32) {
    const float* w = static_cast<const float*>(weights.data);
    const float* xf = static_cast<const float*>(x);
    if (m == 1) {
      return TANDEM_CUBLAS_STATUS(
          cublasSgemv(cublas_, CUBLAS_OP_T, k, n, &alpha, w, k, xf, 1, &beta, out, 1));
    }
    return TANDEM_CUBLAS_STATUS(cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w,
                                            k, xf, k, &beta, out, n));
  }
  const cudaDataType type = weights.dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_16F;
  return TANDEM_CUBLAS_STATUS(cublasGemmEx(cublas16_, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha,
                                           weights.data, type, k, x, type, k, &beta, out,
                                           CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void CudaBackend::MatMul(const float* x, MatrixRef weights, float* out, int m, int n, int k,
                         bool accumulate) {
  if (!Begin("MatMul") || m <= 0 || n <= 0) return;
  if (absl::Status s = Supports(weights.dtype, DType::kF32); !s.ok()) {
    Keep(std::move(s));
    return;
  }
  const float beta = accumulate ? 1.0f : 0.0f;
  if (weights.dtype == DType::kF32) {
    Keep(Product(x, weights, out, m, n, k, beta));
    return;
  }
  // The tensor cores take both operands in one 16-bit type: the
  // activations are rounded to the weights' type first.
  const size_t elements = static_cast<size_t>(m) * std::max(k, 0);
  void* narrow = Grow(narrow_scratch_, elements * DTypeSize(weights.dtype));
  if (narrow == nullptr) return;
  Keep(TANDEM_CUDA_STATUS(cuda::LaunchNarrow(x, weights.dtype, narrow, elements)));
  if (!status_.ok()) return;
  if (m <= skinny_max_rows_ &&
      cuda::SkinnyProductApplies(weights.dtype, narrow, weights.data, m, k)) {
    Keep(TANDEM_CUDA_STATUS(
        cuda::LaunchSkinnyProduct(narrow, weights.data, weights.dtype, out, m, n, k, beta)));
  } else {
    Keep(Product(narrow, weights, out, m, n, k, beta));
  }
}

void CudaBackend::Embed(MatrixRef weights, std::span<const int32_t> ids, int dim, float* out) {
  if (!Begin("Embed") || ids.empty()) return;
  if (absl::Status s = Supports(weights.dtype, DType::kF32); !s.ok()) {
    Keep(std::move(s));
    return;
  }
  const int32_t* d_ids = UploadInts(ids_upload_, ids);
  if (d_ids == nullptr) return;
  Keep(TANDEM_CUDA_STATUS(cuda::LaunchEmbed(weights.data, weights.dtype, d_ids,
                                            static_cast<int>(ids.size()), dim, out)));
}

void CudaBackend::RmsNorm(const float* x, const float* weight, float* out, int rows, int dim,
                          float eps) {
  if (!Begin("RmsNorm")) return;
  Keep(TANDEM_CUDA_STATUS(cuda::LaunchRmsNorm(x, weight, out, rows, dim, eps)));
}

void CudaBackend::RmsNormHeads(float* x, int stride, const float* weight, int rows, int heads,
                               int head_dim, float eps) {
  if (!Begin("RmsNormHeads")) return;
  Keep(TANDEM_CUDA_STATUS(cuda::LaunchRmsNormHeads(x, stride, weight, rows, heads, head_dim, eps)));
}

void CudaBackend::Rope(float* q, int q_stride, float* k, int k_stride,
                       std::span<const int32_t> positions, const AttentionShape& shape,
                       const float* cos_sin) {
  if (!Begin("Rope") || positions.empty()) return;
  const int32_t* d_positions = UploadInts(positions_upload_, positions);
  if (d_positions == nullptr) return;
  Keep(TANDEM_CUDA_STATUS(cuda::LaunchRope(
      q, q_stride, k, k_stride, d_positions, static_cast<int>(positions.size()), shape.n_heads,
      shape.n_kv_heads, shape.head_dim, cos_sin, shape.rope_half_split)));
}

void CudaBackend::AddBias(float* x, int stride, const float* bias, int rows, int n) {
  if (!Begin("AddBias")) return;
  Keep(TANDEM_CUDA_STATUS(cuda::LaunchAddBias(x, stride, bias, rows, n)));
}

void CudaBackend::GatherRows(const float* src, std::span<const int32_t> rows, int n, float* dst) {
  if (!Begin("GatherRows") || rows.empty()) return;
  const int32_t* d_rows = UploadInts(expert_rows_upload_, rows);
  if (d_rows == nullptr) return;
  Keep(TANDEM_CUDA_STATUS(
      cuda::LaunchGatherRows(src, d_rows, static_cast<int>(rows.size()), n, dst)));
}

void CudaBackend::ScatterAddRows(const float* src, std::span<const int32_t> rows,
                                 std::span<const float> weights, int n, float* dst) {
  if (!Begin("ScatterAddRows") || rows.empty()) return;
  const int32_t* d_rows = UploadInts(expert_rows_upload_, rows);
  weight_bits_.resize(weights.size());
  std::memcpy(weight_bits_.data(), weights.data(), weights.size_bytes());
  const int32_t* d_weights = UploadInts(weights_upload_, weight_bits_);
  if (d_rows == nullptr || d_weights == nullptr) return;
  Keep(TANDEM_CUDA_STATUS(cuda::LaunchScatterAddRows(src, d_rows,
                                                     reinterpret_cast<const float*>(d_weights),
                                                     static_cast<int>(rows.size()), n, dst)));
}

void CudaBackend::SwiGlu(const float* gate_up, float* out, int rows, int hidden) {
  if (!Begin("SwiGlu")) return;
  Keep(TANDEM_CUDA_STATUS(cuda::LaunchSwiGlu(gate_up, out, rows, hidden)));
}

void CudaBackend::Argmax(const float* x, int rows, int n, int32_t* out) {
  if (!Begin("Argmax") || rows <= 0) return;
  Keep(TANDEM_CUDA_STATUS(cuda::LaunchArgmax(x, rows, n, out)));
}

void CudaBackend::WriteKv(const float* k, int k_stride, const float* v, int v_stride,
                          std::span<const AttentionRow> rows, int layer, const KvLayout& layout,
                          void* cache_bytes) {
  if (!Begin("WriteKv") || rows.empty()) return;
  if (absl::Status s = Supports(DType::kF32, layout.dtype); !s.ok()) {
    Keep(std::move(s));
    return;
  }
  if (layout.latent) {
    Keep(SupportsLatentAttention());
    return;
  }
  DeviceRows device_rows;
  if (!UploadRows(rows, device_rows)) return;
  Keep(TANDEM_CUDA_STATUS(cuda::LaunchWriteKv(k, k_stride, v, v_stride, device_rows.meta,
                                              static_cast<int>(rows.size()), layer, layout,
                                              cache_bytes)));
}

void CudaBackend::LatentAttention(const float*, int, std::span<const AttentionRow>, int,
                                  const KvLayout&, const void*, const LatentShape&, const float*,
                                  float*) {
  if (!Begin("LatentAttention")) return;
  Keep(SupportsLatentAttention());
}

void CudaBackend::PagedAttention(const float* q, int q_stride, std::span<const AttentionRow> rows,
                                 int layer, const KvLayout& layout, const void* cache_bytes,
                                 const AttentionShape& shape, float* out) {
  if (!Begin("PagedAttention") || rows.empty()) return;
  if (absl::Status s = Supports(DType::kF32, layout.dtype); !s.ok()) {
    Keep(std::move(s));
    return;
  }
  if (shape.n_kv_heads <= 0 || shape.n_heads % shape.n_kv_heads != 0 ||
      shape.n_heads / shape.n_kv_heads > cuda::kMaxGroup || shape.head_dim > cuda::kMaxHeadDim) {
    Keep(absl::UnimplementedError(
        absl::StrCat("CUDA paged attention takes at most ", cuda::kMaxGroup,
                     " query heads per KV head and head_dim <= ", cuda::kMaxHeadDim, "; got ",
                     shape.n_heads, "/", shape.n_kv_heads, " heads, head_dim ", shape.head_dim)));
    return;
  }
  DeviceRows device_rows;
  if (!UploadRows(rows, device_rows)) return;
  if (device_rows.n_decode > 0) {
    const bool by_block =
        block_decode_ && cuda::BlockDecodeApplies(layout, shape.n_heads, shape.n_kv_heads,
                                                  shape.head_dim, cache_bytes);
    const cuda::AttentionPlan plan = (by_block ? cuda::PlanBlockDecode : cuda::PlanPagedAttention)(
        device_rows.n_decode, device_rows.decode_max_context, shape.n_kv_heads, shape.head_dim,
        shape.n_heads, sm_count_);
    float* partials = nullptr;
    if (plan.partial_floats > 0) {
      partials = static_cast<float*>(Grow(attention_scratch_, plan.partial_floats * sizeof(float)));
      if (partials == nullptr) return;
    }
    Keep(TANDEM_CUDA_STATUS(cuda::LaunchPagedAttention(
        q, q_stride, device_rows.meta, device_rows.decode_rows, device_rows.n_decode, layer, layout,
        cache_bytes, shape.n_heads, shape.n_kv_heads, shape.head_dim, plan, partials, out)));
  }
  if (status_.ok() && device_rows.n_tiles > 0) {
    Keep(TANDEM_CUDA_STATUS(cuda::LaunchPrefillAttention(
        q, q_stride, device_rows.meta, device_rows.tiles, device_rows.n_tiles, layer, layout,
        cache_bytes, shape.n_heads, shape.n_kv_heads, shape.head_dim, out)));
  }
}

}  // namespace tandem
