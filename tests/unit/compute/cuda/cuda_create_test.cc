// CudaBackend::Create on any machine: without a device (or driver) it must
// fail with FAILED_PRECONDITION pointing at the CPU backend; with one it
// must succeed. Not labelled `gpu`, so CPU-only CI runs it.
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "common/compute/cuda/cuda_backend.h"
#include "common/compute/cuda/kernels.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

// Runs everywhere: without a device Create must say so clearly.
TEST(CudaBackendCreate, FailsCleanlyWithoutADeviceAndSucceedsWithOne) {
  auto backend = CudaBackend::Create();
  if (!backend.ok()) {
    EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition) << backend.status();
    EXPECT_THAT(backend.status().message(), HasSubstr("no CUDA device"));
    EXPECT_THAT(backend.status().message(), HasSubstr("use the CPU backend"));
    // Asking for another device fails the same way.
    auto other = CudaBackend::Create({.device = 3});
    EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition) << other.status();
    return;
  }
  CudaBackend& cuda = **backend;
  EXPECT_EQ(cuda.name(), "cuda");
  ::testing::Test::RecordProperty("device", cuda.Describe());
  // A round trip through device memory.
  const std::vector<float> in = {1.5f, -2.0f, 3.25f};
  std::vector<float> out(in.size());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceBuffer> buffer, cuda.Allocate(sizeof(float) * 3));
  cuda.CopyToDevice(in.data(), buffer->data(), sizeof(float) * 3);
  cuda.CopyToHost(buffer->data(), out.data(), sizeof(float) * 3);
  EXPECT_OK(cuda.Synchronize());
  EXPECT_EQ(out, in);
  EXPECT_EQ(CudaBackend::Create({.device = 1 << 20}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The host side of the decode products' dispatch, on any machine: which
// products the weight-streaming kernel takes (16-bit weights, 1 to
// kMaxSkinnyRows rows, k a multiple of 8, 16-byte aligned operands), and
// that a launch it cannot take is refused before the device is touched.
TEST(SkinnyProductDispatch, TakesOnlyWhatTheKernelStreams) {
  alignas(16) static unsigned char bytes[64];
  const void* x = bytes;
  const void* w = bytes + 16;
  for (DType t : {DType::kBF16, DType::kF16}) {
    for (int m = 1; m <= cuda::kMaxSkinnyRows; ++m) {
      EXPECT_TRUE(cuda::SkinnyProductApplies(t, x, w, m, 4096)) << m;
    }
    EXPECT_FALSE(cuda::SkinnyProductApplies(t, x, w, 0, 4096));
    EXPECT_FALSE(cuda::SkinnyProductApplies(t, x, w, cuda::kMaxSkinnyRows + 1, 4096));
    EXPECT_FALSE(cuda::SkinnyProductApplies(t, x, w, 1, 4092));  // k not a multiple of 8
    EXPECT_FALSE(cuda::SkinnyProductApplies(t, x, w, 1, 0));
    EXPECT_FALSE(cuda::SkinnyProductApplies(t, bytes + 8, w, 1, 4096));  // x misaligned
    EXPECT_FALSE(cuda::SkinnyProductApplies(t, x, bytes + 2, 1, 4096));  // w misaligned
  }
  for (DType t : {DType::kF32, DType::kQ8_0, DType::kQ4_K, DType::kI8}) {
    EXPECT_FALSE(cuda::SkinnyProductApplies(t, x, w, 1, 4096)) << DTypeName(t);
  }
  float out[4];
  EXPECT_EQ(cuda::LaunchSkinnyProduct(bytes + 8, w, DType::kBF16, out, 1, 4, 4096, 0.0f),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchSkinnyProduct(x, w, DType::kF32, out, 1, 4, 4096, 0.0f),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchSkinnyProduct(x, w, DType::kBF16, out, 1, 0, 4096, 0.0f), cudaSuccess);
}

}  // namespace
}  // namespace tandem
