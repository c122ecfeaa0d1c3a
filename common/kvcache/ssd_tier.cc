#include "common/kvcache/ssd_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/logging.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

constexpr absl::string_view kSuffix = ".kvb";
constexpr absl::string_view kTempPrefix = ".tmp-";

// Reads `n` bytes at `offset`; how many were read (short at the end of the
// file), or -1 with errno.
ssize_t ReadFully(int fd, uint8_t* out, size_t n, off_t offset) {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = pread(fd, out + done, n - done, offset + static_cast<off_t>(done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  return static_cast<ssize_t>(done);
}

bool WriteFully(int fd, const uint8_t* data, size_t n) {
  size_t done = 0;
  while (done < n) {
    const ssize_t w = write(fd, data + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    done += static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

struct SsdTier::State {
  State(SsdTierOptions o, const KvTierIdentity& id, Executor* executor)
      : options(std::move(o)),
        identity(id),
        payload_bytes(id.payload_bytes()),
        record_bytes(TierRecordHeader::kBytes + id.payload_bytes()),
        io(executor) {}

  std::string Path(const BlockHash& hash) const {
    return absl::StrCat(options.dir, "/", hash.ToString(), kSuffix);
  }

  struct Entry {
    bool ready = false;  // written and renamed into place
    uint64_t generation = 0;
    uint64_t seq = 0;  // its key in lru, when ready
  };
  struct Job {
    std::vector<std::span<uint8_t>> dst;
    BlockHash hash;
    uint64_t generation = 0;
    bool done = false;
    bool hit = false;
    TierMiss miss = TierMiss::kAbsent;
  };

  // Drops the record of `hash` from the index and the disk.
  void Remove(const BlockHash& hash) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = entries.find(hash);
    if (it == entries.end()) return;
    if (it->second.ready) {
      lru.erase(it->second.seq);
      --stats.records;
      events.Record(CacheEventKind::kEvicted, hash);
    }
    entries.erase(it);
    stats.used_bytes -= record_bytes;
    if (unlink(Path(hash).c_str()) != 0 && errno != ENOENT) {
      LOG(WARNING) << "ssd tier: cannot remove " << Path(hash) << ": " << std::strerror(errno);
    }
  }

  // Evicts the least recently used records until the bytes reserved fit
  // the bound; false when the records being written alone exceed it.
  bool MakeRoom() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    while (stats.used_bytes > options.capacity_bytes) {
      if (lru.empty()) return false;
      const BlockHash oldest = lru.begin()->second;
      Remove(oldest);
      ++stats.evictions;
    }
    return true;
  }

  void Touch(Entry& e, const BlockHash& hash) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    lru.erase(e.seq);
    e.seq = next_seq++;
    lru.emplace(e.seq, hash);
  }

  void Write(const BlockHash& hash, uint64_t generation, std::vector<uint8_t> record);
  void Read(uint64_t ticket);
  void Finish(Job& job, bool hit, TierMiss miss) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    job.done = true;
    job.hit = hit;
    job.miss = miss;
    job.dst.clear();
    if (hit) {
      ++stats.hits;
    } else {
      ++stats.misses[static_cast<int>(miss)];
    }
  }

  const SsdTierOptions options;
  const KvTierIdentity identity;
  const size_t payload_bytes;
  const size_t record_bytes;
  Executor* const io;
  CacheEventLog events;

  mutable absl::Mutex mu;
  bool closed ABSL_GUARDED_BY(mu) = false;
  absl::flat_hash_map<BlockHash, Entry> entries ABSL_GUARDED_BY(mu);
  std::map<uint64_t, BlockHash> lru ABSL_GUARDED_BY(mu);  // ready records, oldest first
  uint64_t next_seq ABSL_GUARDED_BY(mu) = 1;
  uint64_t next_generation ABSL_GUARDED_BY(mu) = 1;
  int pending_writes ABSL_GUARDED_BY(mu) = 0;
  absl::flat_hash_map<uint64_t, Job> loads ABSL_GUARDED_BY(mu);
  uint64_t next_ticket ABSL_GUARDED_BY(mu) = 1;
  KvTierStats stats ABSL_GUARDED_BY(mu);
};

void SsdTier::State::Write(const BlockHash& hash, uint64_t generation,
                           std::vector<uint8_t> record) {
  {
    absl::MutexLock lock(&mu);
    --pending_writes;
    auto it = entries.find(hash);
    if (closed || it == entries.end() || it->second.generation != generation) return;
    if (!MakeRoom()) {
      entries.erase(it);
      stats.used_bytes -= record_bytes;
      ++stats.stores_refused;
      return;
    }
  }
  // The checksum is computed here, once, off the caller's thread.
  TierRecordHeader header{.identity = identity, .hash = hash, .payload_bytes = payload_bytes};
  header.payload_checksum = TierChecksum({record.data() + TierRecordHeader::kBytes, payload_bytes});
  const auto head = EncodeTierHeader(header);
  std::memcpy(record.data(), head.data(), head.size());
  const std::string path = Path(hash);
  const std::string temp =
      absl::StrCat(options.dir, "/", kTempPrefix, hash.ToString(), "-", generation);
  bool ok = false;
  const int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd >= 0) {
    ok = WriteFully(fd, record.data(), record.size());
    ok = close(fd) == 0 && ok;
    ok = ok && rename(temp.c_str(), path.c_str()) == 0;
    if (!ok) unlink(temp.c_str());
  }
  absl::MutexLock lock(&mu);
  auto it = entries.find(hash);
  if (it == entries.end() || it->second.generation != generation) return;
  if (!ok) {
    LOG(WARNING) << "ssd tier: cannot write " << path << ": " << std::strerror(errno);
    entries.erase(it);
    stats.used_bytes -= record_bytes;
    ++stats.stores_refused;
    return;
  }
  it->second.ready = true;
  it->second.seq = next_seq++;
  lru.emplace(it->second.seq, hash);
  ++stats.records;
  stats.bytes_written += record.size();
  events.Record(CacheEventKind::kStored, hash);
}

void SsdTier::State::Read(uint64_t ticket) {
  BlockHash hash;
  uint64_t generation;
  {
    absl::MutexLock lock(&mu);
    auto it = loads.find(ticket);
    if (closed || it == loads.end()) return;
    hash = it->second.hash;
    generation = it->second.generation;
  }
  std::vector<uint8_t> record(record_bytes);
  TierMiss miss = TierMiss::kAbsent;
  bool verified = false;
  const int fd = open(Path(hash).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    miss = errno == ENOENT ? TierMiss::kAbsent : TierMiss::kIoError;
  } else {
    struct stat st;
    const ssize_t got = ReadFully(fd, record.data(), record.size(), 0);
    const bool sized = fstat(fd, &st) == 0;
    close(fd);
    if (got < 0 || !sized) {
      miss = TierMiss::kIoError;
    } else if (static_cast<size_t>(got) < TierRecordHeader::kBytes) {
      miss = TierMiss::kTruncated;
    } else if (auto header = DecodeTierHeader({record.data(), static_cast<size_t>(got)});
               !header.ok()) {
      miss = TierMiss::kCorrupt;
    } else if (!(header->identity == identity) || header->payload_bytes != payload_bytes) {
      miss = TierMiss::kForeign;
    } else if (!(header->hash == hash)) {
      miss = TierMiss::kCorrupt;  // the record of another block under this one's name
    } else if (static_cast<size_t>(got) < record_bytes ||
               static_cast<uint64_t>(st.st_size) != record_bytes) {
      miss = static_cast<size_t>(got) < record_bytes ? TierMiss::kTruncated : TierMiss::kCorrupt;
    } else if (TierChecksum({record.data() + TierRecordHeader::kBytes, payload_bytes}) !=
               header->payload_checksum) {
      miss = TierMiss::kCorrupt;
    } else {
      verified = true;
    }
  }
  absl::MutexLock lock(&mu);
  if (closed) return;
  if (!verified) {
    // A record that cannot be read as written (or whose file went) is
    // dropped, so that the router stops counting on it.
    auto e = entries.find(hash);
    if (e != entries.end() && e->second.generation == generation) Remove(hash);
  }
  auto it = loads.find(ticket);
  if (it == loads.end()) return;  // cancelled while reading
  Job& job = it->second;
  if (verified) {
    const uint8_t* from = record.data() + TierRecordHeader::kBytes;
    for (std::span<uint8_t> layer : job.dst) {
      std::memcpy(layer.data(), from, layer.size());
      from += layer.size();
    }
    stats.bytes_read += record_bytes;
  }
  Finish(job, verified, miss);
}

absl::StatusOr<std::unique_ptr<SsdTier>> SsdTier::Open(SsdTierOptions options,
                                                       const KvTierIdentity& identity,
                                                       Executor* io) {
  if (identity.n_layers <= 0 || identity.payload_bytes() == 0) {
    return absl::InvalidArgumentError("the SSD tier needs a KV layout with layers and bytes");
  }
  const uint64_t record = TierRecordHeader::kBytes + identity.payload_bytes();
  if (options.capacity_bytes < record) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the SSD tier's bound of ", options.capacity_bytes, " bytes is below one block's record (",
        record, " bytes): give it at least that, or no SSD tier"));
  }
  if (options.max_pending_writes < 1) {
    return absl::InvalidArgumentError("the SSD tier needs max_pending_writes of at least 1");
  }
  std::error_code ec;
  fs::create_directories(options.dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot make the SSD tier's directory ", options.dir, ": ", ec.message()));
  }
  auto state = std::make_shared<State>(std::move(options), identity, io);
  SsdTierOpenReport report;
  struct Found {
    fs::file_time_type mtime;
    BlockHash hash;
  };
  std::vector<Found> found;
  fs::directory_iterator dir(state->options.dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(absl::StrCat("cannot read the SSD tier's directory ",
                                                      state->options.dir, ": ", ec.message()));
  }
  for (const fs::directory_entry& entry : dir) {
    const std::string file = entry.path().filename().string();
    if (!entry.is_regular_file(ec)) continue;
    if (absl::StartsWith(file, kTempPrefix)) {
      fs::remove(entry.path(), ec);
      ++report.removed_partial;
      continue;
    }
    if (!absl::EndsWith(file, kSuffix)) continue;  // not the tier's
    uint8_t head[TierRecordHeader::kBytes];
    ssize_t got = -1;
    if (const int fd = open(entry.path().c_str(), O_RDONLY | O_CLOEXEC); fd >= 0) {
      got = ReadFully(fd, head, sizeof(head), 0);
      close(fd);
    }
    auto header = DecodeTierHeader({head, got < 0 ? 0 : static_cast<size_t>(got)});
    const bool foreign = header.ok() && !(header->identity == identity);
    if (!header.ok() || foreign || header->hash.ToString() + std::string(kSuffix) != file ||
        entry.file_size(ec) != record) {
      fs::remove(entry.path(), ec);
      ++(foreign ? report.removed_foreign : report.removed_damaged);
      continue;
    }
    found.push_back({entry.last_write_time(ec), header->hash});
  }
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.mtime < b.mtime; });
  {
    absl::MutexLock lock(&state->mu);
    for (const Found& f : found) {
      State::Entry& e = state->entries[f.hash];
      e.ready = true;
      e.generation = state->next_generation++;
      e.seq = state->next_seq++;
      state->lru.emplace(e.seq, f.hash);
      state->stats.used_bytes += record;
      ++state->stats.records;
      state->events.Record(CacheEventKind::kStored, f.hash);
    }
    const uint64_t before = state->stats.evictions;
    state->MakeRoom();
    report.evicted_over_capacity = state->stats.evictions - before;
    report.kept = state->stats.records;
    report.kept_bytes = state->stats.used_bytes;
  }
  if (report.removed_foreign + report.removed_damaged + report.removed_partial > 0) {
    LOG(INFO) << "ssd tier " << state->options.dir << ": removed " << report.removed_foreign
              << " records of another model or layout, " << report.removed_damaged
              << " damaged and " << report.removed_partial << " unfinished";
  }
  return std::unique_ptr<SsdTier>(new SsdTier(std::move(state), report));
}

SsdTier::SsdTier(std::shared_ptr<State> state, SsdTierOpenReport report)
    : state_(std::move(state)), report_(report) {}

SsdTier::~SsdTier() {
  absl::MutexLock lock(&state_->mu);
  state_->closed = true;
  state_->loads.clear();
}

const KvTierIdentity& SsdTier::identity() const { return state_->identity; }

std::string SsdTier::RecordPath(const BlockHash& hash) const { return state_->Path(hash); }

bool SsdTier::Contains(const BlockHash& hash) const {
  absl::MutexLock lock(&state_->mu);
  auto it = state_->entries.find(hash);
  return it != state_->entries.end() && it->second.ready;
}

bool SsdTier::Store(const BlockHash& hash, std::span<const std::span<const uint8_t>> layers) {
  State& s = *state_;
  const bool shaped = s.identity.Fits(layers);
  uint64_t generation;
  {
    absl::MutexLock lock(&s.mu);
    if (!shaped || s.closed || s.entries.contains(hash) ||
        s.pending_writes >= s.options.max_pending_writes) {
      ++s.stats.stores_refused;
      return false;
    }
    generation = s.next_generation++;
    s.entries[hash] = State::Entry{.ready = false, .generation = generation};
    s.stats.used_bytes += s.record_bytes;
    ++s.pending_writes;
    ++s.stats.stores;
  }
  std::vector<uint8_t> record(s.record_bytes);
  uint8_t* to = record.data() + TierRecordHeader::kBytes;
  for (const auto& layer : layers) {
    std::memcpy(to, layer.data(), layer.size());
    to += layer.size();
  }
  s.io->Post([state = state_, hash, generation, record = std::move(record)]() mutable {
    state->Write(hash, generation, std::move(record));
  });
  return true;
}

uint64_t SsdTier::Load(const BlockHash& hash, std::span<const std::span<uint8_t>> layers) {
  State& s = *state_;
  const bool shaped = s.identity.Fits(layers);
  absl::MutexLock lock(&s.mu);
  const uint64_t ticket = s.next_ticket++;
  ++s.stats.loads;
  State::Job& job = s.loads[ticket];
  job.hash = hash;
  auto it = s.entries.find(hash);
  if (!shaped || it == s.entries.end() || !it->second.ready) {
    s.Finish(job, false, TierMiss::kAbsent);
    return ticket;
  }
  job.generation = it->second.generation;
  job.dst.assign(layers.begin(), layers.end());
  s.Touch(it->second, hash);
  s.io->Post([state = state_, ticket] { state->Read(ticket); });
  return ticket;
}

KvTier::LoadState SsdTier::Poll(uint64_t ticket) {
  absl::MutexLock lock(&state_->mu);
  auto it = state_->loads.find(ticket);
  if (it == state_->loads.end()) return {.done = true, .hit = false, .miss = TierMiss::kAbsent};
  if (!it->second.done) return {};
  const LoadState out{.done = true, .hit = it->second.hit, .miss = it->second.miss};
  state_->loads.erase(it);
  return out;
}

void SsdTier::Cancel(uint64_t ticket) {
  absl::MutexLock lock(&state_->mu);
  auto it = state_->loads.find(ticket);
  if (it == state_->loads.end()) return;
  if (!it->second.done) ++state_->stats.misses[static_cast<int>(TierMiss::kCancelled)];
  state_->loads.erase(it);
}

KvTierStats SsdTier::stats() const {
  absl::MutexLock lock(&state_->mu);
  return state_->stats;
}

CacheEventBatch SsdTier::EventsAfter(uint64_t cursor, int max_events) const {
  return state_->events.Read(cursor, max_events);
}

}  // namespace tandem
