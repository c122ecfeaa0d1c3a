// Host-side planning for replaying decode steps as captured device graphs
// (CUDA graphs), with no device dependency so that it is tested on the CPU.
//
// A graph fixes the shapes of every launch and the addresses it reads, so a
// decode step runs as a graph only when it is padded to a captured shape: a
// bucket of (batch rows, KV blocks per row). A step of n rows whose longest
// row needs L blocks takes the smallest batch bucket >= n and the smallest
// KV bucket >= L. Its inputs are written into one int32 staging array laid
// out per bucket (ReplayLayout), which the backend copies to a fixed device
// buffer that the graph was captured reading:
//
//   token ids [B] | positions [B] | context lengths [B] | row meta [2B] |
//   block table [B x K] | row ids [B]
//
// Row meta pairs (position, offset of the row's block list from the start
// of the meta) and the row ids are the form the CUDA attention and KV-write
// kernels read, so a graph runs those kernels unchanged.
//
// Padding rows are made harmless: each is token `pad_token` at position 0
// (context length 1) whose block table is all `scratch_block`, a block the
// engine reserves and never hands to a sequence. Padding rows write their
// K/V into slot 0 of the scratch block and attend to it alone; since they
// all carry the same token at the same position they write identical bytes,
// so their racing writes are benign. Real rows' tables are padded with the
// scratch block too, past the blocks their context needs (never read). Rows
// [0, n) of the graph's outputs (logits, picks) are the step's; the rest are
// padding and dropped.
//
// A step runs eagerly (EagerReason) when graphs are disabled, when it is not
// a pure decode step (a sequence with several rows: prefill or mixed), when
// it has more rows or a longer row than the largest bucket, when its
// bucket's capture failed before, or when no graph may be added (the count
// or byte budget is used and eviction is off).
//
// DecodeGraphPlan tracks the graphs held (at most max_graphs, and at most
// max_graph_bytes when set), evicting the least recently used one (captured
// or replayed) for a new bucket when allowed, and counts replays, captures,
// evictions and eager steps by reason for metrics.
//
// Thread-compatible: the thread driving the backend owns a plan.
#ifndef TANDEM_COMMON_COMPUTE_GRAPH_BUCKETS_H_
#define TANDEM_COMMON_COMPUTE_GRAPH_BUCKETS_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/compute/backend.h"

namespace tandem {

// Bounds that keep every size a plan computes far from overflow.
inline constexpr int kMaxGraphBatchRows = 1 << 16;
inline constexpr int kMaxGraphBucketsPerAxis = 512;
// Most int32s one replay's staging array may hold (256 MiB).
inline constexpr int64_t kMaxReplayStagingInts = int64_t{1} << 26;

// One captured shape: `batch` rows, each with a block table of `kv_blocks`.
struct GraphBucket {
  int batch = 0;
  int kv_blocks = 0;
  friend bool operator==(const GraphBucket&, const GraphBucket&) = default;
};

// Why a step runs eagerly.
enum class EagerReason {
  kNone = 0,       // not eager
  kDisabled,       // graphs are turned off
  kNotDecode,      // a sequence with several rows (a prefill or mixed step)
  kTooManyRows,    // more rows than the largest batch bucket
  kTooLong,        // a row needs more blocks than the largest KV bucket
  kCaptureFailed,  // this bucket's capture failed before
  kNoGraphRoom,    // not captured, and the graph budget is used (no eviction)
};
inline constexpr int kEagerReasonCount = 7;
// A metric label: "disabled", "not_decode", ...
std::string_view EagerReasonName(EagerReason reason);

struct DecodeGraphOptions {
  bool enabled = true;
  // Strictly increasing, positive; at most kMaxGraphBucketsPerAxis each.
  std::vector<int> batch_buckets;  // rows, at most kMaxGraphBatchRows
  std::vector<int> kv_buckets;     // blocks per sequence
  int block_size = 16;             // tokens per KV block, as the cache's
  // Graphs held at once (>= 1), and their device bytes when set (> 0).
  int max_graphs = 32;
  std::optional<size_t> max_graph_bytes;
  // At the budget, a new bucket evicts the least recently used graph (true)
  // or its step runs eagerly (false).
  bool evict_lru = true;
  // The block padding rows and table padding point at (>= 0), reserved by
  // the engine for good, and the token of padding rows (>= 0, in the
  // vocabulary).
  int32_t scratch_block = 0;
  int32_t pad_token = 0;
};

// 1, 2, 4, then multiples of 8, up to and including `max_rows` (>= 1).
std::vector<int> DefaultBatchBuckets(int max_rows);
// Powers of two up to and including `max_blocks` (>= 1).
std::vector<int> DefaultKvBuckets(int max_blocks);

// Where each input of a replay of `bucket` lies in its staging array, in
// int32s from its start.
struct ReplayLayout {
  int64_t token_ids = 0;
  int64_t positions = 0;
  int64_t context_lengths = 0;
  int64_t row_meta = 0;
  int64_t block_table = 0;
  int64_t row_ids = 0;
  int64_t total = 0;

  static ReplayLayout For(const GraphBucket& bucket);
};

// Writes the replay inputs of a decode step (`tokens[r]` at rows[r]) padded
// to `bucket` into `staging` (at least ReplayLayout::For(bucket).total),
// as the file comment describes. INVALID_ARGUMENT, and `staging` may be
// partly written, when the step does not fit the bucket (more rows, a row
// needing more blocks, a row's table shorter than its position needs, a
// negative position), `tokens` and `rows` differ in length, or `staging` is
// too small.
absl::Status FillReplayInputs(const GraphBucket& bucket, int block_size, int32_t scratch_block,
                              int32_t pad_token, std::span<const int32_t> tokens,
                              std::span<const AttentionRow> rows, std::span<int32_t> staging);

enum class GraphAction {
  kReplay,   // replay the graph of `bucket`
  kCapture,  // destroy the graphs of `evict`, then capture `bucket` and
             // report CaptureDone or CaptureFailed
  kEager,    // run the step eagerly, for `reason`
};

struct GraphDecision {
  GraphAction action = GraphAction::kEager;
  EagerReason reason = EagerReason::kNone;
  // The step's bucket when it has one (also for kCaptureFailed and
  // kNoGraphRoom).
  std::optional<GraphBucket> bucket;
  std::vector<GraphBucket> evict;
  int real_rows = 0;  // outputs [0, real_rows) are the step's
};

struct DecodeGraphStats {
  int64_t replays = 0;
  int64_t captures = 0;
  int64_t capture_failures = 0;
  int64_t evictions = 0;
  std::array<int64_t, kEagerReasonCount> eager{};  // by EagerReason

  int64_t eager_steps() const;
  // Steps that found their bucket's graph / a bucket without one.
  int64_t hits() const { return replays; }
  int64_t misses() const;
};

class DecodeGraphPlan {
 public:
  // INVALID_ARGUMENT, saying what to change, for options DecodeGraphOptions
  // documents as impossible, or buckets whose staging exceeds
  // kMaxReplayStagingInts.
  static absl::StatusOr<DecodeGraphPlan> Create(DecodeGraphOptions options);

  const DecodeGraphOptions& options() const { return options_; }

  // The bucket of a step of `rows` rows whose longest row needs `kv_blocks`
  // blocks, or why it has none (kTooManyRows, kTooLong). Never counted.
  struct Choice {
    std::optional<GraphBucket> bucket;
    EagerReason reason = EagerReason::kNone;
  };
  Choice Choose(int64_t rows, int64_t kv_blocks) const;

  // Decides how the decode step `tokens[r]` at `rows[r]` runs, and counts it.
  // A kReplay marks its graph most recently used; a kCapture holds its
  // bucket as pending (its evicted graphs already dropped) until
  // CaptureDone/CaptureFailed. INVALID_ARGUMENT for an empty step, lengths
  // that differ, a negative position or a table shorter than its position
  // needs; FAILED_PRECONDITION while a capture is pending.
  absl::StatusOr<GraphDecision> Plan(std::span<const int32_t> tokens,
                                     std::span<const AttentionRow> rows);

  // The pending capture of `bucket` succeeded, its graph holding `bytes` of
  // device memory; or failed, so that its steps run eagerly from now on.
  // FAILED_PRECONDITION when `bucket` is not pending.
  absl::Status CaptureDone(const GraphBucket& bucket, size_t bytes);
  absl::Status CaptureFailed(const GraphBucket& bucket);

  // FillReplayInputs with this plan's block size, scratch block and pad token.
  absl::Status FillReplay(const GraphBucket& bucket, std::span<const int32_t> tokens,
                          std::span<const AttentionRow> rows, std::span<int32_t> staging) const;
  // The staging ints that every bucket fits in.
  int64_t max_staging_ints() const;

  // Graphs held (the pending capture included) and their bytes.
  int graphs_held() const { return static_cast<int>(held_.size()); }
  size_t graph_bytes_held() const { return bytes_held_; }
  bool IsHeld(const GraphBucket& bucket) const;
  const DecodeGraphStats& stats() const { return stats_; }

 private:
  enum class CellState : uint8_t { kEmpty, kPending, kHeld, kFailed };
  struct Cell {
    CellState state = CellState::kEmpty;
    size_t bytes = 0;
    uint64_t last_use = 0;
  };

  explicit DecodeGraphPlan(DecodeGraphOptions options);
  int CellIndex(const GraphBucket& bucket) const;  // -1 when not a bucket
  GraphBucket BucketAt(int cell) const;
  bool HasRoom() const;
  GraphDecision Eager(EagerReason reason, int rows, std::optional<GraphBucket> bucket);

  // Constant after construction.
  DecodeGraphOptions options_;

  std::vector<Cell> cells_;  // [batch bucket][kv bucket]
  std::vector<int> held_;    // cells kPending or kHeld
  size_t bytes_held_ = 0;
  int pending_ = -1;  // the cell being captured, or -1
  uint64_t clock_ = 0;
  DecodeGraphStats stats_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_COMPUTE_GRAPH_BUCKETS_H_
