// CudaBackend::Create on any machine: without a device (or driver) it must
// fail with FAILED_PRECONDITION pointing at the CPU backend; with one it
// must succeed. Not labelled `gpu`, so CPU-only CI runs it.
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "common/compute/cuda/cuda_backend.h"
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

}  // namespace
}  // namespace tandem
