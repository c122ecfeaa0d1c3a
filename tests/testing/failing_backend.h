// FailingBackend: a fake of a device that fails part way through the work
// it is given. It forwards to another backend until armed (FailAfter); then
// the operation that many operations later fails, and, as the CUDA backend
// does with a CUDA error, it keeps that error as its status() and skips
// every operation after it (their outputs keep whatever they held:
// garbage). Operations are the copies and the compute calls; Allocate is
// not one.
#ifndef TANDEM_TESTS_TESTING_FAILING_BACKEND_H_
#define TANDEM_TESTS_TESTING_FAILING_BACKEND_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/compute/backend.h"
#include "tests/testing/forwarding_backend.h"

namespace tandem::testing {

// Thread-safe: a test arms it while another thread computes.
class FailingBackend final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;

  // The operation `ops` operations from now fails (0: the next one).
  void FailAfter(int64_t ops) {
    absl::MutexLock lock(&mu_);
    fail_at_ = operations_ + ops;
  }
  // Operations run so far (the failed one and skipped ones not counted).
  int64_t operations() const {
    absl::MutexLock lock(&mu_);
    return operations_;
  }

  absl::Status status() const override {
    absl::MutexLock lock(&mu_);
    return status_;
  }

  void CopyToDevice(const void* h, void* d, size_t n) override {
    if (Begin()) ForwardingBackend::CopyToDevice(h, d, n);
  }
  void CopyToHost(const void* d, void* h, size_t n) override {
    if (Begin()) ForwardingBackend::CopyToHost(d, h, n);
  }
  void MatMul(const float* x, MatrixRef w, float* out, int m, int n, int k, bool acc) override {
    if (Begin()) ForwardingBackend::MatMul(x, w, out, m, n, k, acc);
  }
  void Embed(MatrixRef t, std::span<const int32_t> ids, int dim, float* out) override {
    if (Begin()) ForwardingBackend::Embed(t, ids, dim, out);
  }
  void AddBias(float* x, int stride, const float* bias, int rows, int n) override {
    if (Begin()) ForwardingBackend::AddBias(x, stride, bias, rows, n);
  }
  void RmsNorm(const float* x, const float* w, float* out, int rows, int dim, float eps) override {
    if (Begin()) ForwardingBackend::RmsNorm(x, w, out, rows, dim, eps);
  }
  void Rope(float* q, int qs, float* k, int ks, std::span<const int32_t> positions,
            const AttentionShape& shape, const float* cos_sin) override {
    if (Begin()) ForwardingBackend::Rope(q, qs, k, ks, positions, shape, cos_sin);
  }
  void SwiGlu(const float* gate_up, float* out, int rows, int hidden) override {
    if (Begin()) ForwardingBackend::SwiGlu(gate_up, out, rows, hidden);
  }
  void WriteKv(const float* k, int ks, const float* v, int vs, std::span<const AttentionRow> rows,
               int layer, const KvLayout& layout, void* cache) override {
    if (Begin()) ForwardingBackend::WriteKv(k, ks, v, vs, rows, layer, layout, cache);
  }
  void PagedAttention(const float* q, int qs, std::span<const AttentionRow> rows, int layer,
                      const KvLayout& layout, const void* cache, const AttentionShape& shape,
                      float* out) override {
    if (Begin()) ForwardingBackend::PagedAttention(q, qs, rows, layer, layout, cache, shape, out);
  }

 private:
  // Whether the operation about to start may run.
  bool Begin() {
    absl::MutexLock lock(&mu_);
    if (!status_.ok()) return false;
    if (fail_at_.has_value() && operations_ == *fail_at_) {
      status_ = absl::InternalError(
          absl::StrCat("injected device failure in operation ", operations_ + 1));
      return false;
    }
    ++operations_;
    return true;
  }

  mutable absl::Mutex mu_;
  int64_t operations_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<int64_t> fail_at_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_TESTING_FAILING_BACKEND_H_
