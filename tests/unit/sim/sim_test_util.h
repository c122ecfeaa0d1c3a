// What the simulator's tests share: a model shape small enough to build in
// a millisecond and a one-thread CPU backend.
#ifndef TANDEM_TESTS_UNIT_SIM_SIM_TEST_UTIL_H_
#define TANDEM_TESTS_UNIT_SIM_SIM_TEST_UTIL_H_

#include <memory>

#include "common/compute/cpu/cpu_backend.h"
#include "common/model/model_config.h"

namespace tandem::sim::testing {

inline ModelConfig TinyShape(int seq_len = 128) {
  return ModelConfig{.dim = 64,
                     .hidden_dim = 96,
                     .n_layers = 3,
                     .n_heads = 8,
                     .n_kv_heads = 4,
                     .vocab_size = 101,
                     .seq_len = seq_len,
                     .shared_classifier = true};
}

inline std::unique_ptr<Backend> OneThread() {
  return CpuBackend::Create(CpuBackendOptions{1}).value();
}

}  // namespace tandem::sim::testing

#endif  // TANDEM_TESTS_UNIT_SIM_SIM_TEST_UTIL_H_
