// UCX callbacks, peer failures and event reporting of UcxTransport::Impl.
#include <poll.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "kvtransfer/ucx/ucx_request.h"
#include "kvtransfer/ucx/ucx_transport_impl.h"
#include "kvtransfer/ucx/ucx_wire.h"

namespace tandem::kvtransfer {

using ucx_internal::ConnectionKey;
using ucx_internal::MessagePrefix;
using ucx_internal::UcxError;
using ucx_internal::UcxRequest;

ucs_status_t UcxTransport::Impl::OnHello(void* arg, const void* header, size_t header_length,
                                         void* /*data*/, size_t /*length*/,
                                         const ucp_am_recv_param_t* /*param*/) {
  auto* self = static_cast<Impl*>(arg);
  const std::string_view bytes(static_cast<const char*>(header), header_length);
  absl::StatusOr<MessagePrefix> prefix = ucx_internal::DecodePrefix(bytes);
  if (!prefix.ok() || !prefix->from_initiator || bytes.size() == MessagePrefix::kEncodedBytes) {
    LOG(WARNING) << "dropping a malformed UCX hello: " << prefix.status();
    return UCS_OK;
  }
  if (self->accepted_.contains(prefix->key)) return UCS_OK;
  auto peer = std::make_unique<Peer>();
  peer->impl = self;
  peer->id = self->next_peer_++;
  peer->key = prefix->key;
  peer->initiator = false;
  peer->back_address = std::string(bytes.substr(MessagePrefix::kEncodedBytes));
  self->accepted_[peer->key] = peer->id;
  // Creating a worker or an endpoint from inside a UCX callback is not
  // allowed; Poll() does it right after progress, before the caller sees
  // the peer.
  self->new_peers_.push_back(peer->id);
  self->peers_[peer->id] = std::move(peer);
  return UCS_OK;
}

ucs_status_t UcxTransport::Impl::OnProbe(void* arg, const void* header, size_t header_length,
                                         void* /*data*/, size_t /*length*/,
                                         const ucp_am_recv_param_t* /*param*/) {
  auto* self = static_cast<Impl*>(arg);
  absl::StatusOr<MessagePrefix> prefix =
      ucx_internal::DecodePrefix(std::string_view(static_cast<const char*>(header), header_length));
  if (prefix.ok() && prefix->key.initiator_nonce == self->nonce_ && !self->door_deaf_) {
    self->probes_heard_ = std::max<uint64_t>(self->probes_heard_, prefix->key.initiator_peer);
  }
  return UCS_OK;
}

namespace {

// Whether `header` opens with the prefix of `key` sent by the other side of
// a connection whose own side is `initiator`; the prefix is cut off.
bool FromTheFarEnd(std::string_view& header, const ConnectionKey& key, bool initiator) {
  absl::StatusOr<MessagePrefix> prefix = ucx_internal::DecodePrefix(header);
  if (!prefix.ok() || prefix->key != key || prefix->from_initiator == initiator) return false;
  header.remove_prefix(MessagePrefix::kEncodedBytes);
  return true;
}

}  // namespace

ucs_status_t UcxTransport::Impl::OnWelcome(void* arg, const void* header, size_t header_length,
                                           void* /*data*/, size_t /*length*/,
                                           const ucp_am_recv_param_t* /*param*/) {
  auto* peer = static_cast<Peer*>(arg);
  std::string_view bytes(static_cast<const char*>(header), header_length);
  // Also after Disconnect: the connection then opens only to say goodbye,
  // so that the acceptor lets go of its worker.
  if (!peer->initiator || !FromTheFarEnd(bytes, peer->key, peer->initiator) || bytes.empty() ||
      peer->ep != nullptr || !peer->back_address.empty() || peer->failed ||
      peer->door_ep == nullptr) {
    return UCS_OK;
  }
  peer->back_address = std::string(bytes);
  peer->impl->new_peers_.push_back(peer->id);
  return UCS_OK;
}

ucs_status_t UcxTransport::Impl::OnData(void* arg, const void* header, size_t header_length,
                                        void* data, size_t length,
                                        const ucp_am_recv_param_t* param) {
  auto* peer = static_cast<Peer*>(arg);
  Impl* self = peer->impl;
  const bool rendezvous = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  std::string_view bytes(static_cast<const char*>(header), header_length);
  if (!FromTheFarEnd(bytes, peer->key, peer->initiator) || peer->failed || peer->disconnected) {
    // Foreign or gone: drop it; a rendezvous sender learns it was refused.
    return rendezvous ? UCS_ERR_REJECTED : UCS_OK;
  }
  const IncomingId id = self->next_incoming_++;
  auto incoming = std::make_unique<Incoming>();
  incoming->peer = peer->id;
  incoming->worker = peer->worker;
  incoming->payload_bytes = length;
  ucs_status_t keep = UCS_OK;
  if (length > 0) {
    if (rendezvous || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA) != 0) {
      incoming->descriptor = data;
      incoming->rendezvous = rendezvous;
      keep = UCS_INPROGRESS;
    } else {
      incoming->copy.assign(static_cast<const char*>(data), length);
    }
  }
  TransportEvent event = Event(TransportEvent::Kind::kIncoming, id, peer->id, absl::OkStatus());
  event.header = std::string(bytes);
  event.payload_bytes = length;
  self->events_.push_back(std::move(event));
  self->incoming_[id] = std::move(incoming);
  return keep;
}

ucs_status_t UcxTransport::Impl::OnBye(void* arg, const void* header, size_t header_length,
                                       void* /*data*/, size_t /*length*/,
                                       const ucp_am_recv_param_t* /*param*/) {
  auto* peer = static_cast<Peer*>(arg);
  std::string_view bytes(static_cast<const char*>(header), header_length);
  if (!FromTheFarEnd(bytes, peer->key, peer->initiator)) return UCS_OK;
  // The peer closed the connection: to us that is its failure, reported
  // now rather than when UCX would notice the endpoint is gone.
  peer->impl->failed_peers_.emplace_back(
      peer->id, UcxError(UCS_ERR_CONNECTION_RESET, absl::StrCat("UCX connection to peer ", peer->id,
                                                                " (closed by the peer)")));
  return UCS_OK;
}

void UcxTransport::Impl::OnEndpointError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* peer = static_cast<Peer*>(arg);
  peer->impl->failed_peers_.emplace_back(
      peer->id, UcxError(status, absl::StrCat("UCX connection to peer ", peer->id)));
}

void UcxTransport::Impl::OnDoorEndpointError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* peer = static_cast<Peer*>(arg);
  // After the welcome the door has done its part, and its endpoint closes.
  if (peer->ep != nullptr || !peer->back_address.empty()) return;
  peer->impl->failed_peers_.emplace_back(
      peer->id, UcxError(status, absl::StrCat("introducing ourselves to peer ", peer->id)));
}

void UcxTransport::Impl::OnProbeEndpointError(void* /*arg*/, ucp_ep_h /*ep*/, ucs_status_t status) {
  // Our own door, in this process: a failure leaves the probe unanswered,
  // and the door is replaced as if wedged.
  LOG(WARNING) << "the UCX door's probe endpoint failed: " << ucs_status_string(status);
}

void UcxTransport::Impl::HandleFailedPeers() {
  for (auto& [id, status] : std::exchange(failed_peers_, {})) {
    Peer* peer = FindPeer(id);
    if (peer == nullptr || peer->failed || peer->disconnected) continue;
    peer->failed = true;
    peer->failure = status.code() == absl::StatusCode::kUnavailable
                        ? std::move(status)
                        : absl::UnavailableError(status.message());
    // Force: a dead peer acknowledges nothing. Pending sends finish now with
    // UCS_ERR_CANCELED, or are reported below if UCX still holds them.
    CloseEndpoint(*peer, /*force=*/true);
    CloseDoorEndpoint(*peer, /*force=*/true);
    DropQueuedSends(*peer, peer->failure);
    for (auto& [send_id, op] : sends_) {
      if (op->peer != id || op->request.done() || op->reported) continue;
      op->reported = true;
      events_.push_back(Event(TransportEvent::Kind::kSendDone, send_id, id, peer->failure));
    }
    for (auto& [incoming_id, incoming] : incoming_) {
      if (incoming->peer != id) continue;
      if (!incoming->receiving) {
        ReleaseDescriptor(*incoming);
      } else if (!incoming->request->done() && !incoming->reported) {
        incoming->reported = true;
        events_.push_back(
            Event(TransportEvent::Kind::kReceiveDone, incoming_id, id, peer->failure));
      }
    }
    events_.push_back(Event(TransportEvent::Kind::kPeerFailed, 0, id, peer->failure));
  }
}

void UcxTransport::Impl::ReportFinishedSends() {
  for (SendId id : std::exchange(finished_sends_, {})) {
    auto it = sends_.find(id);
    if (it == sends_.end()) continue;
    const SendOp& op = *it->second;
    Peer* peer = FindPeer(op.peer);
    if (peer != nullptr) --peer->in_flight;
    if (!op.reported) {
      absl::Status status;
      if (op.cancelled) {
        status = absl::CancelledError(absl::StrCat("send ", id, " was cancelled"));
      } else if (op.request.status() != UCS_OK && peer != nullptr && peer->failed) {
        status = peer->failure;
      } else {
        status = UcxError(op.request.status(), absl::StrCat("sending to peer ", op.peer));
      }
      events_.push_back(Event(TransportEvent::Kind::kSendDone, id, op.peer, std::move(status)));
    }
    sends_.erase(it);
  }
}

void UcxTransport::Impl::ReportFinishedReceives() {
  for (IncomingId id : std::exchange(finished_receives_, {})) {
    auto it = incoming_.find(id);
    if (it == incoming_.end()) continue;
    const Incoming& incoming = *it->second;
    if (!incoming.reported) {
      const Peer* peer = FindPeer(incoming.peer);
      const ucs_status_t ucs_status = incoming.request->status();
      absl::Status status;
      if (ucs_status != UCS_OK && peer != nullptr && peer->failed) {
        status = peer->failure;
      } else if (ucs_status == UCS_OK &&
                 incoming.request->received_length() != incoming.payload_bytes) {
        status = absl::DataLossError(absl::StrCat("incoming message ", id, " delivered ",
                                                  incoming.request->received_length(), " of its ",
                                                  incoming.payload_bytes, " bytes"));
      } else {
        status = UcxError(ucs_status,
                          absl::StrCat("receiving message ", id, " from peer ", incoming.peer));
      }
      events_.push_back(
          Event(TransportEvent::Kind::kReceiveDone, id, incoming.peer, std::move(status)));
    }
    incoming_.erase(it);
  }
}

void UcxTransport::Impl::Poll(std::vector<TransportEvent>& events) {
  ProgressAll();
  const absl::Time now = absl::Now();
  const bool introduced = CreateBackEndpoints();
  CheckIntroductions(now);
  HandleFailedPeers();
  const bool room = !finished_sends_.empty();
  ReportFinishedSends();
  if (room || introduced) StartQueuedSends();
  ReportFinishedReceives();
  ReleaseClosedPeers();
  ProbeDoor(now);
  CloseDoors(now, /*all=*/false);
  if (events.empty()) {
    events.swap(events_);
  } else {
    std::move(events_.begin(), events_.end(), std::back_inserter(events));
    events_.clear();
  }
}

bool UcxTransport::Impl::HasQueuedWork() const {
  return !events_.empty() || !finished_sends_.empty() || !finished_receives_.empty() ||
         !new_peers_.empty() || !failed_peers_.empty();
}

void UcxTransport::Impl::WaitForActivity(absl::Time deadline) {
  if (HasQueuedWork() || ProgressAll() || HasQueuedWork()) return;
  // UCX_BUSY: events arrived between the progress call and arming.
  for (ucp_worker_h worker : workers_) {
    if (ucp_worker_arm(worker) != UCS_OK) return;
  }
  // Keepalive, the door's probe and some transports advance only inside
  // progress, so a long sleep is cut short; callers loop until their own
  // deadline anyway.
  constexpr absl::Duration kMaxSleep = absl::Milliseconds(50);
  const absl::Duration wait = std::clamp(deadline - absl::Now(), absl::ZeroDuration(), kMaxSleep);
  pollfds_.clear();
  for (int fd : worker_fds_) pollfds_.push_back(pollfd{fd, POLLIN, 0});
  ::poll(pollfds_.data(), pollfds_.size(),
         static_cast<int>(absl::ToInt64Milliseconds(absl::Ceil(wait, absl::Milliseconds(1)))));
}

}  // namespace tandem::kvtransfer
