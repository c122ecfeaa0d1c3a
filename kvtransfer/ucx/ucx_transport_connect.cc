// Connections of UcxTransport::Impl: the door, its probe, introductions,
// endpoints, closing and releasing peers.
#include <ucp/api/ucp.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "kvtransfer/ucx/ucx_request.h"
#include "kvtransfer/ucx/ucx_transport_impl.h"
#include "kvtransfer/ucx/ucx_wire.h"

namespace tandem::kvtransfer {

using ucx_internal::ConnectionKey;
using ucx_internal::MessagePrefix;
using ucx_internal::UcxError;
using ucx_internal::UcxRequest;

namespace {

// Polls a probe must have waited through, besides door_probe_timeout, before
// the door counts as wedged: a caller that polls rarely is not a wedge.
constexpr int kProbePolls = 16;
// How long destroying a door waits for its probe endpoint to close.
constexpr absl::Duration kProbeCloseWait = absl::Milliseconds(200);

}  // namespace

absl::Status UcxTransport::Impl::OpenDoor() {
  static constexpr HandlerSpec kDoorHandlers[] = {
      {ucx_internal::kHelloAmId, &Impl::OnHello, UCP_AM_FLAG_WHOLE_MSG},
      {ucx_internal::kProbeAmId, &Impl::OnProbe, UCP_AM_FLAG_WHOLE_MSG},
  };
  Door door;
  ASSIGN_OR_RETURN(door.worker, NewWorker(kDoorHandlers, this, &door.event_fd));
  // From here on DestroyDoor releases whatever exists when a step fails.
  absl::Status status;
  if (absl::StatusOr<std::string> address = WorkerAddress(door.worker); address.ok()) {
    door.raw_address = *std::move(address);
  } else {
    status = address.status();
  }
  if (status.ok()) {
    absl::StatusOr<ucp_worker_h> prober = NewWorker({}, nullptr, &door.prober_fd);
    if (prober.ok()) {
      door.prober = *prober;
    } else {
      status = prober.status();
    }
  }
  if (status.ok()) {
    absl::StatusOr<ucp_ep_h> ep = CreateEndpoint(
        door.prober, door.raw_address, &Impl::OnProbeEndpointError, this, "the door's probe");
    if (ep.ok()) {
      door.probe_ep = *ep;
    } else {
      status = ep.status();
    }
  }
  if (!status.ok()) {
    DestroyDoor(door);
    return status;
  }
  const absl::Time now = absl::Now();
  if (door_.worker != nullptr) {
    door_.retire_at = now + options_.door_retire_after;
    retired_doors_.push_back(std::move(door_));
  }
  door_ = std::move(door);
  address_ = ucx_internal::EncodeAddress(door_.raw_address);
  door_deaf_ = false;
  probes_heard_ = probes_sent_;
  next_probe_ = now + options_.door_probe_interval;
  return absl::OkStatus();
}

void UcxTransport::Impl::ProbeDoor(absl::Time now) {
  if (probes_heard_ < probes_sent_) {
    ++polls_since_probe_;
    if (polls_since_probe_ < kProbePolls || now - probe_sent_at_ < options_.door_probe_timeout) {
      return;
    }
    ++doors_replaced_;
    if (const absl::Status status = OpenDoor(); !status.ok()) {
      LOG(ERROR) << "the UCX door's message ring has not moved for " << (now - probe_sent_at_)
                 << " and no new door could be opened: " << status;
      probes_heard_ = probes_sent_;  // Try again after the next probe.
      return;
    }
    LOG(WARNING) << "the UCX door's message ring has not moved for " << (now - probe_sent_at_)
                 << " (a peer died while writing into it); new connections now go to a new door, "
                    "open ones are not affected";
    return;
  }
  if (now < next_probe_ || (door_.probe != nullptr && !door_.probe->done())) return;
  ++probes_sent_;
  door_.probe_header = ucx_internal::EncodePrefix(
      {ConnectionKey{nonce_, static_cast<uint32_t>(probes_sent_)}, true});
  door_.probe = std::make_unique<UcxRequest>();
  ucp_request_param_t param = door_.probe->SendParam();
  door_.probe->Start(ucp_am_send_nbx(door_.probe_ep, ucx_internal::kProbeAmId,
                                     door_.probe_header.data(), door_.probe_header.size(), nullptr,
                                     0, &param));
  probe_sent_at_ = now;
  polls_since_probe_ = 0;
  next_probe_ = now + options_.door_probe_interval;
}

void UcxTransport::Impl::DestroyDoor(Door& door) const {
  if (door.probe_ep != nullptr) {
    UcxRequest close;
    ucp_request_param_t param = close.SendParam();
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    // Forcing is defined only for endpoints with peer-failure handling.
    param.flags = options_.detect_peer_failure ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    close.Start(ucp_ep_close_nbx(std::exchange(door.probe_ep, nullptr), &param));
    const absl::Time deadline = absl::Now() + kProbeCloseWait;
    while (!close.done() && absl::Now() < deadline) {
      ucp_worker_progress(door.prober);
      ucp_worker_progress(door.worker);
    }
    close.Abandon();
  }
  if (door.probe != nullptr) door.probe->Abandon();
  if (door.prober != nullptr) ucp_worker_destroy(std::exchange(door.prober, nullptr));
  if (door.worker != nullptr) ucp_worker_destroy(std::exchange(door.worker, nullptr));
}

void UcxTransport::Impl::CloseDoors(absl::Time now, bool all) {
  std::erase_if(retired_doors_, [&](Door& door) {
    if (!all && now < door.retire_at) return false;
    DestroyDoor(door);
    return true;
  });
}

absl::Status UcxTransport::Impl::NewPeerWorker(Peer& peer) {
  static constexpr HandlerSpec kPeerHandlers[] = {
      {ucx_internal::kWelcomeAmId, &Impl::OnWelcome, UCP_AM_FLAG_WHOLE_MSG},
      {ucx_internal::kDataAmId, &Impl::OnData, UCP_AM_FLAG_WHOLE_MSG | UCP_AM_FLAG_PERSISTENT_DATA},
      {ucx_internal::kByeAmId, &Impl::OnBye, UCP_AM_FLAG_WHOLE_MSG},
  };
  ASSIGN_OR_RETURN(peer.worker, NewWorker(kPeerHandlers, &peer, &peer.event_fd));
  return absl::OkStatus();
}

void UcxTransport::Impl::CollectWorkers() {
  workers_.clear();
  worker_fds_.clear();
  const auto add = [this](ucp_worker_h worker, int fd) {
    if (worker == nullptr) return;
    workers_.push_back(worker);
    worker_fds_.push_back(fd);
  };
  add(door_.worker, door_.event_fd);
  add(door_.prober, door_.prober_fd);
  for (const Door& door : retired_doors_) {
    add(door.worker, door.event_fd);
    add(door.prober, door.prober_fd);
  }
  for (const auto& [id, peer] : peers_) add(peer->worker, peer->event_fd);
}

bool UcxTransport::Impl::ProgressAll() {
  // Collected first: the door's callbacks add peers.
  CollectWorkers();
  bool progressed = false;
  for (ucp_worker_h worker : workers_) {
    // Bounded, so that a steady stream of arrivals cannot keep Poll() busy.
    for (int i = 0; i < 64 && ucp_worker_progress(worker) != 0; ++i) progressed = true;
  }
  return progressed;
}

absl::StatusOr<ucp_ep_h> UcxTransport::Impl::CreateEndpoint(ucp_worker_h worker,
                                                            std::string_view worker_address,
                                                            ucp_err_handler_cb_t on_error,
                                                            void* arg, std::string_view what) {
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  params.address = reinterpret_cast<const ucp_address_t*>(worker_address.data());
  params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
  if (options_.detect_peer_failure) {
    params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = on_error;
    params.err_handler.arg = arg;
  }
  ucp_ep_h ep = nullptr;
  RETURN_IF_ERROR(UcxError(ucp_ep_create(worker, &params, &ep),
                           absl::StrCat("creating a UCX endpoint for ", std::string(what))));
  return ep;
}

absl::StatusOr<PeerId> UcxTransport::Impl::Connect(std::string_view address) {
  ASSIGN_OR_RETURN(std::string_view door_address, ucx_internal::DecodeAddress(address));
  auto owned = std::make_unique<Peer>();
  Peer* peer = owned.get();
  peer->impl = this;
  peer->id = next_peer_++;
  peer->key = ConnectionKey{nonce_, peer->id};
  peer->initiator = true;
  RETURN_IF_ERROR(NewPeerWorker(*peer));
  absl::StatusOr<std::string> own_address = WorkerAddress(peer->worker);
  absl::StatusOr<ucp_ep_h> door_ep =
      own_address.ok() ? CreateEndpoint(peer->worker, door_address, &Impl::OnDoorEndpointError,
                                        peer, absl::StrCat("the door of peer ", peer->id))
                       : own_address.status();
  if (!door_ep.ok()) {
    ucp_worker_destroy(peer->worker);
    return door_ep.status();
  }
  peer->door_ep = *door_ep;
  peers_[peer->id] = std::move(owned);

  // The hello carries the address of this connection's worker, so the peer
  // needs nothing more to open an endpoint to it.
  peer->hello_header = absl::StrCat(ucx_internal::EncodePrefix({peer->key, true}), *own_address);
  peer->hello = std::make_unique<UcxRequest>();
  ucp_request_param_t param = peer->hello->SendParam();
  peer->hello->Start(ucp_am_send_nbx(peer->door_ep, ucx_internal::kHelloAmId,
                                     peer->hello_header.data(), peer->hello_header.size(), nullptr,
                                     0, &param));
  if (peer->hello->done() && peer->hello->status() != UCS_OK) {
    const absl::Status status =
        UcxError(peer->hello->status(), absl::StrCat("introducing ourselves to peer ", peer->id));
    CloseDoorEndpoint(*peer, /*force=*/true);
    peer->disconnected = true;
    return status;
  }
  peer->introduce_by = absl::Now() + options_.connect_timeout;
  return peer->id;
}

bool UcxTransport::Impl::CreateBackEndpoints() {
  bool introduced = false;
  for (PeerId id : std::exchange(new_peers_, {})) {
    Peer* peer = FindPeer(id);
    if (peer == nullptr || peer->failed || peer->back_address.empty()) continue;
    // Only an initiator's connection dropped before its welcome gets here
    // disconnected: it opens only to say goodbye.
    if (peer->disconnected && !peer->initiator) continue;
    absl::Status status;
    if (!peer->initiator) status = NewPeerWorker(*peer);
    absl::StatusOr<ucp_ep_h> ep =
        status.ok() ? CreateEndpoint(peer->worker, peer->back_address, &Impl::OnEndpointError, peer,
                                     absl::StrCat("peer ", id))
                    : status;
    if (!ep.ok()) {
      LOG(WARNING) << ep.status();
      failed_peers_.emplace_back(id, absl::UnavailableError(ep.status().message()));
      continue;
    }
    peer->ep = *ep;
    peer->back_address.clear();
    if (peer->initiator) {
      // Welcomed: the door's part is over.
      CloseDoorEndpoint(*peer, /*force=*/false);
      if (peer->disconnected) {
        SayGoodbye(*peer);
        CloseEndpoint(*peer, /*force=*/false);
      } else {
        introduced = true;
      }
      continue;
    }
    // The welcome names the worker the initiator is to send to from now on.
    absl::StatusOr<std::string> own_address = WorkerAddress(peer->worker);
    if (!own_address.ok()) {
      failed_peers_.emplace_back(id, absl::UnavailableError(own_address.status().message()));
      continue;
    }
    peer->hello_header = absl::StrCat(ucx_internal::EncodePrefix({peer->key, false}), *own_address);
    peer->hello = std::make_unique<UcxRequest>();
    ucp_request_param_t param = peer->hello->SendParam();
    peer->hello->Start(ucp_am_send_nbx(peer->ep, ucx_internal::kWelcomeAmId,
                                       peer->hello_header.data(), peer->hello_header.size(),
                                       nullptr, 0, &param));
  }
  return introduced;
}

void UcxTransport::Impl::CheckIntroductions(absl::Time now) {
  for (auto& [id, peer] : peers_) {
    if (!peer->initiator || peer->failed || peer->ep != nullptr || now < peer->introduce_by) {
      continue;
    }
    if (peer->disconnected) {
      // Dropped before its welcome, which never came either.
      CloseDoorEndpoint(*peer, /*force=*/true);
      continue;
    }
    failed_peers_.emplace_back(
        id, absl::UnavailableError(
                absl::StrCat("peer ", id, " did not answer the introduction within ",
                             absl::FormatDuration(options_.connect_timeout),
                             " (the receiver died, or restarted and has a new address)")));
  }
}

void UcxTransport::Impl::CloseEndpoint(ucp_ep_h& ep, std::unique_ptr<UcxRequest>& close,
                                       bool force) {
  if (ep == nullptr) return;
  close = std::make_unique<UcxRequest>();
  ucp_request_param_t param = close->SendParam();
  param.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
  // Forcing is defined only for endpoints with peer-failure handling.
  param.flags = force && options_.detect_peer_failure ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  // Never blocks: Poll() progresses the close and releases the peer after.
  close->Start(ucp_ep_close_nbx(std::exchange(ep, nullptr), &param));
}

void UcxTransport::Impl::SayGoodbye(Peer& peer) {
  if (peer.ep == nullptr) return;
  peer.bye_header = ucx_internal::EncodePrefix({peer.key, peer.initiator});
  peer.bye = std::make_unique<UcxRequest>();
  ucp_request_param_t param = peer.bye->SendParam();
  peer.bye->Start(ucp_am_send_nbx(peer.ep, ucx_internal::kByeAmId, peer.bye_header.data(),
                                  peer.bye_header.size(), nullptr, 0, &param));
}

void UcxTransport::Impl::Disconnect(PeerId id) {
  Peer* peer = FindPeer(id);
  if (peer == nullptr || peer->disconnected) return;
  peer->disconnected = true;
  const bool waiting_for_welcome = peer->initiator && !peer->failed && peer->ep == nullptr;
  for (auto it = incoming_.begin(); it != incoming_.end();) {
    Incoming& incoming = *it->second;
    if (incoming.peer == id && !incoming.receiving) {
      ReleaseDescriptor(incoming);
      incoming_.erase(it++);
    } else {
      ++it;
    }
  }
  DropQueuedSends(*peer, absl::CancelledError(absl::StrCat("send cancelled: peer ", id,
                                                           " was disconnected before it started")));
  if (!peer->failed) SayGoodbye(*peer);
  // A graceful close flushes first, which never ends while UCX holds sends
  // to a peer that does not answer; forced, it fails them (kSendDone) and
  // lets the endpoint go.
  CloseEndpoint(*peer, /*force=*/peer->in_flight > 0);
  // Not welcomed yet: the door's endpoint stays open until the welcome
  // comes (then the connection opens, says goodbye and closes, so that the
  // acceptor lets go of its worker) or until the introduction's deadline.
  if (!waiting_for_welcome) CloseDoorEndpoint(*peer, /*force=*/true);
}

UcxTransport::Impl::Peer* UcxTransport::Impl::FindPeer(PeerId id) {
  auto it = peers_.find(id);
  return it == peers_.end() ? nullptr : it->second.get();
}

void UcxTransport::Impl::ReleaseClosedPeers() {
  std::vector<PeerId> closed;
  for (const auto& [id, peer] : peers_) {
    if ((!peer->failed && !peer->disconnected) || peer->ep != nullptr || peer->door_ep != nullptr) {
      continue;
    }
    // UCX still holds the record (requests' user data, the error handlers'
    // argument until the closes finish), or sends still name the peer.
    bool busy = peer->in_flight > 0 || !peer->queued.empty();
    for (const auto* request :
         {peer->hello.get(), peer->bye.get(), peer->close.get(), peer->door_close.get()}) {
      if (request != nullptr && !request->done()) busy = true;
    }
    if (!busy) closed.push_back(id);
  }
  if (closed.empty()) return;
  // Messages not yet accepted or discarded, and receives in progress, keep
  // their peer (and its worker) until the caller is done with them.
  absl::flat_hash_set<PeerId> referenced;
  for (const auto& [id, incoming] : incoming_) referenced.insert(incoming->peer);
  for (PeerId id : closed) {
    if (referenced.contains(id)) continue;
    auto it = peers_.find(id);
    Peer& peer = *it->second;
    if (peer.worker != nullptr) ucp_worker_destroy(peer.worker);
    if (!peer.initiator) accepted_.erase(peer.key);
    peers_.erase(it);
  }
}

}  // namespace tandem::kvtransfer
