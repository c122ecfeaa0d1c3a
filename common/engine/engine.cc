#include "common/engine/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/float16.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/kvcache/kv_layout.h"
#include "common/model/tensor_list.h"

namespace tandem {
namespace {

absl::Status CheckGpuMemoryFraction(double fraction) {
  if (fraction > 0.0 && fraction <= 1.0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("gpu_memory_fraction is ", fraction,
                   "; give the share of the device's memory to fill, in (0, 1] (e.g. 0.9)"));
}

}  // namespace

KvLayout KvLayoutFor(const ModelConfig& config, const EngineOptions& options) {
  return KvLayout{.n_layers = config.n_layers,
                  .num_blocks = options.num_blocks,
                  .block_size = options.block_size,
                  .kv_dim = config.kv_cache_dim(),
                  .dtype = options.kv_dtype.value_or(DType::kF32),
                  .kv_heads = config.is_mla() ? 1 : config.n_kv_heads,
                  .latent = config.is_mla()};
}

Engine::Engine(const ModelConfig& config, std::unique_ptr<Backend> backend,
               const EngineOptions& options)
    : config_(config),
      options_(options),
      layout_(KvLayoutFor(config, options)),
      backend_(std::move(backend)),
      pool_(options.num_blocks) {}

Engine::~Engine() = default;

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const ModelWeights& weights,
                                                       std::unique_ptr<Backend> backend,
                                                       const EngineOptions& options) {
  RETURN_IF_ERROR(weights.config.Validate());
  if (backend == nullptr) return absl::InvalidArgumentError("engine needs a backend");
  if (weights.config.is_mla()) {
    if (absl::Status s = backend->SupportsLatentAttention(); !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("weights from '", weights.source,
                                       "' use multi-head latent attention: ", s.message()));
    }
  }
  EngineOptions opts = options;
  if (opts.block_size <= 0 || opts.block_size > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_size ", opts.block_size, " must be in [1, 4096]"));
  }
  if (opts.num_blocks == 0) {
    opts.num_blocks = static_cast<int>(BlocksFor(weights.config.seq_len, opts.block_size));
  }
  if (opts.num_blocks < 0 || opts.max_batch_tokens <= 0 || opts.max_logit_rows <= 0) {
    return absl::InvalidArgumentError(
        "num_blocks must be >= 0, max_batch_tokens and max_logit_rows > 0");
  }
  if (opts.gpu_memory_fraction.has_value()) {
    RETURN_IF_ERROR(CheckGpuMemoryFraction(*opts.gpu_memory_fraction));
  }
  if (opts.num_blocks > kMaxKvBlocks) {
    return absl::InvalidArgumentError(absl::StrCat("a KV cache of ", opts.num_blocks,
                                                   " blocks; at most ", kMaxKvBlocks,
                                                   " are supported (give fewer --kv_blocks)"));
  }
  const DType wtype = weights.dtype();
  if (weights.layers.size() != static_cast<size_t>(weights.config.n_layers)) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights from '", weights.source, "' have ", weights.layers.size(),
                     " layers; the config says ", weights.config.n_layers));
  }
  for (const TensorSpec& spec : ModelTensors(weights.config)) {
    if (TensorOf(weights, spec).numel != spec.numel()) {
      return absl::InvalidArgumentError(
          absl::StrCat("weights from '", weights.source, "' hold ", TensorOf(weights, spec).numel,
                       " values for ", spec.ToString(), ", which the config (",
                       weights.config.ToString(), ") gives ", spec.numel()));
    }
  }
  // Matrices may mix types (GGUF's Q4_K_M mixes Q4_K and Q6_K). A quantized
  // model keeps its KV cache in bf16 by default (llama.cpp keeps its own in
  // 16 bits). A backend that computes in f32 only gets 16-bit weights
  // widened as they are uploaded, rather than refusing a model it can run;
  // one without a quantized product gets those widened to the compute type
  // (UploadType).
  DType compute = IsQuantized(wtype) ? DType::kBF16 : wtype;
  if (compute != DType::kF32 && !backend->Supports(compute, opts.kv_dtype.value_or(compute)).ok() &&
      backend->Supports(DType::kF32, opts.kv_dtype.value_or(DType::kF32)).ok()) {
    compute = DType::kF32;
    LOG(INFO) << "the " << backend->name() << " backend computes in f32: widening "
              << DTypeName(wtype) << " weights from '" << weights.source << "' as they load";
  } else if (IsQuantized(wtype) && !backend->Supports(wtype, compute).ok()) {
    LOG(INFO) << "the " << backend->name() << " backend has no " << DTypeName(wtype)
              << " product: widening the weights from '" << weights.source << "' to "
              << DTypeName(compute) << " as they load";
  }
  if (!opts.kv_dtype.has_value()) opts.kv_dtype = compute;
  RETURN_IF_ERROR(backend->Supports(compute, *opts.kv_dtype));
  std::unique_ptr<Engine> engine(new Engine(weights.config, std::move(backend), opts));
  engine->weights_dtype_ = compute;
  RETURN_IF_ERROR(engine->Init(weights));
  // Uploads and allocations may have failed without saying so.
  RETURN_IF_ERROR(engine->CheckBackend());
  return engine;
}

absl::StatusOr<int> KvBlocksForDeviceMemory(size_t total_bytes, size_t used_bytes, double fraction,
                                            size_t block_bytes) {
  RETURN_IF_ERROR(CheckGpuMemoryFraction(fraction));
  const double room = fraction * static_cast<double>(total_bytes) - static_cast<double>(used_bytes);
  const double blocks = std::floor(room / static_cast<double>(std::max<size_t>(block_bytes, 1)));
  if (blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpu_memory_fraction ", fraction, " of the device's ", total_bytes >> 20, " MiB is ",
        static_cast<uint64_t>(std::max(0.0, fraction * static_cast<double>(total_bytes))) >> 20,
        " MiB, but the weights and activation buffers take ", used_bytes >> 20,
        " MiB: no room for one KV block of ", block_bytes >> 10,
        " KiB; raise --gpu_memory_fraction (at most 1), give --kv_blocks, or lower "
        "--max_batch_tokens"));
  }
  return static_cast<int>(std::min<double>(blocks, kMaxKvBlocks));
}

absl::StatusOr<void*> Engine::AllocBytes(size_t bytes) {
  ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> buf,
                   backend_->Allocate(std::max<size_t>(bytes, 1)));
  void* p = buf->data();
  buffers_.push_back(std::move(buf));
  return p;
}

absl::StatusOr<Engine::StackedMatrix> Engine::Upload(const std::vector<Tensor>& parts, int64_t k) {
  StackedMatrix stacked;
  for (auto run = parts.begin(); run != parts.end();) {
    const DType type = UploadType(run->dtype);
    auto end = run;
    size_t total = 0;
    int64_t elements = 0;
    for (; end != parts.end() && UploadType(end->dtype) == type; ++end) {
      total += DTypeBytes(type, end->numel);
      elements += end->numel;
    }
    ASSIGN_OR_RETURN(void* dst, AllocBytes(total));
    size_t at = 0;
    for (auto t = run; t != end; ++t) {
      const size_t bytes = DTypeBytes(type, t->numel);
      if (t->dtype == type) {
        backend_->CopyToDevice(t->data, static_cast<uint8_t*>(dst) + at, bytes);
      } else {
        const std::vector<float> wide = t->ToFloats();
        std::vector<uint16_t> narrow;
        const void* src = wide.data();
        if (type != DType::kF32) {
          narrow.resize(wide.size());
          for (size_t i = 0; i < wide.size(); ++i) {
            narrow[i] = type == DType::kBF16 ? Fp32ToBf16(wide[i]) : Fp32ToFp16(wide[i]);
          }
          src = narrow.data();
        }
        backend_->CopyToDevice(src, static_cast<uint8_t*>(dst) + at, bytes);
      }
      at += bytes;
    }
    stacked.push_back({backend_->PrepareWeights(MatrixRef{dst, type}, elements / k, k),
                       static_cast<int>(elements / k)});
    run = end;
  }
  return stacked;
}

absl::StatusOr<float*> Engine::UploadF32(const std::vector<Tensor>& parts) {
  std::vector<float> all;
  for (const Tensor& t : parts) {
    const std::vector<float> f = t.ToFloats();
    all.insert(all.end(), f.begin(), f.end());
  }
  ASSIGN_OR_RETURN(void* dst, AllocBytes(all.size() * sizeof(float)));
  backend_->CopyToDevice(all.data(), dst, all.size() * sizeof(float));
  return static_cast<float*>(dst);
}

absl::Status Engine::Init(const ModelWeights& w) {
  const ModelConfig& c = config_;
  const size_t d = c.dim, q = c.q_dim(), kv = c.kv_dim(), h = c.hidden_dim, v = c.vocab_size;
  auto alloc = [&](size_t floats) -> absl::StatusOr<float*> {
    ASSIGN_OR_RETURN(void* p, AllocBytes(floats * sizeof(float)));
    return static_cast<float*>(p);
  };
  ASSIGN_OR_RETURN(StackedMatrix embedding, Upload({w.token_embedding}, d));
  embedding_ = embedding[0].ref;
  if (c.shared_classifier) {
    classifier_ = embedding_;
  } else {
    ASSIGN_OR_RETURN(StackedMatrix classifier, Upload({w.classifier}, d));
    classifier_ = classifier[0].ref;
  }
  ASSIGN_OR_RETURN(rms_final_, UploadF32({w.rms_final}));
  for (const LayerWeights& lw : w.layers) {
    Layer layer;
    ASSIGN_OR_RETURN(float* p, UploadF32({lw.rms_att, lw.rms_ffn}));
    layer.rms_att = p;
    layer.rms_ffn = p + d;
    layer.bqkv = nullptr;
    layer.q_norm = layer.k_norm = nullptr;
    if (c.is_mla()) {
      RETURN_IF_ERROR(InitLatent(lw, layer));
    } else {
      ASSIGN_OR_RETURN(layer.wqkv, Upload({lw.wq, lw.wk, lw.wv}, d));
      if (c.attention_bias) {
        ASSIGN_OR_RETURN(layer.bqkv, UploadF32({lw.bq, lw.bk, lw.bv}));
      }
      if (c.qk_norm != QkNorm::kNone) {
        ASSIGN_OR_RETURN(layer.q_norm, UploadF32({lw.q_norm, lw.k_norm}));
        layer.k_norm = layer.q_norm + lw.q_norm.numel;
      }
    }
    ASSIGN_OR_RETURN(layer.wo, Upload({lw.wo}, c.attention_out_dim()));
    const int l = static_cast<int>(layers_.size());
    if (c.IsMoeLayer(l)) {
      const MoeConfig& m = c.moe;
      ASSIGN_OR_RETURN(layer.router, Upload({lw.router}, d));
      for (int e = 0; e < m.n_experts; ++e) {
        Expert expert{.hidden = m.expert_hidden};
        ASSIGN_OR_RETURN(expert.w13, Upload({lw.expert_gate[e], lw.expert_up[e]}, d));
        ASSIGN_OR_RETURN(expert.w2, Upload({lw.expert_down[e]}, m.expert_hidden));
        layer.experts.push_back(std::move(expert));
      }
      if (m.shared_hidden > 0) {
        layer.shared.hidden = m.shared_hidden;
        ASSIGN_OR_RETURN(layer.shared.w13, Upload({lw.shared_gate, lw.shared_up}, d));
        ASSIGN_OR_RETURN(layer.shared.w2, Upload({lw.shared_down}, m.shared_hidden));
        if (m.shared_gated) {
          ASSIGN_OR_RETURN(layer.shared_expert_gate, Upload({lw.shared_expert_gate}, d));
        }
      }
      // The bias steers the choice, made on the host.
      router_bias_.resize(c.n_layers);
      if (m.score_bias) router_bias_[l] = lw.router_bias.ToFloats();
    } else {
      ASSIGN_OR_RETURN(layer.w13, Upload({lw.w1, lw.w3}, d));
      ASSIGN_OR_RETURN(layer.w2, Upload({lw.w2}, h));
    }
    layers_.push_back(std::move(layer));
  }

  // RoPE table in float arithmetic, as the reference implementations do, so
  // that greedy text matches theirs token for token.
  const std::vector<float> freqs = c.RopeFrequencies();
  const int half = c.rope_dim() / 2;
  std::vector<float> rope(static_cast<size_t>(c.seq_len) * half * 2);
  for (int pos = 0; pos < c.seq_len; ++pos) {
    for (int i = 0; i < half; ++i) {
      const float angle = static_cast<float>(pos) * freqs[i];
      rope[(static_cast<size_t>(pos) * half + i) * 2] = std::cos(angle);
      rope[(static_cast<size_t>(pos) * half + i) * 2 + 1] = std::sin(angle);
    }
  }
  ASSIGN_OR_RETURN(rope_, UploadF32({Tensor(std::span<const float>(rope))}));

  const size_t t = options_.max_batch_tokens;
  ASSIGN_OR_RETURN(x_, alloc(t * d));
  ASSIGN_OR_RETURN(xb_, alloc(t * d));
  ASSIGN_OR_RETURN(qkv_, alloc(t * (c.is_mla() ? q : q + 2 * kv)));
  ASSIGN_OR_RETURN(att_, alloc(t * c.attention_out_dim()));
  if (c.is_mla()) {
    ASSIGN_OR_RETURN(q_low_, alloc(t * c.mla.q_lora_rank));
    ASSIGN_OR_RETURN(latent_, alloc(t * c.kv_cache_dim()));
  }
  // The widest SwiGLU: the dense layers', an expert's or the shared one's.
  const size_t wide = std::max({h, size_t(c.moe.expert_hidden), size_t(c.moe.shared_hidden)});
  ASSIGN_OR_RETURN(hb_, alloc(t * 2 * wide));
  ASSIGN_OR_RETURN(hb2_, alloc(t * wide));
  if (c.moe.n_experts > 0) {
    ASSIGN_OR_RETURN(router_logits_, alloc(t * c.moe.n_experts));
    ASSIGN_OR_RETURN(expert_in_, alloc(t * d));
    ASSIGN_OR_RETURN(expert_out_, alloc(t * d));
    expert_rows_.resize(c.moe.n_experts);
    expert_weights_.resize(c.moe.n_experts);
    expert_router_ = std::make_unique<ExpertRouter>(c.moe);
    expert_load_.resize(c.n_layers);
    for (int l = 0; l < c.n_layers; ++l) {
      if (c.IsMoeLayer(l)) expert_load_[l].assign(c.moe.n_experts, 0);
    }
  }
  ASSIGN_OR_RETURN(logits_, alloc(static_cast<size_t>(options_.max_logit_rows) * v));
  ASSIGN_OR_RETURN(void* picks, AllocBytes(sizeof(int32_t) * options_.max_logit_rows));
  picks_ = static_cast<int32_t*>(picks);

  // Last, so that a pool sized from the device's memory sees everything
  // else allocated.
  RETURN_IF_ERROR(SizeKvPool());
  if (absl::StatusOr<void*> cache = AllocBytes(layout_.total_bytes()); cache.ok()) {
    cache_ = *cache;
  } else {
    return absl::Status(
        cache.status().code(),
        absl::StrCat("the KV cache of ", layout_.num_blocks, " blocks (",
                     layout_.total_bytes() >> 20, " MiB): ", cache.status().message(),
                     device_memory_bytes_ > 0 && options_.gpu_memory_fraction.has_value()
                         ? "; lower --gpu_memory_fraction"
                         : "; give fewer --kv_blocks"));
  }
  return absl::OkStatus();
}

absl::Status Engine::SizeKvPool() {
  const std::optional<DeviceMemory> memory = backend_->QueryDeviceMemory();
  if (!memory.has_value()) return absl::OkStatus();
  device_memory_bytes_ = memory->total_bytes;
  if (!options_.gpu_memory_fraction.has_value()) return absl::OkStatus();
  const double fraction = *options_.gpu_memory_fraction;
  // What this engine holds, not what the device has free: other engines
  // may be starting on the same device.
  size_t used = 0;
  for (const std::unique_ptr<DeviceBuffer>& buffer : buffers_) used += buffer->size();
  const size_t block_bytes = layout_.block_bytes() * layout_.n_layers;
  ASSIGN_OR_RETURN(const int blocks,
                   KvBlocksForDeviceMemory(memory->total_bytes, used, fraction, block_bytes));
  LOG(INFO) << "KV cache: " << blocks << " blocks of " << layout_.block_size << " tokens ("
            << ((block_bytes * blocks) >> 20) << " MiB), what gpu_memory_fraction " << fraction
            << " of the " << backend_->name() << " device's " << (memory->total_bytes >> 20)
            << " MiB leaves beside " << (used >> 20) << " MiB of weights and activations ("
            << (memory->free_bytes >> 20) << " MiB free now)";
  options_.num_blocks = blocks;
  layout_.num_blocks = blocks;
  pool_ = BlockPool(blocks);
  return absl::OkStatus();
}

absl::StatusOr<double> GpuMemoryFractionFor(Backend& backend, std::optional<double> requested,
                                            int kv_blocks) {
  if (!requested.has_value()) return kDefaultGpuMemoryFraction;
  if (!backend.QueryDeviceMemory().has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gpu_memory_fraction sizes the KV cache in a GPU's memory (--backend cuda); the ",
        std::string(backend.name()), " backend's is sized by --kv_blocks"));
  }
  if (kv_blocks != 0) {
    return absl::InvalidArgumentError(
        "give --kv_blocks or --gpu_memory_fraction, not both: each sizes the KV cache");
  }
  return *requested;
}

absl::Status Engine::status() const {
  absl::MutexLock lock(&failure_mu_);
  return failure_;
}

void Engine::SetFailureListener(std::function<void(const absl::Status&)> listener) {
  absl::MutexLock lock(&listener_mu_);
  listener_ = std::move(listener);
  // Not yet announced: CheckBackend will tell this listener.
  if (failure_announced_ && listener_) listener_(status());
}

absl::Status Engine::CheckBackend() {
  const absl::Status backend = backend_->status();
  // A backend's error is kept for good: OK now means OK so far.
  if (backend.ok()) return absl::OkStatus();
  bool first = false;
  {
    absl::MutexLock lock(&failure_mu_);
    if (failure_.ok()) {
      first = true;
      failure_ = absl::Status(
          backend.code(), absl::StrCat("the ", std::string(backend_->name()),
                                       " backend failed: ", backend.message(),
                                       "; this engine can compute no more (restart the process)"));
    }
  }
  if (first) {
    const absl::Status failure = status();
    LOG(ERROR) << failure;
    absl::MutexLock lock(&listener_mu_);
    failure_announced_ = true;
    if (listener_) listener_(failure);
  }
  return status();
}

absl::StatusOr<std::vector<float>> Engine::Step(std::span<const BatchItem> items,
                                                const std::function<void(int layer)>& kv_written,
                                                std::vector<int32_t>* picks) {
  RETURN_IF_ERROR(CheckBackend());
  RETURN_IF_ERROR(ValidateStep(items, step_limits(), pool_, picks));
  ids_.clear();
  positions_.clear();
  rows_.clear();
  logit_rows_.clear();
  picked_rows_.clear();
  for (const BatchItem& item : items) {
    // Cannot fail: ValidateStep counted the free blocks.
    RETURN_IF_ERROR(item.table->Reserve(static_cast<int>(item.tokens.size()), pool_));
    const int start = item.table->num_tokens();
    for (size_t j = 0; j < item.tokens.size(); ++j) {
      ids_.push_back(item.tokens[j]);
      positions_.push_back(start + static_cast<int32_t>(j));
      rows_.push_back(AttentionRow{start + static_cast<int32_t>(j), item.table->blocks()});
    }
    const int first_row = static_cast<int>(ids_.size() - item.tokens.size());
    if (item.all_logits) {
      for (size_t j = 0; j < item.tokens.size(); ++j) logit_rows_.push_back(first_row + j);
    } else if (item.want_logits) {
      (item.pick_greedy ? picked_rows_ : logit_rows_)
          .push_back(static_cast<int32_t>(ids_.size()) - 1);
    }
  }
  // The picked rows' logits follow the others' in backend memory.
  const int kept = static_cast<int>(logit_rows_.size());
  const int picked = static_cast<int>(picked_rows_.size());
  logit_rows_.insert(logit_rows_.end(), picked_rows_.begin(), picked_rows_.end());
  Forward(static_cast<int>(ids_.size()), kept + picked, kv_written);

  const size_t vocab = static_cast<size_t>(config_.vocab_size);
  if (picked > 0) {
    backend_->Argmax(logits_ + kept * vocab, picked, config_.vocab_size, picks_);
    picks->resize(picked);
    backend_->CopyToHost(picks_, picks->data(), picked * sizeof(int32_t));
  } else if (picks != nullptr) {
    picks->clear();
  }
  std::vector<float> logits(kept * vocab);
  if (!logits.empty()) {
    backend_->CopyToHost(logits_, logits.data(), logits.size() * sizeof(float));
  } else if (picked == 0) {
    // Waits for the pass as the logits would, so that its errors show now.
    float last = 0;
    backend_->CopyToHost(x_, &last, sizeof(last));
  }
  RETURN_IF_ERROR(CheckBackend());
  for (const BatchItem& item : items) item.table->Advance(static_cast<int>(item.tokens.size()));
  return logits;
}

absl::Status Engine::CopySequence(const BlockTable& src, int tokens, BlockTable& dst) {
  if (tokens < 0 || tokens > src.num_tokens() || dst.num_tokens() != 0 ||
      src.block_size() != dst.block_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot copy ", tokens, " tokens of a sequence of ", src.num_tokens(), " into one holding ",
        dst.num_tokens(), " (it must be empty, with the same block size)"));
  }
  RETURN_IF_ERROR(CheckBackend());
  RETURN_IF_ERROR(dst.Reserve(tokens, pool_));  // No-op when already reserved.
  const int blocks = static_cast<int>(BlocksFor(tokens, layout_.block_size));
  const size_t bytes = layout_.block_bytes();
  copy_staging_.resize(bytes);
  uint8_t* cache = static_cast<uint8_t*>(cache_);
  for (int layer = 0; layer < layout_.n_layers; ++layer) {
    for (int b = 0; b < blocks; ++b) {
      // A block holds every K and V of its positions in one layer; the
      // slots past `tokens` in the last one are copied too and stay unused.
      const size_t from = layout_.BlockOffset(layer, src.blocks()[b]) * layout_.element_bytes();
      const size_t to = layout_.BlockOffset(layer, dst.blocks()[b]) * layout_.element_bytes();
      backend_->CopyToHost(cache + from, copy_staging_.data(), bytes);
      backend_->CopyToDevice(copy_staging_.data(), cache + to, bytes);
    }
  }
  RETURN_IF_ERROR(CheckBackend());
  dst.Advance(tokens);
  return absl::OkStatus();
}

void Engine::Forward(int rows, int logit_rows, const std::function<void(int layer)>& kv_written) {
  const ModelConfig& c = config_;
  const int d = c.dim, qd = c.q_dim(), kv = c.kv_dim();
  const int qkv_stride = qd + 2 * kv;
  const AttentionShape shape{c.n_heads, c.n_kv_heads, c.head_dim(),
                             c.rope_layout == RopeLayout::kHalfSplit};
  Backend& b = *backend_;

  b.Embed(embedding_, ids_, d, x_);
  for (int l = 0; l < c.n_layers; ++l) {
    const Layer& layer = layers_[l];
    b.RmsNorm(x_, layer.rms_att, xb_, rows, d, c.norm_eps);
    if (c.is_mla()) {
      if (!LatentAttentionLayer(layer, l, rows, kv_written)) return;
      MatMul(att_, layer.wo, x_, rows, d, c.attention_out_dim(), /*accumulate=*/true);
      Ffn(layer, l, rows);
      continue;
    }
    MatMul(xb_, layer.wqkv, qkv_, rows, qkv_stride, d, /*accumulate=*/false);
    if (layer.bqkv != nullptr) b.AddBias(qkv_, qkv_stride, layer.bqkv, rows, qkv_stride);
    float* q = qkv_;
    float* k = qkv_ + qd;
    float* v = qkv_ + qd + kv;
    if (layer.q_norm != nullptr) {
      const bool per_head = c.qk_norm == QkNorm::kPerHead;
      const int hd = c.head_dim();
      b.RmsNormHeads(q, qkv_stride, layer.q_norm, rows, per_head ? c.n_heads : 1,
                     per_head ? hd : qd, c.norm_eps);
      b.RmsNormHeads(k, qkv_stride, layer.k_norm, rows, per_head ? c.n_kv_heads : 1,
                     per_head ? hd : kv, c.norm_eps);
    }
    b.Rope(q, qkv_stride, k, qkv_stride, positions_, shape, rope_);
    b.WriteKv(k, qkv_stride, v, qkv_stride, rows_, l, layout_, cache_);
    // What follows a failure is garbage: no layer is handed on, and Step
    // returns the error.
    if (!b.status().ok()) return;
    if (kv_written) kv_written(l);
    b.PagedAttention(q, qkv_stride, rows_, l, layout_, cache_, shape, att_);
    MatMul(att_, layer.wo, x_, rows, d, qd, /*accumulate=*/true);
    Ffn(layer, l, rows);
  }
  if (logit_rows == 0) return;
  for (int i = 0; i < logit_rows; ++i) {
    b.RmsNorm(x_ + int64_t{logit_rows_[i]} * d, rms_final_, xb_ + int64_t{i} * d, 1, d, c.norm_eps);
  }
  b.MatMul(xb_, classifier_, logits_, logit_rows, c.vocab_size, d, /*accumulate=*/false);
}

void Engine::Ffn(const Layer& layer, int l, int rows) {
  const ModelConfig& c = config_;
  const int d = c.dim, h = c.hidden_dim;
  backend_->RmsNorm(x_, layer.rms_ffn, xb_, rows, d, c.norm_eps);
  if (!layer.experts.empty()) {
    MoeFfn(layer, l, rows);
    return;
  }
  MatMul(xb_, layer.w13, hb_, rows, 2 * h, d, /*accumulate=*/false);
  backend_->SwiGlu(hb_, hb2_, rows, h);
  MatMul(hb2_, layer.w2, x_, rows, d, h, /*accumulate=*/true);
}

DType Engine::UploadType(DType stored) const {
  if (weights_dtype_ == DType::kF32) return DType::kF32;
  if (backend_->Supports(stored, layout_.dtype).ok()) return stored;
  return weights_dtype_;
}

void Engine::MatMul(const float* x, const StackedMatrix& w, float* out, int m, int n, int k,
                    bool accumulate) {
  if (w.size() == 1) {
    backend_->MatMul(x, w[0].ref, out, m, n, k, accumulate);
    return;
  }
  int column = 0;
  for (const MatrixPart& part : w) {
    backend_->MatMulColumns(x, part.ref, out + column, n, m, part.rows, k, accumulate);
    column += part.rows;
  }
}

}  // namespace tandem
