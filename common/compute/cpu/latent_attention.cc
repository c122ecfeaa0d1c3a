// CpuBackend::LatentAttention: multi-head latent attention over the paged
// latent cache, through BLAS products on gathered f32 copies of the cached
// latents (see LatentShape in backend.h for the two forms).
//
// A task is one run of rows (one sequence at consecutive positions: a
// prefill chunk, or a single decode row) and a range of heads. It widens the
// run's cached slots once into [kv_rank + rope_dim][ctx] (the cache's own
// dimension-major order), then per form:
//   absorbed: q_lat[h] = W_uk[h]^T q_nope[h], scores = q_lat[h] . c + q_rope[h]
//     . k_rope for all heads of all rows in one product, o_lat = P c, out[h] =
//     W_uv[h] o_lat[h];
//   expanded: k_nope[h] and v[h] of every cached position = W_kv_b[h] c, then
//     ordinary attention per head.
// Multiply-adds per head for n rows over ctx positions: absorbed n (r (nope +
// v) + ctx (2 r + rope)), expanded ctx r (nope + v) + n ctx (nope + rope +
// v), with r = kv_rank. The cheaper is taken: expanded for a prefill chunk
// whose rows are most of its context, absorbed for decode rows and short
// chunks after a long prefix.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/compute/cpu/blas_library.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/compute/cpu/cpu_kernels.h"

namespace tandem {
namespace {

// Scores of one task are at most this many floats: rows are tiled to fit.
constexpr int64_t kLatentScoreFloats = int64_t{1} << 21;
// Below this much work the call runs on the calling thread.
constexpr int64_t kLatentParallelThreshold = 1 << 14;

double AbsorbedCost(const LatentShape& s, int64_t n, int64_t ctx) {
  const double r = s.kv_rank;
  return static_cast<double>(n) * (r * (s.nope_dim + s.v_dim) + ctx * (2 * r + s.rope_dim));
}

double ExpandedCost(const LatentShape& s, int64_t n, int64_t ctx) {
  const double r = s.kv_rank;
  return static_cast<double>(ctx) * r * (s.nope_dim + s.v_dim) +
         static_cast<double>(n) * ctx * (s.nope_dim + s.rope_dim + s.v_dim);
}

// The cached slots of positions [0, ctx) of `blocks`, widened to f32 as
// keys[d * ctx + t] for d < layout.kv_dim.
void GatherLatents(std::span<const int32_t> blocks, int ctx, int layer, const KvLayout& layout,
                   const void* cache, float* keys) {
  const int bs = layout.block_size, dim = layout.kv_dim;
  const uint8_t* base = static_cast<const uint8_t*>(cache);
  const size_t element = layout.element_bytes();
  for (int t0 = 0; t0 < ctx; t0 += bs) {
    const int32_t block = blocks[t0 / bs];
    const int valid = std::min(bs, ctx - t0);
    if (layout.dtype == DType::kI8) {
      const auto* scales =
          reinterpret_cast<const float*>(base + layout.KeyScaleOffset(layer, block, 0));
      for (int d = 0; d < dim; ++d) {
        cpu::WidenInt8(reinterpret_cast<const int8_t*>(base + layout.KeyOffset(layer, block, 0, d)),
                       scales, 0.0f, keys + static_cast<size_t>(d) * ctx + t0, valid);
      }
      continue;
    }
    for (int d = 0; d < dim; ++d) {
      cpu::Widen(base + layout.KeyOffset(layer, block, 0, d) * element, layout.dtype,
                 keys + static_cast<size_t>(d) * ctx + t0, valid);
    }
  }
}

// Below this many rows the up-projections run as plain loops: BLAS would
// copy each head's [nope or v, r] slice of kv_b into its panel format on
// every call, which costs more than the product of a decode row.
constexpr int kLatentLoopRows = 4;

// out[i, :r] = scale * q[i, :nope] W (W [nope, r], row-major), rows of q
// `q_stride` apart and of out `out_stride` apart.
void AbsorbRows(const float* q, int q_stride, const float* w, int nope, int r, float scale, int m,
                float* out, int out_stride) {
  for (int i = 0; i < m; ++i) {
    float* o = out + static_cast<size_t>(i) * out_stride;
    std::fill(o, o + r, 0.0f);
    for (int k = 0; k < nope; ++k) {
      const float a = scale * q[static_cast<size_t>(i) * q_stride + k];
      const float* wk = w + static_cast<size_t>(k) * r;
#pragma omp simd
      for (int j = 0; j < r; ++j) o[j] += a * wk[j];
    }
  }
}

// out[i, :v] = W x[i, :r] (W [v, r], row-major).
void ProjectRows(const float* x, int x_stride, const float* w, int v, int r, int m, float* out,
                 int out_stride) {
  for (int i = 0; i < m; ++i) {
    const float* xi = x + static_cast<size_t>(i) * x_stride;
    for (int k = 0; k < v; ++k) {
      const float* wk = w + static_cast<size_t>(k) * r;
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int j = 0; j < r; ++j) sum += wk[j] * xi[j];
      out[static_cast<size_t>(i) * out_stride + k] = sum;
    }
  }
}

}  // namespace

absl::Status CpuBackend::SupportsLatentAttention() const { return absl::OkStatus(); }

void CpuBackend::LatentAttention(const float* q, int q_stride, std::span<const AttentionRow> rows,
                                 int layer, const KvLayout& layout, const void* cache,
                                 const LatentShape& s, const float* kv_b, float* out) {
  if (rows.empty()) return;
  // Runs of rows, each expanded or absorbed; the absorbed ones' rows are
  // numbered compactly, so that the up-projections run once for all of
  // them (one pass over kv_b a step, not one a sequence).
  struct Run {
    int64_t first;  // into rows
    int n;
    bool expand;
    int64_t compact;  // the first row's number among the absorbed rows
  };
  std::vector<Run> runs;
  int64_t absorbed = 0;
  for (size_t i = 0; i < rows.size();) {
    size_t e = i + 1;
    while (e < rows.size() && rows[e].blocks.data() == rows[i].blocks.data() &&
           rows[e].position == rows[e - 1].position + 1) {
      ++e;
    }
    const int n = static_cast<int>(e - i), ctx = rows[e - 1].position + 1;
    const bool expand = s.form == LatentShape::Form::kExpanded ||
                        (s.form == LatentShape::Form::kCheaper &&
                         ExpandedCost(s, n, ctx) < AbsorbedCost(s, n, ctx));
    runs.push_back({static_cast<int64_t>(i), n, expand, expand ? -1 : absorbed});
    if (!expand) absorbed += n;
    i = e;
  }
  const int h_total = s.n_heads, r = s.kv_rank, dim = r + s.rope_dim, up = s.nope_dim + s.v_dim;
  const int out_stride = h_total * s.v_dim;
  int64_t work = 0;
  for (const AttentionRow& row : rows) work += int64_t{row.position + 1} * layout.kv_dim;
  const bool parallel = work * h_total > kLatentParallelThreshold;
  const CBLAS_ORDER kRow = CblasRowMajor;

  // Absorbed queries [rows][heads][dim]: q_nope W_uk[h], scaled, then the
  // scaled rope part.
  latent_q_.resize(static_cast<size_t>(absorbed) * h_total * dim);
  latent_o_.resize(static_cast<size_t>(absorbed) * h_total * r);
  std::vector<int64_t> absorbed_rows;
  for (const Run& run : runs) {
    if (run.expand) continue;
    for (int i = 0; i < run.n; ++i) absorbed_rows.push_back(run.first + i);
  }
  latent_in_.resize(static_cast<size_t>(absorbed) * h_total * std::max(s.nope_dim, s.v_dim));
  float* q_nope = latent_in_.data();  // the absorbed rows' no-rope parts, contiguous
  const int nope_stride = h_total * s.nope_dim;
  for (int64_t a = 0; a < absorbed; ++a) {
    const float* src = q + absorbed_rows[a] * q_stride;
    std::copy(src, src + nope_stride, q_nope + a * nope_stride);
    float* qp = latent_q_.data() + a * h_total * dim;
    const float* rope = src + nope_stride;
    for (int h = 0; h < h_total; ++h) {
      for (int d = 0; d < s.rope_dim; ++d) qp[h * dim + r + d] = rope[h * s.rope_dim + d] * s.scale;
    }
  }
  const int m = static_cast<int>(absorbed);
#pragma omp parallel for num_threads(num_threads_) if (parallel && m > 0)
  for (int h = 0; h < h_total; ++h) {
    omp_set_num_threads(1);
    const float* w_uk = kv_b + static_cast<size_t>(h) * up * r;
    float* dst = latent_q_.data() + static_cast<size_t>(h) * dim;
    if (m <= kLatentLoopRows) {
      AbsorbRows(q_nope + h * s.nope_dim, nope_stride, w_uk, s.nope_dim, r, s.scale, m, dst,
                 h_total * dim);
    } else if (m > 0) {
      blas_->sgemm(kRow, CblasNoTrans, CblasNoTrans, m, r, s.nope_dim, s.scale,
                   q_nope + h * s.nope_dim, nope_stride, w_uk, r, 0.0f, dst, h_total * dim);
    }
  }

  // Heads are split into chunks so that one run still feeds every thread.
  const int chunks =
      std::clamp(static_cast<int>((num_threads_ + runs.size() - 1) / runs.size()), 1, h_total);
  const int64_t tasks = static_cast<int64_t>(runs.size()) * chunks;
#pragma omp parallel num_threads(num_threads_) if (parallel)
  {
    omp_set_num_threads(1);  // BLAS on this task's thread (see PagedAttention)
    thread_local std::vector<float> scratch;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const Run& run = runs[task / chunks];
      const int chunk = static_cast<int>(task % chunks);
      const int h0 = static_cast<int>(int64_t{h_total} * chunk / chunks);
      const int h1 = static_cast<int>(int64_t{h_total} * (chunk + 1) / chunks);
      const std::span<const AttentionRow> run_rows = rows.subspan(run.first, run.n);
      if (run.expand) {
        LatentExpanded(q + run.first * q_stride, q_stride, run_rows, h0, h1, layer, layout, cache,
                       s, kv_b, scratch, out + run.first * out_stride);
      } else {
        LatentAbsorbed(latent_q_.data() + run.compact * h_total * dim, run_rows, h0, h1, layer,
                       layout, cache, s, scratch, latent_o_.data() + run.compact * h_total * r);
      }
    }
  }

  // out[h] = o_lat[h] W_uv[h]^T for the absorbed rows, then to their places.
  float* projected = latent_in_.data();  // [rows][heads * v_dim]
#pragma omp parallel for num_threads(num_threads_) if (parallel && m > 0)
  for (int h = 0; h < h_total; ++h) {
    omp_set_num_threads(1);
    const float* oh = latent_o_.data() + static_cast<size_t>(h) * r;
    const float* w_uv = kv_b + (static_cast<size_t>(h) * up + s.nope_dim) * r;
    float* dst = projected + static_cast<size_t>(h) * s.v_dim;
    if (m <= kLatentLoopRows) {
      ProjectRows(oh, h_total * r, w_uv, s.v_dim, r, m, dst, out_stride);
    } else if (m > 0) {
      blas_->sgemm(kRow, CblasNoTrans, CblasTrans, m, s.v_dim, r, 1.0f, oh, h_total * r, w_uv, r,
                   0.0f, dst, out_stride);
    }
  }
  for (int64_t a = 0; a < absorbed; ++a) {
    std::copy(projected + a * out_stride, projected + (a + 1) * out_stride,
              out + absorbed_rows[a] * out_stride);
  }
}

void CpuBackend::LatentExpanded(const float* q, int q_stride, std::span<const AttentionRow> rows,
                                int h0, int h1, int layer, const KvLayout& layout,
                                const void* cache, const LatentShape& s, const float* kv_b,
                                std::vector<float>& scratch, float* out) const {
  const int n = static_cast<int>(rows.size());
  const int ctx = rows.back().position + 1;
  const int r = s.kv_rank, dim = r + s.rope_dim, up = s.nope_dim + s.v_dim;
  const int out_stride = s.n_heads * s.v_dim;
  const float* q_rope = q + static_cast<size_t>(s.n_heads) * s.nope_dim;
  const size_t key_floats = static_cast<size_t>(dim) * ctx;
  const CBLAS_ORDER kRow = CblasRowMajor;
  // Per head: k_nope and v of every position [ctx][up], then scores of
  // tiles of rows.
  const int tile = static_cast<int>(std::clamp<int64_t>(kLatentScoreFloats / ctx, 1, n));
  const size_t need = key_floats + static_cast<size_t>(ctx) * up + size_t{1} * tile * ctx;
  if (scratch.size() < need) scratch.resize(need);
  float* keys = scratch.data();
  float* kv = keys + key_floats;
  float* scores = kv + static_cast<size_t>(ctx) * up;
  GatherLatents(rows[0].blocks, ctx, layer, layout, cache, keys);
  for (int h = h0; h < h1; ++h) {
    // kv[t] = W_kv_b[h] c_t: (c^T)^T [ctx, r] times W_kv_b[h]^T [r, up].
    blas_->sgemm(kRow, CblasTrans, CblasTrans, ctx, up, r, 1.0f, keys, ctx,
                 kv_b + static_cast<size_t>(h) * up * r, r, 0.0f, kv, up);
    for (int i0 = 0; i0 < n; i0 += tile) {
      const int m = std::min(tile, n - i0);
      const float* qn = q + static_cast<size_t>(i0) * q_stride + h * s.nope_dim;
      const float* qr = q_rope + static_cast<size_t>(i0) * q_stride + h * s.rope_dim;
      blas_->sgemm(kRow, CblasNoTrans, CblasTrans, m, ctx, s.nope_dim, s.scale, qn, q_stride, kv,
                   up, 0.0f, scores, ctx);
      blas_->sgemm(kRow, CblasNoTrans, CblasNoTrans, m, ctx, s.rope_dim, s.scale, qr, q_stride,
                   keys + static_cast<size_t>(r) * ctx, ctx, 1.0f, scores, ctx);
      for (int i = 0; i < m; ++i) {
        cpu::CausalSoftmaxRow(scores + static_cast<size_t>(i) * ctx, rows[i0 + i].position + 1,
                              ctx);
      }
      blas_->sgemm(kRow, CblasNoTrans, CblasNoTrans, m, s.v_dim, ctx, 1.0f, scores, ctx,
                   kv + s.nope_dim, up, 0.0f,
                   out + static_cast<size_t>(i0) * out_stride + h * s.v_dim, out_stride);
    }
  }
}

void CpuBackend::LatentAbsorbed(const float* qp, std::span<const AttentionRow> rows, int h0, int h1,
                                int layer, const KvLayout& layout, const void* cache,
                                const LatentShape& s, std::vector<float>& scratch,
                                float* o_lat) const {
  // Scores of the run's rows for heads [h0, h1) in one product (queries
  // [rows][all heads][dim]: rows h_total * dim apart), softmax, then the
  // weighted sums of the latents.
  const int n = static_cast<int>(rows.size());
  const int ctx = rows.back().position + 1;
  const int r = s.kv_rank, dim = r + s.rope_dim, heads = h1 - h0, h_total = s.n_heads;
  const size_t key_floats = static_cast<size_t>(dim) * ctx;
  const int tile =
      static_cast<int>(std::clamp<int64_t>(kLatentScoreFloats / (int64_t{heads} * ctx), 1, n));
  const size_t need = key_floats + static_cast<size_t>(tile) * heads * ctx;
  if (scratch.size() < need) scratch.resize(need);
  float* keys = scratch.data();
  float* scores = keys + key_floats;
  GatherLatents(rows[0].blocks, ctx, layer, layout, cache, keys);
  const CBLAS_ORDER kRow = CblasRowMajor;
  for (int i0 = 0; i0 < n; i0 += tile) {
    const int m = std::min(tile, n - i0);
    if (heads == h_total) {  // the tile's queries are contiguous: one product
      const float* qi = qp + static_cast<size_t>(i0) * h_total * dim;
      blas_->sgemm(kRow, CblasNoTrans, CblasNoTrans, m * heads, ctx, dim, 1.0f, qi, dim, keys, ctx,
                   0.0f, scores, ctx);
      for (int i = 0; i < m; ++i) {
        for (int h = 0; h < heads; ++h) {
          cpu::CausalSoftmaxRow(scores + (static_cast<size_t>(i) * heads + h) * ctx,
                                rows[i0 + i].position + 1, ctx);
        }
      }
      blas_->sgemm(kRow, CblasNoTrans, CblasTrans, m * heads, r, ctx, 1.0f, scores, ctx, keys, ctx,
                   0.0f, o_lat + static_cast<size_t>(i0) * h_total * r, r);
      continue;
    }
    for (int i = 0; i < m; ++i) {
      const float* qi = qp + (static_cast<size_t>(i0 + i) * h_total + h0) * dim;
      float* si = scores + static_cast<size_t>(i) * heads * ctx;
      blas_->sgemm(kRow, CblasNoTrans, CblasNoTrans, heads, ctx, dim, 1.0f, qi, dim, keys, ctx,
                   0.0f, si, ctx);
      for (int h = 0; h < heads; ++h) {
        cpu::CausalSoftmaxRow(si + static_cast<size_t>(h) * ctx, rows[i0 + i].position + 1, ctx);
      }
      // o_lat = P c: c^T is the first r rows of keys.
      blas_->sgemm(kRow, CblasNoTrans, CblasTrans, heads, r, ctx, 1.0f, si, ctx, keys, ctx, 0.0f,
                   o_lat + (static_cast<size_t>(i0 + i) * h_total + h0) * r, r);
    }
  }
}

}  // namespace tandem
