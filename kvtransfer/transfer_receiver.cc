#include "kvtransfer/transfer_receiver.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::kvtransfer {

struct TransferReceiver::Transfer {
  enum class ChunkState : uint8_t { kMissing, kInFlight, kLanded };

  TransferLease lease;
  std::vector<std::vector<Slice>> layers;
  ReceiveDoneFn done;
  std::vector<std::vector<ChunkState>> chunks;  // [layer][chunk]
  uint64_t chunks_left = 0;
  uint64_t bytes_landed = 0;
  int in_flight = 0;  // Accepted receives not yet done.
  bool ending = false;
  absl::Status outcome;
  // Connections the sender used: where kComplete / kAbort go.
  absl::flat_hash_set<PeerId> peers;

  std::string Name() const {
    return absl::StrCat("request ", lease.request_id, " (generation ", lease.generation, ")");
  }
};

TransferReceiver::TransferReceiver(KvTransport* transport, const Clock* clock,
                                   ReceiverOptions options)
    : transport_(transport),
      clock_(clock),
      options_(options),
      // Seeded from the clock so that a restarted receiver does not reissue
      // the generations of its previous life.
      next_generation_(std::max<int64_t>(1, absl::ToUnixMicros(clock->Now()))),
      verify_pool_(options.verify_executor == nullptr && options.verify_threads > 0
                       ? std::make_unique<ThreadPoolExecutor>(options.verify_threads)
                       : nullptr),
      verifier_(options.verify_executor != nullptr ? options.verify_executor : verify_pool_.get(),
                options.verify_offload_bytes) {}

TransferReceiver::~TransferReceiver() {
  // Every check has read its bytes before `done` gives them back.
  verify_pool_.reset();
  for (auto& [generation, t] : transfers_) {
    t->done(t->lease.request_id, generation,
            absl::CancelledError(absl::StrCat(t->Name(), ": receiver shut down")));
  }
}

absl::StatusOr<RegionId> TransferReceiver::RegisterMemory(void* base, size_t length,
                                                          MemoryKind kind) {
  absl::StatusOr<RegionId> region = transport_->RegisterMemory(base, length, kind);
  if (region.ok()) regions_.Add(*region, base, length, kind);
  return region;
}

absl::Status TransferReceiver::DeregisterMemory(RegionId region) {
  regions_.Remove(region);
  return transport_->DeregisterMemory(region);
}

absl::StatusOr<TransferLease> TransferReceiver::Expect(ReceiveRequest request) {
  if (request.layers.empty() || request.layers.size() > TransferLease::kMaxLayers) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", request.request_id, ": ", request.layers.size(), " layers"));
  }
  if (request.deadline <= clock_->Now()) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", request.request_id, ": deadline already passed"));
  }
  if (!request.done) {
    return absl::InvalidArgumentError(absl::StrCat("request ", request.request_id, ": no done"));
  }
  if (live_by_request_.contains(request.request_id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("request ", request.request_id, " already holds a lease"));
  }
  auto t = std::make_unique<Transfer>();
  t->lease.request_id = request.request_id;
  t->lease.deadline = request.deadline;
  t->lease.checksums = options_.checksums;
  t->lease.receiver_address = transport_->LocalAddress();
  t->lease.first_block = request.first_block;
  uint64_t largest = 1;
  for (const std::vector<Slice>& layer : request.layers) {
    t->lease.layer_bytes.push_back(TotalBytes(layer));
    largest = std::max(largest, t->lease.layer_bytes.back());
    if (options_.checksums) {
      // Checksums read the destination: refuse now what could not be read then.
      for (const Slice& s : layer) {
        absl::StatusOr<std::span<std::byte>> bytes = regions_.Bytes(s);
        if (!bytes.ok()) return bytes.status();
      }
    }
  }
  t->lease.chunk_bytes = options_.chunk_bytes == 0 ? largest : options_.chunk_bytes;
  t->lease.generation = next_generation_++;
  t->layers = std::move(request.layers);
  t->done = std::move(request.done);
  for (uint32_t l = 0; l < t->layers.size(); ++l) {
    const uint64_t n = t->lease.chunks_in_layer(l);
    t->chunks.emplace_back(n, Transfer::ChunkState::kMissing);
    t->chunks_left += n;
  }
  TransferLease lease = t->lease;
  live_by_request_[lease.request_id] = lease.generation;
  transfers_[lease.generation] = std::move(t);
  ++stats_.leases;
  return lease;
}

absl::Status TransferReceiver::Cancel(uint64_t request_id) {
  auto it = live_by_request_.find(request_id);
  if (it == live_by_request_.end()) {
    return absl::NotFoundError(absl::StrCat("request ", request_id, " holds no lease"));
  }
  Transfer& t = *transfers_.at(it->second);
  Fail(t, absl::CancelledError(absl::StrCat(t.Name(), ": cancelled by the receiver")), true);
  return absl::OkStatus();
}

void TransferReceiver::SendControl(PeerId peer, absl::StatusCode code, const Transfer& t) {
  MessageHeader h;
  h.type = code == absl::StatusCode::kOk ? MessageType::kComplete : MessageType::kAbort;
  h.code = code;
  h.request_id = t.lease.request_id;
  h.generation = t.lease.generation;
  // Best effort: a sender that never hears ends on its own deadline.
  (void)transport_->PostSend(peer, h.Encode(), {});
}

void TransferReceiver::Fail(Transfer& t, absl::Status status, bool notify_sender) {
  if (t.ending) return;
  t.ending = true;
  t.outcome = std::move(status);
  live_by_request_.erase(t.lease.request_id);
  if (notify_sender) {
    for (PeerId peer : t.peers) SendControl(peer, t.outcome.code(), t);
  }
}

void TransferReceiver::RememberEnded(uint64_t generation) {
  ended_.insert(generation);
  ended_order_.push_back(generation);
  while (ended_order_.size() > options_.remembered_leases) {
    ended_.erase(ended_order_.front());
    ended_order_.pop_front();
  }
}

void TransferReceiver::HandleIncoming(const TransportEvent& e) {
  absl::StatusOr<MessageHeader> parsed = MessageHeader::Parse(e.header);
  if (!parsed.ok()) {
    transport_->Discard(e.id);
    ++stats_.dropped_malformed;
    return;
  }
  const MessageHeader& h = *parsed;
  auto it = transfers_.find(h.generation);
  if (it == transfers_.end() || it->second->lease.request_id != h.request_id ||
      it->second->ending) {
    transport_->Discard(e.id);
    auto live = live_by_request_.find(h.request_id);
    if (live != live_by_request_.end() && live->second != h.generation) {
      ++stats_.dropped_stale;
    } else if (ended_.contains(h.generation) || it != transfers_.end()) {
      ++stats_.dropped_late;
    } else {
      ++stats_.dropped_foreign;
    }
    // Tell a sender still writing for a lease that is not live to stop, so
    // that it fails now instead of at its deadline.
    if (h.type == MessageType::kData) {
      MessageHeader abort;
      abort.type = MessageType::kAbort;
      abort.code = absl::StatusCode::kAborted;
      abort.request_id = h.request_id;
      abort.generation = h.generation;
      (void)transport_->PostSend(e.peer, abort.Encode(), {});
    }
    return;
  }
  Transfer& t = *it->second;
  if (h.type == MessageType::kAbort) {
    transport_->Discard(e.id);
    Fail(t,
         absl::Status(h.code, absl::StrCat(t.Name(), ": aborted by the sender (",
                                           absl::StatusCodeToString(h.code), ")")),
         false);
    return;
  }
  // The message names a live lease; anything wrong with it now means the
  // transfer cannot complete, so it fails at once rather than at its deadline.
  auto reject = [&](std::string why) {
    transport_->Discard(e.id);
    ++stats_.dropped_malformed;
    Fail(t, absl::DataLossError(absl::StrCat(t.Name(), ": ", why)), true);
  };
  if (h.type != MessageType::kData) return reject("unexpected control message from the sender");
  const TransferLease& lease = t.lease;
  if (h.layer >= lease.layer_bytes.size() || h.offset % lease.chunk_bytes != 0 ||
      h.offset / lease.chunk_bytes >= lease.chunks_in_layer(h.layer) ||
      h.length != lease.chunk_length(h.layer, h.offset / lease.chunk_bytes)) {
    return reject(absl::StrCat("message for layer ", h.layer, " bytes [", h.offset, ", +", h.length,
                               ") does not match the lease"));
  }
  if (lease.checksums && !h.has_checksum) {
    return reject(
        absl::StrCat("layer ", h.layer, " chunk without the checksum the lease asks for"));
  }
  const uint64_t chunk = h.offset / lease.chunk_bytes;
  if (t.chunks[h.layer][chunk] != Transfer::ChunkState::kMissing) {
    transport_->Discard(e.id);
    ++stats_.dropped_duplicate;
    return;
  }
  if (e.payload_bytes != h.length) {
    return reject(absl::StrCat("layer ", h.layer, " offset ", h.offset, ": payload of ",
                               e.payload_bytes, " bytes, header claims ", h.length));
  }
  absl::StatusOr<std::vector<Slice>> dest = SubSlices(t.layers[h.layer], h.offset, h.length);
  if (!dest.ok()) return reject(std::string(dest.status().message()));
  t.peers.insert(e.peer);
  if (absl::Status s = transport_->Accept(e.id, *dest); !s.ok()) {
    transport_->Discard(e.id);
    Fail(t, absl::Status(s.code(), absl::StrCat(t.Name(), ": receive failed: ", s.message())),
         true);
    return;
  }
  t.chunks[h.layer][chunk] = Transfer::ChunkState::kInFlight;
  ++t.in_flight;
  ++stats_.accepted_messages;
  receives_[e.id] =
      Receive{h.generation, h.layer, chunk, h.has_checksum, h.checksum, *std::move(dest)};
}

void TransferReceiver::HandleReceiveDone(const TransportEvent& e) {
  auto rit = receives_.find(e.id);
  if (rit == receives_.end()) return;
  Receive r = std::move(rit->second);
  receives_.erase(rit);
  auto tit = transfers_.find(r.generation);
  if (tit == transfers_.end()) return;
  Transfer& t = *tit->second;
  --t.in_flight;
  if (t.ending) return;
  if (!e.status.ok()) {
    Fail(t,
         absl::Status(e.status.code(), absl::StrCat(t.Name(), ": layer ", r.layer,
                                                    " receive failed: ", e.status.message())),
         true);
    return;
  }
  if (t.lease.checksums) {
    absl::StatusOr<std::vector<std::span<const std::byte>>> bytes = regions_.Resolve(r.destination);
    if (!bytes.ok()) {
      Fail(
          t,
          absl::DataLossError(absl::StrCat(t.Name(), ": layer ", r.layer, " chunk ", r.chunk,
                                           " cannot be read to check: ", bytes.status().message())),
          true);
      return;
    }
    // The chunk stays in flight until its verdict is read.
    ++t.in_flight;
    const uint64_t tag = next_check_++;
    const uint64_t expected = r.checksum;
    checks_.emplace(tag, Check{std::move(r), e.peer});
    verifier_.Submit(tag, *std::move(bytes), expected);
    return;
  }
  Land(t, r, e.peer);
}

void TransferReceiver::Land(Transfer& t, const Receive& r, PeerId peer) {
  t.chunks[r.layer][r.chunk] = Transfer::ChunkState::kLanded;
  const uint64_t bytes = TotalBytes(r.destination);
  t.bytes_landed += bytes;
  stats_.accepted_bytes += bytes;
  if (--t.chunks_left == 0) {
    t.ending = true;
    t.outcome = absl::OkStatus();
    live_by_request_.erase(t.lease.request_id);
    SendControl(peer, absl::StatusCode::kOk, t);
  }
}

void TransferReceiver::HandleVerdicts() {
  verdicts_.clear();
  verifier_.Collect(verdicts_);
  for (const ChunkVerifier::Verdict& v : verdicts_) {
    auto cit = checks_.find(v.tag);
    if (cit == checks_.end()) continue;
    const Check c = std::move(cit->second);
    checks_.erase(cit);
    // Present: the check holds the transfer in flight.
    Transfer& t = *transfers_.at(c.receive.generation);
    --t.in_flight;
    if (t.ending) continue;
    if (!v.ok) {
      Fail(t,
           absl::DataLossError(absl::StrCat(t.Name(), ": checksum mismatch in layer ",
                                            c.receive.layer, " chunk ", c.receive.chunk)),
           true);
      continue;
    }
    Land(t, c.receive, c.peer);
  }
}

void TransferReceiver::HandlePeerFailed(PeerId peer) {
  // Releases what the transport keeps of the connection (the sender's
  // worker may be gone for good).
  transport_->Disconnect(peer);
  for (auto& [generation, t] : transfers_) {
    if (!t->ending && t->peers.contains(peer)) {
      t->peers.erase(peer);
      Fail(*t, absl::UnavailableError(absl::StrCat(t->Name(), ": connection to the sender lost")),
           true);
    }
  }
}

void TransferReceiver::Poll() {
  std::vector<TransportEvent> events;
  transport_->Poll(events);
  for (const TransportEvent& e : events) {
    switch (e.kind) {
      case TransportEvent::Kind::kIncoming:
        HandleIncoming(e);
        break;
      case TransportEvent::Kind::kReceiveDone:
        HandleReceiveDone(e);
        break;
      case TransportEvent::Kind::kPeerFailed:
        HandlePeerFailed(e.peer);
        break;
      case TransportEvent::Kind::kSendDone:
        break;  // Control messages only: nothing to release.
    }
  }
  HandleVerdicts();
  const absl::Time now = clock_->Now();
  std::vector<std::unique_ptr<Transfer>> finished;
  for (auto it = transfers_.begin(); it != transfers_.end();) {
    Transfer& t = *it->second;
    if (!t.ending && now >= t.lease.deadline) {
      Fail(t,
           absl::DeadlineExceededError(
               absl::StrCat(t.Name(), ": KV transfer deadline exceeded with ", t.bytes_landed,
                            " of ", t.lease.total_bytes(), " bytes received")),
           true);
    }
    if (t.ending && t.in_flight == 0) {
      finished.push_back(std::move(it->second));
      transfers_.erase(it++);
    } else {
      ++it;
    }
  }
  // Callbacks run last, outside the iteration, so they may call Expect or Cancel.
  for (std::unique_ptr<Transfer>& t : finished) {
    RememberEnded(t->lease.generation);
    if (t->outcome.ok()) {
      ++stats_.completed;
    } else {
      ++stats_.failed;
      if (absl::IsCancelled(t->outcome)) ++stats_.cancelled;
      if (absl::IsDeadlineExceeded(t->outcome)) ++stats_.deadline_exceeded;
    }
    t->done(t->lease.request_id, t->lease.generation, t->outcome);
  }
}

void TransferReceiver::WaitForActivity(absl::Time deadline) {
  // A verdict wakes nothing the transport waits on, so while checks run the
  // transport is only progressed: the caller polls again at once, and the
  // chunks still landing are not kept waiting for their accept.
  if (verifier_.outstanding() > 0) deadline = absl::InfinitePast();
  for (const auto& [generation, t] : transfers_) {
    if (!t->ending) deadline = std::min(deadline, t->lease.deadline);
    if (t->ending && t->in_flight == 0) deadline = absl::InfinitePast();
  }
  transport_->WaitForActivity(deadline);
}

}  // namespace tandem::kvtransfer
