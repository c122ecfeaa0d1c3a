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

struct LatentRun {
  int64_t first;  // index into rows
  int n;
};

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
                                 const LatentShape& shape, const float* kv_b, float* out) {
  std::vector<LatentRun> runs;
  for (size_t r = 0; r < rows.size();) {
    size_t e = r + 1;
    while (e < rows.size() && rows[e].blocks.data() == rows[r].blocks.data() &&
           rows[e].position == rows[e - 1].position + 1) {
      ++e;
    }
    runs.push_back({static_cast<int64_t>(r), static_cast<int>(e - r)});
    r = e;
  }
  // Heads are split into chunks so that one run still feeds every thread.
  const int h_total = shape.n_heads;
  const int chunks =
      std::clamp(static_cast<int>((num_threads_ + runs.size() - 1) / runs.size()), 1, h_total);
  const int64_t tasks = static_cast<int64_t>(runs.size()) * chunks;
  int64_t work = 0;
  for (const AttentionRow& row : rows) work += int64_t{row.position + 1} * layout.kv_dim;

#pragma omp parallel num_threads(num_threads_) if (work * h_total > kLatentParallelThreshold)
  {
    omp_set_num_threads(1);  // BLAS on this task's thread (see PagedAttention)
    thread_local std::vector<float> scratch;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const LatentRun& run = runs[task / chunks];
      const int chunk = static_cast<int>(task % chunks);
      const int h0 = static_cast<int>(int64_t{h_total} * chunk / chunks);
      const int h1 = static_cast<int>(int64_t{h_total} * (chunk + 1) / chunks);
      LatentTask(q + run.first * q_stride, q_stride, rows.subspan(run.first, run.n), h0, h1, layer,
                 layout, cache, shape, kv_b, scratch,
                 out + run.first * shape.n_heads * shape.v_dim);
    }
  }
}

void CpuBackend::LatentTask(const float* q, int q_stride, std::span<const AttentionRow> rows,
                            int h0, int h1, int layer, const KvLayout& layout, const void* cache,
                            const LatentShape& s, const float* kv_b, std::vector<float>& scratch,
                            float* out) const {
  const int n = static_cast<int>(rows.size());
  const int ctx = rows.back().position + 1;
  const int r = s.kv_rank, dim = r + s.rope_dim, heads = h1 - h0, up = s.nope_dim + s.v_dim;
  const int out_stride = s.n_heads * s.v_dim;
  const float* q_rope = q + static_cast<size_t>(s.n_heads) * s.nope_dim;
  const bool expand =
      s.form == LatentShape::Form::kExpanded ||
      (s.form == LatentShape::Form::kCheaper && ExpandedCost(s, n, ctx) < AbsorbedCost(s, n, ctx));
  const size_t key_floats = static_cast<size_t>(dim) * ctx;
  const CBLAS_ORDER kRow = CblasRowMajor;

  if (expand) {
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
    return;
  }

  // Absorbed: queries [rows][heads][dim] so that one product scores all.
  const int tile =
      static_cast<int>(std::clamp<int64_t>(kLatentScoreFloats / (int64_t{heads} * ctx), 1, n));
  const size_t qp_floats = static_cast<size_t>(tile) * heads * dim;
  const size_t need = key_floats + qp_floats + static_cast<size_t>(tile) * heads * ctx +
                      static_cast<size_t>(tile) * heads * r;
  if (scratch.size() < need) scratch.resize(need);
  float* keys = scratch.data();
  float* qp = keys + key_floats;
  float* scores = qp + qp_floats;
  float* o_lat = scores + static_cast<size_t>(tile) * heads * ctx;
  GatherLatents(rows[0].blocks, ctx, layer, layout, cache, keys);
  for (int i0 = 0; i0 < n; i0 += tile) {
    const int m = std::min(tile, n - i0);
    const int qp_stride = heads * dim;
    for (int h = h0; h < h1; ++h) {
      float* qh = qp + (h - h0) * dim;
      // q_lat = q_nope W_uk[h] ([nope, r]), scaled; then the scaled rope part.
      const float* qn = q + static_cast<size_t>(i0) * q_stride + h * s.nope_dim;
      const float* w_uk = kv_b + static_cast<size_t>(h) * up * r;
      if (m <= kLatentLoopRows) {
        AbsorbRows(qn, q_stride, w_uk, s.nope_dim, r, s.scale, m, qh, qp_stride);
      } else {
        blas_->sgemm(kRow, CblasNoTrans, CblasNoTrans, m, r, s.nope_dim, s.scale, qn, q_stride,
                     w_uk, r, 0.0f, qh, qp_stride);
      }
      for (int i = 0; i < m; ++i) {
        const float* src = q_rope + static_cast<size_t>(i0 + i) * q_stride + h * s.rope_dim;
        float* dst = qh + static_cast<size_t>(i) * qp_stride + r;
        for (int d = 0; d < s.rope_dim; ++d) dst[d] = src[d] * s.scale;
      }
    }
    const int mh = m * heads;
    blas_->sgemm(kRow, CblasNoTrans, CblasNoTrans, mh, ctx, dim, 1.0f, qp, dim, keys, ctx, 0.0f,
                 scores, ctx);
    for (int i = 0; i < m; ++i) {
      for (int h = 0; h < heads; ++h) {
        cpu::CausalSoftmaxRow(scores + (static_cast<size_t>(i) * heads + h) * ctx,
                              rows[i0 + i].position + 1, ctx);
      }
    }
    // o_lat = P c: c^T is the first r rows of keys.
    blas_->sgemm(kRow, CblasNoTrans, CblasTrans, mh, r, ctx, 1.0f, scores, ctx, keys, ctx, 0.0f,
                 o_lat, r);
    for (int h = h0; h < h1; ++h) {
      // out[h] = o_lat[h] W_uv[h]^T, W_uv[h] [v, r].
      const float* oh = o_lat + static_cast<size_t>(h - h0) * r;
      const float* w_uv = kv_b + (static_cast<size_t>(h) * up + s.nope_dim) * r;
      float* dst = out + static_cast<size_t>(i0) * out_stride + h * s.v_dim;
      if (m <= kLatentLoopRows) {
        ProjectRows(oh, heads * r, w_uv, s.v_dim, r, m, dst, out_stride);
      } else {
        blas_->sgemm(kRow, CblasNoTrans, CblasTrans, m, s.v_dim, r, 1.0f, oh, heads * r, w_uv, r,
                     0.0f, dst, out_stride);
      }
    }
  }
}

}  // namespace tandem
