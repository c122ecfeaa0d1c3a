// Comparisons of ModelWeights for the model tests.
#ifndef TANDEM_TESTS_UNIT_MODEL_WEIGHTS_TESTING_H_
#define TANDEM_TESTS_UNIT_MODEL_WEIGHTS_TESTING_H_

#include <cmath>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "common/model/tensor_list.h"
#include "gtest/gtest.h"

namespace tandem::testing {

// Every tensor of ModelTensors(w.config) by TensorSpec::ToString() (norm
// vectors' names end in "norm"), then the classifier, tied or not.
inline std::vector<std::pair<std::string, Tensor>> NamedTensors(const ModelWeights& w) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const TensorSpec& spec : ModelTensors(w.config)) {
    if (spec.role != TensorRole::kClassifier) out.emplace_back(spec.ToString(), TensorOf(w, spec));
  }
  out.emplace_back("classifier", w.classifier);
  return out;
}

inline void ExpectSameConfig(const ModelConfig& want, const ModelConfig& got) {
  EXPECT_EQ(want.dim, got.dim);
  EXPECT_EQ(want.hidden_dim, got.hidden_dim);
  EXPECT_EQ(want.n_layers, got.n_layers);
  EXPECT_EQ(want.n_heads, got.n_heads);
  EXPECT_EQ(want.n_kv_heads, got.n_kv_heads);
  EXPECT_EQ(want.vocab_size, got.vocab_size);
  EXPECT_EQ(want.seq_len, got.seq_len);
  EXPECT_EQ(want.rope_theta, got.rope_theta);
  EXPECT_EQ(want.norm_eps, got.norm_eps);
  EXPECT_EQ(want.shared_classifier, got.shared_classifier);
  EXPECT_EQ(want.head_dim(), got.head_dim());
  EXPECT_EQ(want.attention_bias, got.attention_bias);
  EXPECT_EQ(want.qk_norm, got.qk_norm);
}

// Expects every tensor of `got` to equal `expected(name, value of want)`,
// bit for bit, reporting the first difference of each tensor.
inline void ExpectWeightsMap(const ModelWeights& want, const ModelWeights& got,
                             const std::function<float(const std::string&, float)>& expected) {
  ExpectSameConfig(want.config, got.config);
  const auto a = NamedTensors(want);
  const auto b = NamedTensors(got);
  ASSERT_EQ(a.size(), b.size());
  for (size_t t = 0; t < a.size(); ++t) {
    ASSERT_EQ(a[t].second.size(), b[t].second.size()) << a[t].first;
    const std::vector<float> av = a[t].second.ToFloats(), bv = b[t].second.ToFloats();
    for (size_t i = 0; i < av.size(); ++i) {
      const float e = expected(a[t].first, av[i]);
      if (std::memcmp(&e, &bv[i], sizeof(float)) != 0) {
        ADD_FAILURE() << a[t].first << "[" << i << "] is " << bv[i] << ", expected " << e;
        break;
      }
    }
  }
}

inline void ExpectSameWeights(const ModelWeights& want, const ModelWeights& got) {
  ExpectWeightsMap(want, got, [](const std::string&, float v) { return v; });
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_UNIT_MODEL_WEIGHTS_TESTING_H_
