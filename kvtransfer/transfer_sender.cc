#include "kvtransfer/transfer_sender.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"

namespace tandem::kvtransfer {

struct TransferSender::Transfer {
  TransferLease lease;
  std::vector<std::vector<Slice>> layers;
  SendDoneFn done;
  absl::Time deadline;
  std::vector<PeerId> lanes;
  std::vector<bool> ready;
  uint32_t layers_ready = 0;
  uint64_t next_lane = 0;
  absl::flat_hash_set<SendId> outstanding;
  bool confirmed = false;  // The receiver sent kComplete.
  bool ending = false;
  uint64_t ended_in_poll = 0;  // TransferSender::polls_ when it began to end.
  absl::Status outcome;

  std::string Name() const {
    return absl::StrCat("request ", lease.request_id, " (generation ", lease.generation, ") to ",
                        lease.receiver_address);
  }
  bool Succeeded() const {
    return !ending && confirmed && layers_ready == layers.size() && outstanding.empty();
  }
};

TransferSender::TransferSender(KvTransport* transport, const Clock* clock, SenderOptions options)
    : transport_(transport), clock_(clock), options_(options) {
  CHECK(options_.idle_timeout > absl::ZeroDuration())
      << "SenderOptions::idle_timeout is " << options_.idle_timeout
      << "; it must be positive (absl::InfiniteDuration() never closes idle connections)";
}

TransferSender::~TransferSender() {
  for (auto& [request_id, t] : transfers_) {
    t->done(request_id, absl::CancelledError(absl::StrCat(t->Name(), ": sender shut down")));
  }
}

absl::StatusOr<RegionId> TransferSender::RegisterMemory(void* base, size_t length,
                                                        MemoryKind kind) {
  absl::StatusOr<RegionId> region = transport_->RegisterMemory(base, length, kind);
  if (region.ok()) regions_.Add(*region, base, length, kind);
  return region;
}

absl::Status TransferSender::DeregisterMemory(RegionId region) {
  regions_.Remove(region);
  return transport_->DeregisterMemory(region);
}

absl::StatusOr<std::vector<PeerId>> TransferSender::Lanes(const std::string& address) {
  std::vector<PeerId>& pool = pool_[address].lanes;
  const size_t want = static_cast<size_t>(std::max(1, options_.lanes));
  while (pool.size() < want) {
    absl::StatusOr<PeerId> peer = transport_->Connect(address);
    if (!peer.ok()) {
      if (pool.empty() && pool_[address].transfers == 0) pool_.erase(address);
      UpdatePoolStats();
      return absl::UnavailableError(
          absl::StrCat("cannot connect to KV receiver: ", peer.status().message()));
    }
    pool.push_back(*peer);
    ++stats_.connections;
  }
  UpdatePoolStats();
  return std::vector<PeerId>(pool.begin(), pool.begin() + want);
}

void TransferSender::CloseIdleConnections(absl::Time now) {
  if (options_.idle_timeout == absl::InfiniteDuration()) return;
  for (auto it = pool_.begin(); it != pool_.end();) {
    Pooled& pooled = it->second;
    if (pooled.transfers > 0 || now - pooled.last_used < options_.idle_timeout) {
      ++it;
      continue;
    }
    for (PeerId peer : pooled.lanes) transport_->Disconnect(peer);
    stats_.idle_closed += pooled.lanes.size();
    pool_.erase(it++);
  }
  UpdatePoolStats();
}

void TransferSender::UpdatePoolStats() {
  stats_.pooled_connections = 0;
  for (const auto& [address, pooled] : pool_) stats_.pooled_connections += pooled.lanes.size();
}

absl::StatusOr<uint64_t> TransferSender::Start(SendRequest request) {
  absl::StatusOr<TransferLease> lease = TransferLease::Parse(request.descriptor);
  if (!lease.ok()) return lease.status();
  const std::string name = absl::StrCat("request ", lease->request_id);
  if (!request.done) return absl::InvalidArgumentError(absl::StrCat(name, ": no done callback"));
  if (transfers_.contains(lease->request_id)) {
    return absl::AlreadyExistsError(absl::StrCat(name, " is already being sent"));
  }
  if (request.layers.size() != lease->layer_bytes.size()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", request.layers.size(),
                                                   " source layers, the lease expects ",
                                                   lease->layer_bytes.size()));
  }
  for (size_t l = 0; l < request.layers.size(); ++l) {
    const uint64_t bytes = TotalBytes(request.layers[l]);
    if (bytes != lease->layer_bytes[l]) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": layer ", l, " has ", bytes,
                                                     " bytes, the lease expects ",
                                                     lease->layer_bytes[l]));
    }
    if (lease->checksums) {
      for (const Slice& s : request.layers[l]) {
        absl::StatusOr<std::span<std::byte>> b = regions_.Bytes(s);
        if (!b.ok()) return b.status();
      }
    }
  }
  const absl::Time deadline = std::min(request.deadline, lease->deadline);
  if (clock_->Now() >= deadline) {
    return absl::DeadlineExceededError(absl::StrCat(name, ": deadline passed before sending"));
  }
  absl::StatusOr<std::vector<PeerId>> lanes = Lanes(lease->receiver_address);
  if (!lanes.ok()) return lanes.status();
  auto t = std::make_unique<Transfer>();
  t->lease = *std::move(lease);
  t->layers = std::move(request.layers);
  t->done = std::move(request.done);
  t->deadline = deadline;
  t->lanes = *std::move(lanes);
  t->ready.assign(t->layers.size(), false);
  const uint64_t id = t->lease.request_id;
  ++pool_[t->lease.receiver_address].transfers;
  transfers_[id] = std::move(t);
  ++stats_.started;
  return id;
}

absl::Status TransferSender::MarkLayerReady(uint64_t request_id, uint32_t layer) {
  auto it = transfers_.find(request_id);
  if (it == transfers_.end()) {
    return absl::NotFoundError(absl::StrCat("request ", request_id, " is not being sent"));
  }
  Transfer& t = *it->second;
  if (t.ending) {
    return absl::FailedPreconditionError(
        absl::StrCat(t.Name(), " is ending: ", t.outcome.message()));
  }
  if (layer >= t.layers.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(t.Name(), ": layer ", layer, " of ", t.layers.size()));
  }
  if (t.ready[layer]) return absl::OkStatus();
  t.ready[layer] = true;
  ++t.layers_ready;
  for (uint64_t c = 0; c < t.lease.chunks_in_layer(layer); ++c) {
    MessageHeader h;
    h.type = MessageType::kData;
    h.request_id = t.lease.request_id;
    h.generation = t.lease.generation;
    h.layer = layer;
    h.offset = c * t.lease.chunk_bytes;
    h.length = t.lease.chunk_length(layer, c);
    const size_t lane = t.next_lane++ % t.lanes.size();
    h.lane = static_cast<uint16_t>(lane);
    absl::StatusOr<std::vector<Slice>> payload = SubSlices(t.layers[layer], h.offset, h.length);
    absl::Status status = payload.status();
    if (status.ok() && t.lease.checksums) {
      absl::StatusOr<uint64_t> sum = regions_.Checksum(*payload);
      status = sum.status();
      h.has_checksum = true;
      h.checksum = sum.value_or(0);
    }
    absl::StatusOr<SendId> send =
        status.ok() ? transport_->PostSend(t.lanes[lane], h.Encode(), *payload) : status;
    if (!send.ok()) {
      absl::Status why(
          send.status().code(),
          absl::StrCat(t.Name(), ": layer ", layer, " send failed: ", send.status().message()));
      Fail(t, why, true);
      return why;
    }
    t.outstanding.insert(*send);
    sends_[*send] = request_id;
    ++stats_.messages_sent;
    stats_.bytes_sent += h.length;
  }
  return absl::OkStatus();
}

absl::Status TransferSender::Cancel(uint64_t request_id) {
  auto it = transfers_.find(request_id);
  if (it == transfers_.end()) {
    return absl::NotFoundError(absl::StrCat("request ", request_id, " is not being sent"));
  }
  Fail(*it->second,
       absl::CancelledError(absl::StrCat(it->second->Name(), ": cancelled by the sender")), true);
  return absl::OkStatus();
}

void TransferSender::Fail(Transfer& t, absl::Status status, bool notify_receiver) {
  if (t.ending) return;
  t.ending = true;
  t.ended_in_poll = polls_;
  t.outcome = std::move(status);
  // Each cancelled send still reports kSendDone; `done` waits for all of them.
  for (SendId send : t.outstanding) transport_->Cancel(send);
  if (notify_receiver) {
    MessageHeader h;
    h.type = MessageType::kAbort;
    h.code = t.outcome.code();
    h.request_id = t.lease.request_id;
    h.generation = t.lease.generation;
    // Posted on every lane, since the receiver may have heard from any; best
    // effort: a receiver that never hears ends on its own deadline.
    for (PeerId lane : t.lanes) (void)transport_->PostSend(lane, h.Encode(), {});
  }
}

void TransferSender::HandleSendDone(const TransportEvent& e) {
  auto sit = sends_.find(e.id);
  if (sit == sends_.end()) return;  // An abort message: nothing to release.
  auto tit = transfers_.find(sit->second);
  sends_.erase(sit);
  if (tit == transfers_.end()) return;
  Transfer& t = *tit->second;
  t.outstanding.erase(e.id);
  if (!e.status.ok()) {
    Fail(t,
         absl::Status(e.status.code(),
                      absl::StrCat(t.Name(), ": send failed: ", e.status.message())),
         true);
  }
}

void TransferSender::HandleIncoming(const TransportEvent& e) {
  transport_->Discard(e.id);
  absl::StatusOr<MessageHeader> h = MessageHeader::Parse(e.header);
  auto it = h.ok() ? transfers_.find(h->request_id) : transfers_.end();
  if (it == transfers_.end() || it->second->lease.generation != h->generation ||
      it->second->ending) {
    ++stats_.dropped;
    return;
  }
  Transfer& t = *it->second;
  if (h->type == MessageType::kComplete) {
    t.confirmed = true;
  } else if (h->type == MessageType::kAbort) {
    Fail(t,
         absl::Status(h->code, absl::StrCat(t.Name(), ": aborted by the receiver (",
                                            absl::StatusCodeToString(h->code), ")")),
         false);
  } else {
    ++stats_.dropped;
  }
}

void TransferSender::HandlePeerFailed(PeerId peer) {
  transport_->Disconnect(peer);
  for (auto it = pool_.begin(); it != pool_.end();) {
    std::erase(it->second.lanes, peer);
    // Kept while transfers to the receiver still count on it.
    if (it->second.lanes.empty() && it->second.transfers == 0) {
      pool_.erase(it++);
    } else {
      ++it;
    }
  }
  UpdatePoolStats();
  for (auto& [request_id, t] : transfers_) {
    if (std::find(t->lanes.begin(), t->lanes.end(), peer) == t->lanes.end()) continue;
    std::erase(t->lanes, peer);
    Fail(*t, absl::UnavailableError(absl::StrCat(t->Name(), ": connection to the receiver lost")),
         true);
  }
}

void TransferSender::DropLanes(Transfer& t) {
  for (PeerId lane : std::exchange(t.lanes, {})) {
    for (auto& [address, pooled] : pool_) std::erase(pooled.lanes, lane);
    transport_->Disconnect(lane);
    ++stats_.stuck_closed;
  }
  UpdatePoolStats();
}

void TransferSender::Poll() {
  ++polls_;
  std::vector<TransportEvent> events;
  transport_->Poll(events);
  for (const TransportEvent& e : events) {
    switch (e.kind) {
      case TransportEvent::Kind::kSendDone:
        HandleSendDone(e);
        break;
      case TransportEvent::Kind::kIncoming:
        HandleIncoming(e);
        break;
      case TransportEvent::Kind::kPeerFailed:
        HandlePeerFailed(e.peer);
        break;
      case TransportEvent::Kind::kReceiveDone:
        break;  // The sender accepts nothing.
    }
  }
  const absl::Time now = clock_->Now();
  std::vector<std::unique_ptr<Transfer>> finished;
  for (auto it = transfers_.begin(); it != transfers_.end();) {
    Transfer& t = *it->second;
    if (t.Succeeded()) {
      t.ending = true;
      t.outcome = absl::OkStatus();
    } else if (!t.ending && now >= t.deadline) {
      Fail(t,
           absl::DeadlineExceededError(
               absl::StrCat(t.Name(), ": KV transfer not confirmed before the deadline (",
                            t.layers_ready, " of ", t.layers.size(), " layers ready)")),
           true);
    }
    if (t.ending && !t.outstanding.empty() && now >= t.deadline && !t.lanes.empty() &&
        t.ended_in_poll < polls_) {
      // Sends the transport still holds at the deadline, a poll after they
      // were cancelled, will not finish: the receiver went away without its
      // connection failing (UCX never reports a peer that dies before the
      // connection is set up). Closing the connections releases them; the
      // next transfer reconnects. Not in the poll that cancelled them: the
      // abort just posted would go with the connection, and the receiver
      // would hear nothing until its own deadline.
      DropLanes(t);
    }
    if (t.ending && t.outstanding.empty()) {
      finished.push_back(std::move(it->second));
      transfers_.erase(it++);
    } else {
      ++it;
    }
  }
  for (std::unique_ptr<Transfer>& t : finished) {
    if (auto it = pool_.find(t->lease.receiver_address); it != pool_.end()) {
      --it->second.transfers;
      it->second.last_used = now;
      if (it->second.lanes.empty() && it->second.transfers == 0) pool_.erase(it);
    }
    if (t->outcome.ok()) {
      ++stats_.completed;
    } else {
      ++stats_.failed;
    }
    t->done(t->lease.request_id, t->outcome);
  }
  CloseIdleConnections(now);
}

void TransferSender::WaitForActivity(absl::Time deadline) {
  for (const auto& [request_id, t] : transfers_) {
    deadline = std::min(deadline, t->deadline);
    if (t->Succeeded() || (t->ending && t->outstanding.empty())) deadline = absl::InfinitePast();
  }
  transport_->WaitForActivity(deadline);
}

}  // namespace tandem::kvtransfer
