#include "kvtransfer/faulty_transport.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::kvtransfer {
namespace {

TransportEvent SendDone(SendId id, PeerId peer, absl::Status status) {
  TransportEvent e;
  e.kind = TransportEvent::Kind::kSendDone;
  e.id = id;
  e.peer = peer;
  e.status = std::move(status);
  return e;
}

}  // namespace

FaultyTransport::FaultyTransport(std::unique_ptr<KvTransport> inner, FaultPlan plan,
                                 const Clock* clock)
    : plan_(std::move(plan)), clock_(clock), rng_(plan_.seed), inner_(std::move(inner)) {}

absl::StatusOr<RegionId> FaultyTransport::RegisterMemory(void* base, size_t length,
                                                         MemoryKind kind) {
  absl::StatusOr<RegionId> region = inner_->RegisterMemory(base, length, kind);
  if (region.ok()) regions_.Add(*region, base, length, kind);
  return region;
}

absl::Status FaultyTransport::DeregisterMemory(RegionId region) {
  regions_.Remove(region);
  return inner_->DeregisterMemory(region);
}

absl::StatusOr<PeerId> FaultyTransport::Connect(std::string_view address) {
  return inner_->Connect(address);
}

void FaultyTransport::Disconnect(PeerId peer) {
  killed_.erase(peer);
  inner_->Disconnect(peer);
}

Fault FaultyTransport::PickFault(uint64_t index) {
  auto it = plan_.at_message.find(index);
  if (it != plan_.at_message.end()) return it->second;
  if (plan_.random_probability > 0 && !plan_.random_faults.empty()) {
    // Both draws happen for every message, so the sequence of faults depends
    // only on the seed and the message count.
    const double p = std::uniform_real_distribution<double>(0, 1)(rng_);
    const size_t pick =
        std::uniform_int_distribution<size_t>(0, plan_.random_faults.size() - 1)(rng_);
    if (p < plan_.random_probability) return plan_.random_faults[pick];
  }
  return Fault{};
}

absl::StatusOr<SendId> FaultyTransport::PostSend(PeerId peer, std::string_view header,
                                                 std::span<const Slice> payload) {
  if (killed_.contains(peer)) {
    return absl::UnavailableError(absl::StrCat("connection to peer ", peer, " was killed"));
  }
  const Fault fault = PickFault(next_index_++);
  if (fault.kind != Fault::Kind::kNone) ++injected_[static_cast<int>(fault.kind)];
  const SendId id = next_send_++;
  switch (fault.kind) {
    case Fault::Kind::kDrop:
      pending_.push_back(SendDone(id, peer, absl::OkStatus()));
      return id;
    case Fault::Kind::kKill: {
      inner_->Disconnect(peer);
      killed_.insert(peer);
      const absl::Status why =
          absl::UnavailableError(absl::StrCat("connection to peer ", peer, " killed by a fault"));
      TransportEvent failed;
      failed.kind = TransportEvent::Kind::kPeerFailed;
      failed.peer = peer;
      failed.status = why;
      pending_.push_back(std::move(failed));
      pending_.push_back(SendDone(id, peer, why));
      return id;
    }
    default:
      break;
  }
  Send s;
  s.peer = peer;
  s.header = std::string(header);
  s.payload.assign(payload.begin(), payload.end());
  s.fault = fault;
  if (fault.kind == Fault::Kind::kDelayPolls) {
    s.held = true;
    s.polls_left = std::max(1, fault.polls);
  } else if (fault.kind == Fault::Kind::kDelayTime) {
    s.held = true;
    s.release_at = clock_->Now() + fault.delay;
  } else if (fault.kind == Fault::Kind::kReorder) {
    // Released by the next send to the peer, or after two polls when none
    // follows, so that a reordered last message still arrives.
    s.held = true;
    s.polls_left = 2;
  }
  Send& stored = sends_[id] = std::move(s);
  if (!stored.held) {
    if (absl::Status status = Release(stored, id); !status.ok()) {
      sends_.erase(id);
      return status;
    }
    std::vector<SendId> overtaken;
    for (auto& [other_id, other] : sends_) {
      if (other.held && other.peer == peer && other.fault.kind == Fault::Kind::kReorder) {
        overtaken.push_back(other_id);
      }
    }
    std::sort(overtaken.begin(), overtaken.end());
    for (SendId o : overtaken) {
      Send& other = sends_.at(o);
      other.held = false;
      if (absl::Status status = Release(other, o); !status.ok()) Complete(o, status);
    }
  }
  return id;
}

absl::Status FaultyTransport::Release(Send& s, SendId id) {
  s.held = false;
  std::vector<Slice> payload = s.payload;
  const uint64_t total = TotalBytes(payload);
  if (s.fault.kind == Fault::Kind::kTruncate) {
    absl::StatusOr<std::vector<Slice>> shorter =
        SubSlices(s.payload, 0, total - std::min(total, s.fault.bytes));
    if (!shorter.ok()) return shorter.status();
    payload = *std::move(shorter);
  } else if (s.fault.kind == Fault::Kind::kCorrupt && total > 0) {
    s.scratch.reserve(total);
    for (const Slice& slice : s.payload) {
      absl::StatusOr<std::span<std::byte>> bytes = regions_.Bytes(slice);
      if (!bytes.ok()) {
        return absl::FailedPreconditionError(
            absl::StrCat("corrupting a payload needs its regions registered through the wrapper: ",
                         bytes.status().message()));
      }
      s.scratch.insert(s.scratch.end(), bytes->begin(), bytes->end());
    }
    // Distinct positions, so that no flip undoes another.
    const size_t first = std::uniform_int_distribution<size_t>(0, total - 1)(rng_);
    for (uint64_t i = 0; i < std::min(total, s.fault.bytes); ++i) {
      s.scratch[(first + i) % total] ^= std::byte{0xa5};
    }
    absl::StatusOr<RegionId> region =
        inner_->RegisterMemory(s.scratch.data(), s.scratch.size(), MemoryKind::kHost);
    if (!region.ok()) return region.status();
    s.scratch_region = *region;
    payload = {Slice{*region, 0, total}};
  }
  const int copies = s.fault.kind == Fault::Kind::kDuplicate ? 2 : 1;
  for (int c = 0; c < copies; ++c) {
    absl::StatusOr<SendId> inner = inner_->PostSend(s.peer, s.header, payload);
    if (!inner.ok()) {
      if (c == 0) {
        if (s.scratch_region != 0) (void)inner_->DeregisterMemory(s.scratch_region);
        s.scratch_region = 0;
        return inner.status();
      }
      break;  // The first copy is on its way; the duplicate is simply lost.
    }
    s.inner_ids.push_back(*inner);
    inner_to_outer_[*inner] = id;
    ++s.inner_left;
  }
  return absl::OkStatus();
}

void FaultyTransport::Complete(SendId id, absl::Status status) {
  auto it = sends_.find(id);
  if (it == sends_.end()) return;
  if (it->second.scratch_region != 0) (void)inner_->DeregisterMemory(it->second.scratch_region);
  pending_.push_back(SendDone(id, it->second.peer, std::move(status)));
  sends_.erase(it);
}

absl::Status FaultyTransport::Accept(IncomingId incoming, std::span<const Slice> destination) {
  return inner_->Accept(incoming, destination);
}

void FaultyTransport::Discard(IncomingId incoming) { inner_->Discard(incoming); }

void FaultyTransport::Cancel(SendId send) {
  auto it = sends_.find(send);
  if (it == sends_.end()) return;
  if (it->second.held) {
    Complete(send, absl::CancelledError(absl::StrCat("send ", send, " cancelled")));
    return;
  }
  for (SendId inner : it->second.inner_ids) inner_->Cancel(inner);
}

void FaultyTransport::Poll(std::vector<TransportEvent>& events) {
  const absl::Time now = clock_->Now();
  std::vector<SendId> due;
  for (auto& [id, s] : sends_) {
    if (!s.held) continue;
    const bool timed = s.fault.kind == Fault::Kind::kDelayTime;
    if (timed ? now >= s.release_at : --s.polls_left <= 0) due.push_back(id);
  }
  std::sort(due.begin(), due.end());
  for (SendId id : due) {
    if (absl::Status status = Release(sends_.at(id), id); !status.ok()) Complete(id, status);
  }
  std::vector<TransportEvent> inner_events;
  inner_->Poll(inner_events);
  for (TransportEvent& e : inner_events) {
    if (e.kind != TransportEvent::Kind::kSendDone) {
      events.push_back(std::move(e));
      continue;
    }
    auto it = inner_to_outer_.find(e.id);
    if (it == inner_to_outer_.end()) continue;
    const SendId outer = it->second;
    inner_to_outer_.erase(it);
    auto sit = sends_.find(outer);
    if (sit == sends_.end()) continue;
    Send& s = sit->second;
    if (!e.status.ok() && s.status.ok()) s.status = e.status;
    if (--s.inner_left == 0) Complete(outer, s.status);
  }
  for (TransportEvent& e : pending_) events.push_back(std::move(e));
  pending_.clear();
}

void FaultyTransport::WaitForActivity(absl::Time deadline) {
  if (!pending_.empty()) return;
  for (const auto& [id, s] : sends_) {
    if (!s.held) continue;
    if (s.fault.kind != Fault::Kind::kDelayTime) return;
    deadline = std::min(deadline, s.release_at);
  }
  inner_->WaitForActivity(deadline);
}

}  // namespace tandem::kvtransfer
