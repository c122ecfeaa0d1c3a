// Multi-head latent attention in Engine (DeepSeek V2/V3, Kimi K2): the
// weights' layout on upload and the attention half of a layer. The cache
// holds each token's normalised latent and rotated rope key
// (KvLayout::latent); the backend's LatentAttention reads it.
#include "common/base/status_macros.h"
#include "common/engine/engine.h"

namespace tandem {
namespace {

// The q and latent norms are built with their default epsilon in DeepSeek's
// modeling code, not rms_norm_eps (1e-6 in every release all the same).
constexpr float kLatentNormEps = 1e-6f;

}  // namespace

absl::Status Engine::InitLatent(const LayerWeights& lw, Layer& layer) {
  const ModelConfig& c = config_;
  const MlaConfig& a = c.mla;
  const int64_t d = c.dim, heads = c.n_heads, nope = a.qk_nope_head_dim;
  const int64_t width = nope + a.qk_rope_head_dim;
  const bool low_rank = a.q_lora_rank > 0;
  const int64_t k = low_rank ? a.q_lora_rank : d;
  // Query rows head by head ([no-rope, rope] each) become every head's
  // no-rope part, then every head's rope part, so that RoPE and the
  // attention see each contiguous.
  const Tensor& wq = low_rank ? lw.wq_b : lw.wq;
  std::vector<Tensor> parts;
  for (int64_t h = 0; h < heads; ++h) parts.push_back(wq.Slice(h * width * k, nope * k));
  for (int64_t h = 0; h < heads; ++h) {
    parts.push_back(wq.Slice((h * width + nope) * k, a.qk_rope_head_dim * k));
  }
  ASSIGN_OR_RETURN(layer.wq_b, Upload(parts, k));
  if (low_rank) {
    ASSIGN_OR_RETURN(layer.wq_a, Upload({lw.wq_a}, d));
    ASSIGN_OR_RETURN(layer.q_a_norm, UploadF32({lw.q_a_norm}));
  }
  ASSIGN_OR_RETURN(layer.wkv_a, Upload({lw.wkv_a}, d));
  ASSIGN_OR_RETURN(layer.kv_a_norm, UploadF32({lw.kv_a_norm}));
  ASSIGN_OR_RETURN(layer.kv_b, UploadF32({lw.wkv_b}));
  return absl::OkStatus();
}

bool Engine::LatentAttentionLayer(const Layer& layer, int l, int rows,
                                  const std::function<void(int layer)>& kv_written) {
  const ModelConfig& c = config_;
  const MlaConfig& a = c.mla;
  const int d = c.dim, qd = c.q_dim(), heads = c.n_heads, rank = a.kv_lora_rank;
  const int latent_dim = c.kv_cache_dim();
  Backend& b = *backend_;
  if (a.q_lora_rank > 0) {
    const int qr = a.q_lora_rank;
    MatMul(xb_, layer.wq_a, q_low_, rows, qr, d, /*accumulate=*/false);
    b.RmsNormHeads(q_low_, qr, layer.q_a_norm, rows, 1, qr, kLatentNormEps);
    MatMul(q_low_, layer.wq_b, qkv_, rows, qd, qr, /*accumulate=*/false);
  } else {
    MatMul(xb_, layer.wq_b, qkv_, rows, qd, d, /*accumulate=*/false);
  }
  MatMul(xb_, layer.wkv_a, latent_, rows, latent_dim, d, /*accumulate=*/false);
  b.RmsNormHeads(latent_, latent_dim, layer.kv_a_norm, rows, 1, rank, kLatentNormEps);
  // DeepSeek rotates pairs (2i, 2i + 1) of the rope parts, whichever file
  // the weights came from.
  const AttentionShape rope_shape{heads, 1, a.qk_rope_head_dim, /*rope_half_split=*/false};
  b.Rope(qkv_ + int64_t{heads} * a.qk_nope_head_dim, qd, latent_ + rank, latent_dim, positions_,
         rope_shape, rope_);
  b.WriteKv(latent_, latent_dim, nullptr, 0, rows_, l, layout_, cache_);
  if (!b.status().ok()) return false;
  if (kv_written) kv_written(l);
  const LatentShape shape{.n_heads = heads,
                          .kv_rank = rank,
                          .nope_dim = a.qk_nope_head_dim,
                          .rope_dim = a.qk_rope_head_dim,
                          .v_dim = a.v_head_dim,
                          .scale = c.AttentionScale(),
                          .form = options_.latent_form};
  b.LatentAttention(qkv_, qd, rows_, l, layout_, cache_, shape, layer.kv_b, att_);
  return true;
}

}  // namespace tandem
