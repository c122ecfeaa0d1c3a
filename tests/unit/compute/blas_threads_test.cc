// A one-thread CPU backend must start no thread, whichever thread calls
// it. Its parallel regions are then inactive, and OpenBLAS (the OpenMP
// flavour), called for products inside one (the attention tiles), sizes its
// team from the calling task's OpenMP default, every core, not from the
// backend: it started a team per product, and two one-thread workers on a
// two-core machine spun four threads, with steps of seconds. The test
// counts pthread_create calls by interposing it (this binary's definition
// comes first in the dynamic lookup, so libgomp's calls reach it).
#include <dlfcn.h>
#include <pthread.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "common/compute/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define TANDEM_NO_INTERPOSER 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define TANDEM_NO_INTERPOSER 1
#endif
#endif

namespace {
std::atomic<int> threads_created{0};
}  // namespace

#ifndef TANDEM_NO_INTERPOSER
extern "C" int pthread_create(pthread_t* thread, const pthread_attr_t* attr, void* (*start)(void*),
                              void* arg) {
  using Create = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  static const Create real = reinterpret_cast<Create>(dlsym(RTLD_NEXT, "pthread_create"));
  threads_created.fetch_add(1);
  return real(thread, attr, start, arg);
}
#endif

namespace tandem {
namespace {

TEST(BlasThreads, AOneThreadBackendsAttentionStartsNoThread) {
#ifdef TANDEM_NO_INTERPOSER
  GTEST_SKIP() << "sanitizers intercept pthread_create themselves";
#endif
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CpuBackend> backend, CpuBackend::Create({.num_threads = 1}));
  // One sequence of 768 positions, its every row attended at once: 64-row
  // tiles whose score and value products go to BLAS (4 query heads over
  // one KV head of 64 dimensions, blocks of 16).
  const AttentionShape shape{4, 1, 64};
  constexpr int kLength = 768, kBlock = 16;
  KvLayout layout;
  layout.n_layers = 1;
  layout.block_size = kBlock;
  layout.kv_dim = shape.n_kv_heads * shape.head_dim;
  layout.num_blocks = kLength / kBlock;
  std::vector<float> cache(layout.total_elements(), 0.5f);
  std::vector<int32_t> blocks(layout.num_blocks);
  for (int i = 0; i < layout.num_blocks; ++i) blocks[i] = i;
  std::vector<AttentionRow> rows;
  for (int p = 0; p < kLength; ++p) rows.push_back({p, blocks});
  const int q_width = shape.n_heads * shape.head_dim;
  std::vector<float> q(rows.size() * q_width, 0.25f), out(rows.size() * q_width);
  // From a thread of its own, as a worker's loop calls it: the thread that
  // created the backend is not the one that steps.
  int created = -1;
  std::thread loop([&] {
    const int before = threads_created.load();
    backend->PagedAttention(q.data(), q_width, rows, 0, layout, cache.data(), shape, out.data());
    created = threads_created.load() - before;
  });
  loop.join();
  EXPECT_EQ(created, 0);
  // Every key and value is 0.5: so is every output.
  for (float v : out) ASSERT_NEAR(v, 0.5f, 1e-5);
}

}  // namespace
}  // namespace tandem
