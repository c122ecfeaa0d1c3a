#include "kvtransfer/link_model_transport.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"

namespace tandem::kvtransfer {

absl::Status LinkModel::Validate() const {
  if (!(bandwidth > 0) || !std::isfinite(bandwidth)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the link's bandwidth is ", bandwidth, " bytes/s; it must be positive"));
  }
  if (!(byte_scale > 0) || !std::isfinite(byte_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the link's byte scale is ", byte_scale, "; it must be positive"));
  }
  if (latency < absl::ZeroDuration() || per_message < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "the link's latency and per-message cost must not be negative");
  }
  if (lanes < 1 || lanes > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("the link has ", lanes, " lanes; give 1 to 1024"));
  }
  return absl::OkStatus();
}

double LinkModel::OnLink(uint64_t header, uint64_t payload) const {
  return static_cast<double>(header) + static_cast<double>(payload) * byte_scale;
}

absl::Duration LinkModel::Busy(uint64_t header, uint64_t payload) const {
  return per_message + absl::Seconds(OnLink(header, payload) / bandwidth);
}

LinkModelTransport::LinkModelTransport(std::unique_ptr<KvTransport> inner, LinkModel model,
                                       const Clock* clock, const Clock* release_clock)
    : model_(model),
      clock_(clock),
      release_clock_(release_clock != nullptr ? release_clock : clock),
      inner_(std::move(inner)),
      lane_free_(std::max(1, model.lanes), absl::InfinitePast()) {
  CHECK_OK(model_.Validate());
}

absl::Time LinkModelTransport::next_release() const {
  return held_.empty() ? absl::InfiniteFuture() : held_.begin()->first.first;
}

absl::StatusOr<SendId> LinkModelTransport::PostSend(PeerId peer, std::string_view header,
                                                    std::span<const Slice> payload) {
  if (header.size() > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("header of ", header.size(), " bytes exceeds ", kMaxHeaderBytes));
  }
  uint64_t payload_bytes = 0;
  for (const Slice& s : payload) payload_bytes += s.length;
  const absl::Time now = clock_->Now();
  auto lane = std::min_element(lane_free_.begin(), lane_free_.end());
  const absl::Time start = std::max(now, *lane);
  const absl::Duration busy = model_.Busy(header.size(), payload_bytes);
  *lane = start + busy;
  absl::Time arrival = start + busy + model_.latency;
  // Never before an earlier message to the same peer.
  absl::Time& last = peer_last_[peer];
  arrival = std::max(arrival, last);
  last = arrival;
  bytes_ += static_cast<uint64_t>(model_.OnLink(header.size(), payload_bytes));
  busy_ += busy;
  const SendId id = next_send_++;
  held_.emplace(
      std::make_pair(arrival, id),
      Held{peer, std::string(header), std::vector<Slice>(payload.begin(), payload.end())});
  held_at_[id] = arrival;
  return id;
}

void LinkModelTransport::Complete(SendId id, absl::Status status) {
  pending_.push_back(TransportEvent{
      .kind = TransportEvent::Kind::kSendDone, .id = id, .status = std::move(status)});
}

void LinkModelTransport::Cancel(SendId send) {
  if (auto it = held_at_.find(send); it != held_at_.end()) {
    held_.erase({it->second, send});
    held_at_.erase(it);
    Complete(send, absl::CancelledError("send cancelled before it left"));
    return;
  }
  if (auto it = outer_to_inner_.find(send); it != outer_to_inner_.end()) inner_->Cancel(it->second);
}

void LinkModelTransport::Disconnect(PeerId peer) {
  for (auto it = held_.begin(); it != held_.end();) {
    if (it->second.peer != peer) {
      ++it;
      continue;
    }
    const SendId id = it->first.second;
    held_at_.erase(id);
    it = held_.erase(it);
    Complete(id, absl::UnavailableError("the connection was closed before the send left"));
  }
  peer_last_.erase(peer);
  inner_->Disconnect(peer);
}

void LinkModelTransport::ReleaseDue() {
  const absl::Time now = release_clock_->Now();
  while (!held_.empty() && held_.begin()->first.first <= now) {
    auto node = held_.extract(held_.begin());
    const SendId id = node.key().second;
    Held& h = node.mapped();
    held_at_.erase(id);
    absl::StatusOr<SendId> inner = inner_->PostSend(h.peer, h.header, h.payload);
    if (!inner.ok()) {
      Complete(id, inner.status());
      continue;
    }
    inner_to_outer_[*inner] = id;
    outer_to_inner_[id] = *inner;
  }
}

void LinkModelTransport::Poll(std::vector<TransportEvent>& events) {
  ReleaseDue();
  for (TransportEvent& e : pending_) events.push_back(std::move(e));
  pending_.clear();
  std::vector<TransportEvent> inner_events;
  inner_->Poll(inner_events);
  for (TransportEvent& e : inner_events) {
    if (e.kind == TransportEvent::Kind::kSendDone) {
      auto it = inner_to_outer_.find(e.id);
      if (it == inner_to_outer_.end()) continue;  // Not ours: never happens.
      e.id = it->second;
      outer_to_inner_.erase(it->second);
      inner_to_outer_.erase(it);
    } else if (e.kind == TransportEvent::Kind::kPeerFailed) {
      // What is still held for the peer cannot go either.
      for (auto it = held_.begin(); it != held_.end();) {
        if (it->second.peer != e.peer) {
          ++it;
          continue;
        }
        const SendId id = it->first.second;
        held_at_.erase(id);
        it = held_.erase(it);
        events.push_back(
            TransportEvent{.kind = TransportEvent::Kind::kSendDone, .id = id, .status = e.status});
      }
    }
    events.push_back(std::move(e));
  }
}

void LinkModelTransport::WaitForActivity(absl::Time deadline) {
  if (!pending_.empty() || !held_.empty()) return;
  inner_->WaitForActivity(deadline);
}

}  // namespace tandem::kvtransfer
