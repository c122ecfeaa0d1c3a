#include "common/compute/graph_buckets.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem {
namespace {

// INVALID_ARGUMENT unless `buckets` is a non-empty, strictly increasing list
// of positive values at most `most`.
absl::Status CheckBuckets(const std::vector<int>& buckets, const char* name, int64_t most) {
  if (buckets.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode graphs: ", name, " is empty; give at least one bucket"));
  }
  if (buckets.size() > static_cast<size_t>(kMaxGraphBucketsPerAxis)) {
    return absl::InvalidArgumentError(absl::StrCat("decode graphs: ", name, " has ", buckets.size(),
                                                   " buckets; give at most ",
                                                   kMaxGraphBucketsPerAxis));
  }
  for (size_t i = 0; i < buckets.size(); ++i) {
    if (buckets[i] <= 0 || buckets[i] > most) {
      return absl::InvalidArgumentError(absl::StrCat("decode graphs: ", name, " holds ", buckets[i],
                                                     "; every bucket must be in [1, ", most, "]"));
    }
    if (i > 0 && buckets[i] <= buckets[i - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("decode graphs: ", name, " [", absl::StrJoin(buckets, ", "),
                       "] is not strictly increasing; list each bucket once, smallest first"));
    }
  }
  return absl::OkStatus();
}

// The index of the smallest bucket >= `value`, or -1.
int SmallestAtLeast(const std::vector<int>& buckets, int64_t value) {
  const auto it = std::lower_bound(buckets.begin(), buckets.end(), value,
                                   [](int bucket, int64_t v) { return bucket < v; });
  return it == buckets.end() ? -1 : static_cast<int>(it - buckets.begin());
}

size_t SaturatingAdd(size_t a, size_t b) {
  return a > std::numeric_limits<size_t>::max() - b ? std::numeric_limits<size_t>::max() : a + b;
}

}  // namespace

std::string_view EagerReasonName(EagerReason reason) {
  switch (reason) {
    case EagerReason::kNone:
      return "none";
    case EagerReason::kDisabled:
      return "disabled";
    case EagerReason::kNotDecode:
      return "not_decode";
    case EagerReason::kTooManyRows:
      return "too_many_rows";
    case EagerReason::kTooLong:
      return "too_long";
    case EagerReason::kCaptureFailed:
      return "capture_failed";
    case EagerReason::kNoGraphRoom:
      return "no_graph_room";
  }
  return "unknown";
}

std::vector<int> DefaultBatchBuckets(int max_rows) {
  max_rows = std::clamp(max_rows, 1, kMaxGraphBatchRows);
  std::vector<int> buckets;
  for (int b : {1, 2, 4}) {
    if (b < max_rows) buckets.push_back(b);
  }
  for (int b = 8; b < max_rows; b += 8) buckets.push_back(b);
  buckets.push_back(max_rows);
  return buckets;
}

std::vector<int> DefaultKvBuckets(int max_blocks) {
  max_blocks = std::max(max_blocks, 1);
  std::vector<int> buckets;
  for (int64_t b = 1; b < max_blocks; b *= 2) buckets.push_back(static_cast<int>(b));
  buckets.push_back(max_blocks);
  return buckets;
}

ReplayLayout ReplayLayout::For(const GraphBucket& bucket) {
  const int64_t b = std::max(bucket.batch, 0);
  const int64_t k = std::max(bucket.kv_blocks, 0);
  ReplayLayout layout;
  layout.token_ids = 0;
  layout.positions = b;
  layout.context_lengths = 2 * b;
  layout.row_meta = 3 * b;
  layout.block_table = 5 * b;
  layout.row_ids = 5 * b + b * k;  // < 2^62: both are ints
  layout.total = layout.row_ids + b;
  return layout;
}

int64_t DecodeGraphStats::eager_steps() const {
  int64_t sum = 0;
  for (int64_t n : eager) sum += n;
  return sum;
}

int64_t DecodeGraphStats::misses() const {
  return captures + eager[static_cast<int>(EagerReason::kCaptureFailed)] +
         eager[static_cast<int>(EagerReason::kNoGraphRoom)];
}

absl::Status FillReplayInputs(const GraphBucket& bucket, int block_size, int32_t scratch_block,
                              int32_t pad_token, std::span<const int32_t> tokens,
                              std::span<const AttentionRow> rows, std::span<int32_t> staging) {
  if (block_size <= 0 || scratch_block < 0 || pad_token < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("replay inputs need a positive block size and a non-negative scratch block "
                     "and pad token; got ",
                     block_size, ", ", scratch_block, ", ", pad_token));
  }
  const ReplayLayout layout = ReplayLayout::For(bucket);
  if (bucket.batch <= 0 || bucket.kv_blocks <= 0 || layout.total > kMaxReplayStagingInts) {
    return absl::InvalidArgumentError(absl::StrCat("no replay of a bucket of ", bucket.batch,
                                                   " rows x ", bucket.kv_blocks, " blocks"));
  }
  if (static_cast<int64_t>(staging.size()) < layout.total) {
    return absl::InvalidArgumentError(absl::StrCat("a replay of ", bucket.batch, " rows x ",
                                                   bucket.kv_blocks, " blocks needs ", layout.total,
                                                   " staging ints; got ", staging.size()));
  }
  if (tokens.size() != rows.size() || rows.size() > static_cast<size_t>(bucket.batch)) {
    return absl::InvalidArgumentError(absl::StrCat("a step of ", tokens.size(), " tokens and ",
                                                   rows.size(), " rows does not fit a bucket of ",
                                                   bucket.batch, " rows"));
  }
  const int64_t b = bucket.batch, k = bucket.kv_blocks;
  int32_t* const meta = staging.data() + layout.row_meta;
  for (int64_t r = 0; r < b; ++r) {
    const bool real = r < static_cast<int64_t>(rows.size());
    const int32_t position = real ? rows[r].position : 0;
    if (position < 0 || position == std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat("row ", r, " has position ", position));
    }
    const int64_t need = real ? position / block_size + 1 : 0;
    if (real && (need > k || need > static_cast<int64_t>(rows[r].blocks.size()))) {
      return absl::InvalidArgumentError(absl::StrCat("row ", r, " at position ", position,
                                                     " needs ", need, " blocks; its table holds ",
                                                     rows[r].blocks.size(), " and the bucket ", k));
    }
    staging[layout.token_ids + r] = real ? tokens[r] : pad_token;
    staging[layout.positions + r] = position;
    staging[layout.context_lengths + r] = position + 1;
    meta[2 * r] = position;
    // < kMaxReplayStagingInts: fits an int32.
    meta[2 * r + 1] = static_cast<int32_t>(layout.block_table - layout.row_meta + r * k);
    int32_t* const table = staging.data() + layout.block_table + r * k;
    if (real) std::copy_n(rows[r].blocks.data(), need, table);
    std::fill(table + need, table + k, scratch_block);
    staging[layout.row_ids + r] = static_cast<int32_t>(r);
  }
  return absl::OkStatus();
}

absl::StatusOr<DecodeGraphPlan> DecodeGraphPlan::Create(DecodeGraphOptions options) {
  if (absl::Status s = CheckBuckets(options.batch_buckets, "batch_buckets", kMaxGraphBatchRows);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckBuckets(options.kv_buckets, "kv_buckets", std::numeric_limits<int32_t>::max());
      !s.ok()) {
    return s;
  }
  if (options.block_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("decode graphs: block_size is ",
                                                   options.block_size,
                                                   "; give the KV cache's (positive) block size"));
  }
  if (options.max_graphs <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode graphs: max_graphs is ", options.max_graphs,
                     "; allow at least 1 graph, or set enabled = false"));
  }
  if (options.max_graph_bytes.has_value() && *options.max_graph_bytes == 0) {
    return absl::InvalidArgumentError(
        "decode graphs: max_graph_bytes is 0; leave it unset for no byte budget, or set "
        "enabled = false");
  }
  if (options.scratch_block < 0 || options.pad_token < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode graphs: scratch_block ", options.scratch_block, " and pad_token ",
                     options.pad_token,
                     " must be >= 0 (a block reserved for padding, a token in the vocabulary)"));
  }
  const GraphBucket largest{options.batch_buckets.back(), options.kv_buckets.back()};
  const int64_t staging = ReplayLayout::For(largest).total;
  if (staging > kMaxReplayStagingInts) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode graphs: the largest bucket, ", largest.batch, " rows x ",
                     largest.kv_blocks, " blocks, needs ", staging, " staging ints, over ",
                     kMaxReplayStagingInts, "; lower the largest batch or KV bucket"));
  }
  return DecodeGraphPlan(std::move(options));
}

DecodeGraphPlan::DecodeGraphPlan(DecodeGraphOptions options)
    : options_(std::move(options)),
      cells_(options_.batch_buckets.size() * options_.kv_buckets.size()) {}

int64_t DecodeGraphPlan::max_staging_ints() const {
  return ReplayLayout::For({options_.batch_buckets.back(), options_.kv_buckets.back()}).total;
}

DecodeGraphPlan::Choice DecodeGraphPlan::Choose(int64_t rows, int64_t kv_blocks) const {
  const int b = SmallestAtLeast(options_.batch_buckets, std::max<int64_t>(rows, 1));
  if (b < 0) return {std::nullopt, EagerReason::kTooManyRows};
  const int k = SmallestAtLeast(options_.kv_buckets, std::max<int64_t>(kv_blocks, 1));
  if (k < 0) return {std::nullopt, EagerReason::kTooLong};
  return {GraphBucket{options_.batch_buckets[b], options_.kv_buckets[k]}, EagerReason::kNone};
}

int DecodeGraphPlan::CellIndex(const GraphBucket& bucket) const {
  const auto& bs = options_.batch_buckets;
  const auto& ks = options_.kv_buckets;
  const auto b = std::lower_bound(bs.begin(), bs.end(), bucket.batch);
  const auto k = std::lower_bound(ks.begin(), ks.end(), bucket.kv_blocks);
  if (b == bs.end() || *b != bucket.batch || k == ks.end() || *k != bucket.kv_blocks) return -1;
  return static_cast<int>((b - bs.begin()) * ks.size() + (k - ks.begin()));
}

GraphBucket DecodeGraphPlan::BucketAt(int cell) const {
  const int n_kv = static_cast<int>(options_.kv_buckets.size());
  return {options_.batch_buckets[cell / n_kv], options_.kv_buckets[cell % n_kv]};
}

bool DecodeGraphPlan::IsHeld(const GraphBucket& bucket) const {
  const int cell = CellIndex(bucket);
  return cell >= 0 && cells_[cell].state == CellState::kHeld;
}

bool DecodeGraphPlan::HasRoom() const {
  if (static_cast<int64_t>(held_.size()) >= options_.max_graphs) return false;
  return !options_.max_graph_bytes.has_value() || bytes_held_ < *options_.max_graph_bytes;
}

GraphDecision DecodeGraphPlan::Eager(EagerReason reason, int rows,
                                     std::optional<GraphBucket> bucket) {
  ++stats_.eager[static_cast<int>(reason)];
  GraphDecision decision;
  decision.action = GraphAction::kEager;
  decision.reason = reason;
  decision.bucket = bucket;
  decision.real_rows = rows;
  return decision;
}

absl::StatusOr<GraphDecision> DecodeGraphPlan::Plan(std::span<const int32_t> tokens,
                                                    std::span<const AttentionRow> rows) {
  if (rows.empty() || tokens.size() != rows.size()) {
    return absl::InvalidArgumentError(absl::StrCat("decode graphs: a step of ", tokens.size(),
                                                   " tokens and ", rows.size(),
                                                   " rows (one token per row, at least one)"));
  }
  // Saturated: a step with more rows than any bucket is eager anyway.
  const int n = static_cast<int>(std::min<size_t>(rows.size(), std::numeric_limits<int>::max()));
  if (!options_.enabled) return Eager(EagerReason::kDisabled, n, std::nullopt);
  if (pending_ >= 0) {
    const GraphBucket p = BucketAt(pending_);
    return absl::FailedPreconditionError(
        absl::StrCat("decode graphs: the capture of ", p.batch, " rows x ", p.kv_blocks,
                     " blocks is pending; report CaptureDone or CaptureFailed first"));
  }
  int64_t longest = 0;
  bool shared = false;
  for (size_t r = 0; r < rows.size(); ++r) {
    const AttentionRow& row = rows[r];
    // Its context length, position + 1, must be an int32 too.
    if (row.position < 0 || row.position == std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat("decode graphs: row ", r, " has position ", row.position));
    }
    const int64_t need = int64_t{row.position} / options_.block_size + 1;
    if (need > static_cast<int64_t>(row.blocks.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("decode graphs: row ", r, " at position ", row.position, " needs ", need,
                       " blocks; its table holds ", row.blocks.size()));
    }
    longest = std::max(longest, need);
    // The engine lays out a sequence's rows together, all over one table.
    if (r > 0 && row.blocks.data() == rows[r - 1].blocks.data()) shared = true;
  }
  if (shared) return Eager(EagerReason::kNotDecode, n, std::nullopt);
  const Choice choice = Choose(static_cast<int64_t>(rows.size()), longest);
  if (!choice.bucket.has_value()) return Eager(choice.reason, n, std::nullopt);

  const GraphBucket bucket = *choice.bucket;
  const int index = CellIndex(bucket);
  Cell& cell = cells_[index];
  GraphDecision decision;
  decision.bucket = bucket;
  decision.real_rows = n;
  switch (cell.state) {
    case CellState::kHeld:
      cell.last_use = ++clock_;
      ++stats_.replays;
      decision.action = GraphAction::kReplay;
      return decision;
    case CellState::kFailed:
      return Eager(EagerReason::kCaptureFailed, n, bucket);
    case CellState::kPending:  // Refused above.
    case CellState::kEmpty:
      break;
  }
  if (!HasRoom() && !options_.evict_lru) return Eager(EagerReason::kNoGraphRoom, n, bucket);
  while (!HasRoom() && !held_.empty()) {
    const auto lru = std::min_element(held_.begin(), held_.end(), [&](int a, int b) {
      return cells_[a].last_use < cells_[b].last_use;
    });
    Cell& victim = cells_[*lru];
    // Never below 0, though bytes_held_ saturates.
    bytes_held_ -= std::min(bytes_held_, victim.bytes);
    victim = Cell{};
    decision.evict.push_back(BucketAt(*lru));
    held_.erase(lru);
    ++stats_.evictions;
  }
  cell.state = CellState::kPending;
  cell.bytes = 0;
  cell.last_use = ++clock_;
  held_.push_back(index);
  pending_ = index;
  ++stats_.captures;
  decision.action = GraphAction::kCapture;
  return decision;
}

absl::Status DecodeGraphPlan::CaptureDone(const GraphBucket& bucket, size_t bytes) {
  const int index = CellIndex(bucket);
  if (index < 0 || index != pending_) {
    return absl::FailedPreconditionError(absl::StrCat("decode graphs: no capture of ", bucket.batch,
                                                      " rows x ", bucket.kv_blocks,
                                                      " blocks is pending"));
  }
  Cell& cell = cells_[index];
  cell.state = CellState::kHeld;
  cell.bytes = bytes;
  bytes_held_ = SaturatingAdd(bytes_held_, bytes);
  pending_ = -1;
  return absl::OkStatus();
}

absl::Status DecodeGraphPlan::CaptureFailed(const GraphBucket& bucket) {
  const int index = CellIndex(bucket);
  if (index < 0 || index != pending_) {
    return absl::FailedPreconditionError(absl::StrCat("decode graphs: no capture of ", bucket.batch,
                                                      " rows x ", bucket.kv_blocks,
                                                      " blocks is pending"));
  }
  cells_[index] = Cell{CellState::kFailed, 0, 0};
  held_.erase(std::find(held_.begin(), held_.end(), index));
  pending_ = -1;
  ++stats_.capture_failures;
  return absl::OkStatus();
}

absl::Status DecodeGraphPlan::FillReplay(const GraphBucket& bucket, std::span<const int32_t> tokens,
                                         std::span<const AttentionRow> rows,
                                         std::span<int32_t> staging) const {
  return FillReplayInputs(bucket, options_.block_size, options_.scratch_block, options_.pad_token,
                          tokens, rows, staging);
}

}  // namespace tandem
