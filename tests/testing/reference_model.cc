#include "tests/testing/reference_model.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace tandem::testing {
namespace {

using Vec = std::vector<double>;

// y = W x (+ bias) for W [rows, cols] row-major, in any stored type.
Vec MatVec(const Tensor& w, const Vec& x, int rows, const Tensor& bias = {}) {
  const size_t cols = x.size();
  Vec y(rows, 0.0);
  for (int r = 0; r < rows; ++r) {
    double acc = bias.empty() ? 0.0 : double{bias.At(r)};
    for (size_t c = 0; c < cols; ++c) acc += double{w.At(int64_t(r * cols + c))} * x[c];
    y[r] = acc;
  }
  return y;
}

Vec RmsNorm(const Vec& x, const Tensor& weight, double eps) {
  double ss = 0.0;
  for (double v : x) ss += v * v;
  const double scale = 1.0 / std::sqrt(ss / x.size() + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * scale * weight.At(int64_t(i));
  return y;
}

// RMSNorm of each group of weight.size() values of x (per head, or one
// group over the whole projection).
Vec NormGroups(const Vec& x, const Tensor& weight, double eps) {
  const size_t n = weight.size();
  Vec y;
  for (size_t at = 0; at < x.size(); at += n) {
    const Vec part = RmsNorm(Vec(x.begin() + at, x.begin() + at + n), weight, eps);
    y.insert(y.end(), part.begin(), part.end());
  }
  return y;
}

// Frequency of pair i: theta^(-2i/head_dim), then Meta's llama3 scaling
// (long wavelengths slowed by `factor`, short ones kept, the band between
// interpolated) or linear scaling (all slowed by `factor`).
double Frequency(const ModelConfig& c, int i) {
  const double f = std::pow(double{c.rope_theta}, -2.0 * i / c.head_dim());
  const RopeScaling& s = c.rope_scaling;
  if (s.type == RopeScaling::Type::kLinear) return f / s.factor;
  if (s.type != RopeScaling::Type::kLlama3) return f;
  const double wavelength = 2 * std::numbers::pi / f;
  const double old_context = s.original_max_position;
  if (wavelength < old_context / s.high_freq_factor) return f;
  if (wavelength > old_context / s.low_freq_factor) return f / s.factor;
  const double smooth =
      (old_context / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1 - smooth) * f / s.factor + smooth * f;
}

// Rotates the pairs of each head by pos * frequency: (2i, 2i+1), or
// (i, i + head_dim/2) for half-split checkpoints.
void Rope(Vec& v, const ModelConfig& c, int pos) {
  const int head_dim = c.head_dim();
  const bool split = c.rope_layout == RopeLayout::kHalfSplit;
  for (size_t h = 0; h < v.size() / head_dim; ++h) {
    for (int i = 0; i < head_dim / 2; ++i) {
      const double angle = pos * Frequency(c, i);
      double& a = v[h * head_dim + (split ? i : 2 * i)];
      double& b = v[h * head_dim + (split ? i + head_dim / 2 : 2 * i + 1)];
      const double ra = a * std::cos(angle) - b * std::sin(angle);
      const double rb = a * std::sin(angle) + b * std::cos(angle);
      a = ra;
      b = rb;
    }
  }
}

}  // namespace

std::vector<std::vector<double>> ReferenceLogits(const ModelWeights& weights,
                                                 std::span<const int32_t> tokens) {
  const ModelConfig& c = weights.config;
  const int d = c.dim, hd = c.head_dim(), kv_dim = c.kv_dim(), q_dim = c.q_dim();
  const int group = c.n_heads / c.n_kv_heads;
  // keys[layer][pos], values[layer][pos]
  std::vector<std::vector<Vec>> keys(c.n_layers), values(c.n_layers);
  std::vector<std::vector<double>> out;

  for (size_t pos = 0; pos < tokens.size(); ++pos) {
    Vec x(d);
    for (int i = 0; i < d; ++i) x[i] = weights.token_embedding.At(int64_t{tokens[pos]} * d + i);
    for (int l = 0; l < c.n_layers; ++l) {
      const LayerWeights& w = weights.layers[l];
      const Vec xb = RmsNorm(x, w.rms_att, c.norm_eps);
      Vec q = MatVec(w.wq, xb, q_dim, w.bq);
      Vec k = MatVec(w.wk, xb, kv_dim, w.bk);
      const Vec v = MatVec(w.wv, xb, kv_dim, w.bv);
      if (c.qk_norm != QkNorm::kNone) {
        q = NormGroups(q, w.q_norm, c.norm_eps);
        k = NormGroups(k, w.k_norm, c.norm_eps);
      }
      Rope(q, c, static_cast<int>(pos));
      Rope(k, c, static_cast<int>(pos));
      keys[l].push_back(k);
      values[l].push_back(v);

      Vec att(q_dim, 0.0);
      for (int h = 0; h < c.n_heads; ++h) {
        const int kvh = h / group;
        std::vector<double> scores(pos + 1);
        for (size_t t = 0; t <= pos; ++t) {
          double dot = 0.0;
          for (int i = 0; i < hd; ++i) dot += q[h * hd + i] * keys[l][t][kvh * hd + i];
          scores[t] = dot / std::sqrt(double(hd));
        }
        const double max = *std::max_element(scores.begin(), scores.end());
        double sum = 0.0;
        for (double& s : scores) sum += (s = std::exp(s - max));
        for (size_t t = 0; t <= pos; ++t) {
          for (int i = 0; i < hd; ++i) {
            att[h * hd + i] += scores[t] / sum * values[l][t][kvh * hd + i];
          }
        }
      }
      const Vec o = MatVec(w.wo, att, d);
      for (int i = 0; i < d; ++i) x[i] += o[i];

      const Vec xf = RmsNorm(x, w.rms_ffn, c.norm_eps);
      const Vec gate = MatVec(w.w1, xf, c.hidden_dim);
      const Vec up = MatVec(w.w3, xf, c.hidden_dim);
      Vec hidden(c.hidden_dim);
      for (int i = 0; i < c.hidden_dim; ++i) {
        hidden[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
      }
      const Vec down = MatVec(w.w2, hidden, d);
      for (int i = 0; i < d; ++i) x[i] += down[i];
    }
    out.push_back(
        MatVec(weights.classifier, RmsNorm(x, weights.rms_final, c.norm_eps), c.vocab_size));
  }
  return out;
}

double MaxRelativeError(std::span<const float> actual, std::span<const double> expected) {
  double max_diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < expected.size(); ++i) {
    // Written so that a NaN difference wins: std::max would drop it and let
    // a NaN output pass.
    const double diff = std::abs(double{actual[i]} - expected[i]);
    if (!(diff <= max_diff)) max_diff = diff;
    scale = std::max(scale, std::abs(expected[i]));
  }
  return scale > 0.0 ? max_diff / scale : max_diff;
}

}  // namespace tandem::testing
