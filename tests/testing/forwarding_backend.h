// ForwardingBackend: a Backend that hands every call to another one, for
// tests that wrap a real backend to watch, gate or restrict a few calls
// (override those; the rest forward).
#ifndef TANDEM_TESTS_TESTING_FORWARDING_BACKEND_H_
#define TANDEM_TESTS_TESTING_FORWARDING_BACKEND_H_

#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <utility>

#include "common/compute/backend.h"

namespace tandem::testing {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}

  std::string_view name() const override { return inner_->name(); }
  absl::Status status() const override { return inner_->status(); }
  std::optional<DeviceMemory> QueryDeviceMemory() override { return inner_->QueryDeviceMemory(); }
  KvCopier* kv_copier() override { return inner_->kv_copier(); }
  absl::Status Supports(DType weights, DType kv) const override {
    return inner_->Supports(weights, kv);
  }
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(size_t bytes) override {
    return inner_->Allocate(bytes);
  }
  void CopyToDevice(const void* h, void* d, size_t n) override { inner_->CopyToDevice(h, d, n); }
  void CopyToHost(const void* d, void* h, size_t n) override { inner_->CopyToHost(d, h, n); }
  void MatMul(const float* x, MatrixRef w, float* out, int m, int n, int k, bool acc) override {
    inner_->MatMul(x, w, out, m, n, k, acc);
  }
  void MatMulColumns(const float* x, MatrixRef w, float* out, int ldo, int m, int n, int k,
                     bool acc) override {
    inner_->MatMulColumns(x, w, out, ldo, m, n, k, acc);
  }
  MatrixRef PrepareWeights(MatrixRef w, int64_t rows, int64_t k) override {
    return inner_->PrepareWeights(w, rows, k);
  }
  void Embed(MatrixRef t, std::span<const int32_t> ids, int dim, float* out) override {
    inner_->Embed(t, ids, dim, out);
  }
  void AddBias(float* x, int stride, const float* bias, int rows, int n) override {
    inner_->AddBias(x, stride, bias, rows, n);
  }
  void RmsNorm(const float* x, const float* w, float* out, int rows, int dim, float eps) override {
    inner_->RmsNorm(x, w, out, rows, dim, eps);
  }
  void RmsNormHeads(float* x, int stride, const float* w, int rows, int heads, int head_dim,
                    float eps) override {
    inner_->RmsNormHeads(x, stride, w, rows, heads, head_dim, eps);
  }
  void Rope(float* q, int qs, float* k, int ks, std::span<const int32_t> positions,
            const AttentionShape& shape, const float* cos_sin) override {
    inner_->Rope(q, qs, k, ks, positions, shape, cos_sin);
  }
  void GatherRows(const float* src, std::span<const int32_t> rows, int n, float* dst) override {
    inner_->GatherRows(src, rows, n, dst);
  }
  void ScatterAddRows(const float* src, std::span<const int32_t> rows,
                      std::span<const float> weights, int n, float* dst) override {
    inner_->ScatterAddRows(src, rows, weights, n, dst);
  }
  void SwiGlu(const float* gate_up, float* out, int rows, int hidden) override {
    inner_->SwiGlu(gate_up, out, rows, hidden);
  }
  void WriteKv(const float* k, int ks, const float* v, int vs, std::span<const AttentionRow> rows,
               int layer, const KvLayout& layout, void* cache) override {
    inner_->WriteKv(k, ks, v, vs, rows, layer, layout, cache);
  }
  void PagedAttention(const float* q, int qs, std::span<const AttentionRow> rows, int layer,
                      const KvLayout& layout, const void* cache, const AttentionShape& shape,
                      float* out) override {
    inner_->PagedAttention(q, qs, rows, layer, layout, cache, shape, out);
  }
  absl::Status SupportsLatentAttention() const override {
    return inner_->SupportsLatentAttention();
  }
  void LatentAttention(const float* q, int q_stride, std::span<const AttentionRow> rows, int layer,
                       const KvLayout& layout, const void* cache, const LatentShape& shape,
                       const float* kv_b, float* out) override {
    inner_->LatentAttention(q, q_stride, rows, layer, layout, cache, shape, kv_b, out);
  }
  void Argmax(const float* x, int rows, int n, int32_t* out) override {
    inner_->Argmax(x, rows, n, out);
  }

 protected:
  Backend& inner() { return *inner_; }

 private:
  const std::unique_ptr<Backend> inner_;
};

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_TESTING_FORWARDING_BACKEND_H_
