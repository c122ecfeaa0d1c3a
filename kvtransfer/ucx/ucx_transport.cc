#include "kvtransfer/ucx/ucx_transport.h"

#include <poll.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <random>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "kvtransfer/ucx/ucx_request.h"
#include "kvtransfer/ucx/ucx_wire.h"

namespace tandem::kvtransfer {

using ucx_internal::ConnectionKey;
using ucx_internal::MessagePrefix;
using ucx_internal::UcxError;
using ucx_internal::UcxRequest;

namespace {

TransportEvent Event(TransportEvent::Kind kind, uint64_t id, PeerId peer, absl::Status status) {
  TransportEvent event;
  event.kind = kind;
  event.id = id;
  event.peer = peer;
  event.status = std::move(status);
  return event;
}

}  // namespace

class UcxTransport::Impl {
 public:
  explicit Impl(const UcxTransportOptions& options) : options_(options) {}
  ~Impl();

  absl::Status Init();

  absl::StatusOr<RegionId> RegisterMemory(void* base, size_t length, MemoryKind kind);
  absl::Status DeregisterMemory(RegionId region);
  const std::string& address() const { return address_; }
  absl::StatusOr<PeerId> Connect(std::string_view address);
  void Disconnect(PeerId peer);
  absl::StatusOr<SendId> PostSend(PeerId peer, std::string_view header,
                                  std::span<const Slice> payload);
  absl::Status Accept(IncomingId incoming, std::span<const Slice> destination);
  void Discard(IncomingId incoming);
  void Cancel(SendId send);
  void Poll(std::vector<TransportEvent>& events);
  void WaitForActivity(absl::Time deadline);

 private:
  struct Region {
    char* base;
    size_t length;
    ucp_mem_h memh;
  };

  // Peers live as long as the transport: UCX holds a pointer to one as the
  // argument of its endpoint's error handler.
  struct Peer {
    Impl* impl;
    PeerId id;
    ConnectionKey key;
    bool initiator;
    ucp_ep_h ep = nullptr;
    // Acceptor side: the initiator's worker address, until the endpoint
    // back to it exists.
    std::string back_address;
    // Initiator side: the introduction, kept until sent (UCX 1.13 reads the
    // header of a queued send when it goes out, not when it is posted).
    std::string hello_header;
    std::unique_ptr<UcxRequest> hello;
    bool disconnected = false;
    bool failed = false;
    absl::Status failure;
  };

  struct SendOp {
    explicit SendOp(std::function<void()> on_done) : request(std::move(on_done)) {}
    PeerId peer = 0;
    std::string wire_header;  // UCX may read it until the send finishes.
    std::vector<ucp_dt_iov_t> iov;
    UcxRequest request;
    bool cancelled = false;
    // kSendDone already reported (the peer failed); the record waits only
    // for UCX to let go of the request.
    bool reported = false;
  };

  struct Incoming {
    PeerId peer = 0;
    uint64_t payload_bytes = 0;
    // UCX's eager data or rendezvous descriptor, held until Accept or
    // Discard; null once handed back to UCX.
    void* descriptor = nullptr;
    bool rendezvous = false;
    // Payload copied out of UCX when it could not be kept in place.
    std::string copy;
    bool receiving = false;
    bool reported = false;
    std::vector<ucp_dt_iov_t> iov;
    std::unique_ptr<UcxRequest> request;
  };

  // A contiguous run of registered memory.
  struct Span {
    char* data;
    size_t length;
    ucp_mem_h memh;
  };

  static ucs_status_t OnHello(void* arg, const void* header, size_t header_length, void* data,
                              size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t OnData(void* arg, const void* header, size_t header_length, void* data,
                             size_t length, const ucp_am_recv_param_t* param);
  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);

  absl::Status SetAmHandler(unsigned id, ucp_am_recv_callback_t callback, uint32_t flags);
  absl::StatusOr<ucp_ep_h> CreateEndpoint(std::string_view worker_address, Peer* peer);
  Peer* FindPeer(PeerId id);
  // The peer a message with `prefix` came from, or null when it is unknown.
  Peer* PeerOf(const MessagePrefix& prefix);
  absl::StatusOr<std::vector<Span>> Resolve(std::span<const Slice> slices, uint64_t* total);
  // Fills `param`'s datatype (and memory handle) and returns the buffer and
  // count for a UCP call over `spans`, building `iov` when there are several.
  static std::pair<void*, size_t> Describe(const std::vector<Span>& spans,
                                           std::vector<ucp_dt_iov_t>& iov,
                                           ucp_request_param_t& param);
  void CloseEndpoint(Peer& peer, bool force);
  void ReleaseDescriptor(Incoming& incoming);
  void CreateBackEndpoints();
  void HandleFailedPeers();
  void ReportFinishedSends();
  void ReportFinishedReceives();
  bool HasQueuedWork() const;

  // Constant after Init().
  const UcxTransportOptions options_;
  uint64_t nonce_ = 0;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int event_fd_ = -1;
  std::string address_;

  absl::flat_hash_map<RegionId, Region> regions_;
  RegionId next_region_ = 1;

  absl::flat_hash_map<PeerId, std::unique_ptr<Peer>> peers_;
  absl::flat_hash_map<ConnectionKey, PeerId> accepted_;
  PeerId next_peer_ = 1;
  std::vector<PeerId> new_peers_;
  std::vector<std::pair<PeerId, ucs_status_t>> failed_peers_;

  absl::flat_hash_map<SendId, std::unique_ptr<SendOp>> sends_;
  SendId next_send_ = 1;
  std::vector<SendId> finished_sends_;

  absl::flat_hash_map<IncomingId, std::unique_ptr<Incoming>> incoming_;
  IncomingId next_incoming_ = 1;
  std::vector<IncomingId> finished_receives_;

  std::vector<std::unique_ptr<UcxRequest>> closing_;
  std::vector<TransportEvent> events_;
};

absl::Status UcxTransport::Impl::Init() {
  nonce_ = (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}() ^
           (uint64_t(getpid()) << 16);

  ucp_config_t* config = nullptr;
  RETURN_IF_ERROR(UcxError(ucp_config_read(nullptr, nullptr, &config), "reading UCX_* settings"));
  absl::Status status;
  if (std::getenv("UCX_KEEPALIVE_INTERVAL") == nullptr) {
    const std::string interval =
        absl::StrCat(absl::ToInt64Milliseconds(options_.keepalive_interval), "ms");
    status = UcxError(ucp_config_modify(config, "KEEPALIVE_INTERVAL", interval.c_str()),
                      "setting the UCX keepalive interval");
  }
  if (status.ok()) {
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    params.mt_workers_shared = 0;
    status = UcxError(ucp_init(&params, config, &context_), "creating the UCP context");
  }
  ucp_config_release(config);
  RETURN_IF_ERROR(status);

  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;
  RETURN_IF_ERROR(UcxError(ucp_worker_create(context_, &worker_params, &worker_),
                           "creating the UCP worker"));

  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
  RETURN_IF_ERROR(UcxError(ucp_worker_query(worker_, &attr), "querying the UCP worker"));
  ucp_address_t* worker_address = nullptr;
  size_t worker_address_length = 0;
  RETURN_IF_ERROR(UcxError(
      ucp_worker_get_address(worker_, &worker_address, &worker_address_length),
      "getting the UCP worker address"));
  const std::string_view raw(reinterpret_cast<const char*>(worker_address), worker_address_length);
  address_ = ucx_internal::EncodeAddress(raw);
  ucp_worker_release_address(worker_, worker_address);
  const size_t needed = MessagePrefix::kEncodedBytes +
                        std::max(KvTransport::kMaxHeaderBytes, worker_address_length);
  if (attr.max_am_header < needed) {
    return absl::FailedPreconditionError(
        absl::StrCat("UCX allows active-message headers of ", attr.max_am_header,
                     " bytes; the transport needs ", needed));
  }

  RETURN_IF_ERROR(SetAmHandler(ucx_internal::kHelloAmId, &Impl::OnHello, UCP_AM_FLAG_WHOLE_MSG));
  RETURN_IF_ERROR(SetAmHandler(ucx_internal::kDataAmId, &Impl::OnData,
                               UCP_AM_FLAG_WHOLE_MSG | UCP_AM_FLAG_PERSISTENT_DATA));
  return UcxError(ucp_worker_get_efd(worker_, &event_fd_),
                  "getting the UCP worker's event file descriptor");
}

absl::Status UcxTransport::Impl::SetAmHandler(unsigned id, ucp_am_recv_callback_t callback,
                                              uint32_t flags) {
  ucp_am_handler_param_t param{};
  param.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                     UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  param.id = id;
  param.flags = flags;
  param.cb = callback;
  param.arg = this;
  return UcxError(ucp_worker_set_am_recv_handler(worker_, &param),
                  absl::StrCat("setting the handler of active message ", id));
}

UcxTransport::Impl::~Impl() {
  if (worker_ != nullptr) {
    // Hand held messages back first: a rendezvous sender's request finishes
    // only when the receiver takes or drops the data, and the flush below
    // would wait for it.
    for (auto& [id, incoming] : incoming_) ReleaseDescriptor(*incoming);
    for (auto& [id, peer] : peers_) CloseEndpoint(*peer, /*force=*/false);
    const absl::Time deadline = absl::Now() + options_.close_timeout;
    for (const auto& request : closing_) {
      const absl::Status status =
          ucx_internal::WaitForRequest(worker_, *request, deadline, "closing a UCX endpoint");
      if (absl::IsDeadlineExceeded(status)) {
        LOG(WARNING) << status << "; destroying the worker regardless";
        break;
      }
    }
    for (const auto& request : closing_) request->Abandon();
    for (auto& [id, op] : sends_) op->request.Abandon();
    for (auto& [id, incoming] : incoming_) {
      if (incoming->request != nullptr) incoming->request->Abandon();
    }
    for (auto& [id, peer] : peers_) {
      if (peer->hello != nullptr) peer->hello->Abandon();
    }
    ucp_worker_destroy(worker_);
  }
  // Requests UCX still held were finished or dropped with the worker; only
  // now may the records their callbacks point to go.
  closing_.clear();
  sends_.clear();
  incoming_.clear();
  for (auto& [id, region] : regions_) ucp_mem_unmap(context_, region.memh);
  if (context_ != nullptr) ucp_cleanup(context_);
}

absl::StatusOr<RegionId> UcxTransport::Impl::RegisterMemory(void* base, size_t length,
                                                            MemoryKind kind) {
  if (kind == MemoryKind::kCuda) {
    return absl::UnimplementedError(
        "UcxTransport cannot register CUDA memory: Debian's UCX 1.13 is built without CUDA "
        "transports; stage GPU KV through pinned host memory");
  }
  if (base == nullptr || length == 0) {
    return absl::InvalidArgumentError("RegisterMemory needs a non-null base and a non-zero length");
  }
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  params.address = base;
  params.length = length;
  ucp_mem_h memh = nullptr;
  RETURN_IF_ERROR(UcxError(ucp_mem_map(context_, &params, &memh),
                           absl::StrCat("registering ", length, " bytes of host memory")));
  const RegionId id = next_region_++;
  regions_[id] = Region{static_cast<char*>(base), length, memh};
  return id;
}

absl::Status UcxTransport::Impl::DeregisterMemory(RegionId region) {
  auto it = regions_.find(region);
  if (it == regions_.end()) {
    return absl::NotFoundError(absl::StrCat("no registered region ", region));
  }
  const ucs_status_t status = ucp_mem_unmap(context_, it->second.memh);
  regions_.erase(it);
  return UcxError(status, absl::StrCat("deregistering region ", region));
}

absl::StatusOr<ucp_ep_h> UcxTransport::Impl::CreateEndpoint(std::string_view worker_address,
                                                            Peer* peer) {
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  params.address = reinterpret_cast<const ucp_address_t*>(worker_address.data());
  params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
  if (options_.detect_peer_failure) {
    params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &Impl::OnEndpointError;
    params.err_handler.arg = peer;
  }
  ucp_ep_h ep = nullptr;
  RETURN_IF_ERROR(UcxError(ucp_ep_create(worker_, &params, &ep),
                           absl::StrCat("creating a UCX endpoint for peer ", peer->id)));
  return ep;
}

absl::StatusOr<PeerId> UcxTransport::Impl::Connect(std::string_view address) {
  ASSIGN_OR_RETURN(std::string_view worker_address, ucx_internal::DecodeAddress(address));
  auto owned = std::make_unique<Peer>();
  Peer* peer = owned.get();
  peer->impl = this;
  peer->id = next_peer_++;
  peer->key = ConnectionKey{nonce_, peer->id};
  peer->initiator = true;
  ASSIGN_OR_RETURN(peer->ep, CreateEndpoint(worker_address, peer));
  peers_[peer->id] = std::move(owned);

  // The hello carries our address in its header, so the peer needs nothing
  // more to open an endpoint back.
  ASSIGN_OR_RETURN(std::string_view own_address, ucx_internal::DecodeAddress(address_));
  peer->hello_header =
      absl::StrCat(ucx_internal::EncodePrefix({peer->key, true}), std::string(own_address));
  peer->hello = std::make_unique<UcxRequest>();
  ucp_request_param_t param = peer->hello->SendParam();
  peer->hello->Start(ucp_am_send_nbx(peer->ep, ucx_internal::kHelloAmId,
                                     peer->hello_header.data(), peer->hello_header.size(),
                                     nullptr, 0, &param));
  if (peer->hello->done() && peer->hello->status() != UCS_OK) {
    const absl::Status status =
        UcxError(peer->hello->status(), absl::StrCat("introducing ourselves to peer ", peer->id));
    CloseEndpoint(*peer, /*force=*/true);
    peer->disconnected = true;
    return status;
  }
  return peer->id;
}

void UcxTransport::Impl::CloseEndpoint(Peer& peer, bool force) {
  if (peer.ep == nullptr) return;
  auto request = std::make_unique<UcxRequest>();
  ucp_request_param_t param = request->SendParam();
  param.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  request->Start(ucp_ep_close_nbx(peer.ep, &param));
  peer.ep = nullptr;
  if (!request->done()) closing_.push_back(std::move(request));
}

void UcxTransport::Impl::Disconnect(PeerId id) {
  Peer* peer = FindPeer(id);
  if (peer == nullptr || peer->disconnected) return;
  peer->disconnected = true;
  for (auto it = incoming_.begin(); it != incoming_.end();) {
    Incoming& incoming = *it->second;
    if (incoming.peer == id && !incoming.receiving) {
      ReleaseDescriptor(incoming);
      incoming_.erase(it++);
    } else {
      ++it;
    }
  }
  CloseEndpoint(*peer, /*force=*/false);
}

UcxTransport::Impl::Peer* UcxTransport::Impl::FindPeer(PeerId id) {
  auto it = peers_.find(id);
  return it == peers_.end() ? nullptr : it->second.get();
}

UcxTransport::Impl::Peer* UcxTransport::Impl::PeerOf(const MessagePrefix& prefix) {
  if (prefix.from_initiator) {
    auto it = accepted_.find(prefix.key);
    return it == accepted_.end() ? nullptr : FindPeer(it->second);
  }
  if (prefix.key.initiator_nonce != nonce_) return nullptr;
  return FindPeer(prefix.key.initiator_peer);
}

absl::StatusOr<std::vector<UcxTransport::Impl::Span>> UcxTransport::Impl::Resolve(
    std::span<const Slice> slices, uint64_t* total) {
  std::vector<Span> spans;
  spans.reserve(slices.size());
  *total = 0;
  for (const Slice& slice : slices) {
    auto it = regions_.find(slice.region);
    if (it == regions_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("slice names unregistered region ",
                                                     slice.region));
    }
    const Region& region = it->second;
    if (slice.offset > region.length || slice.length > region.length - slice.offset) {
      return absl::InvalidArgumentError(
          absl::StrCat("slice [", slice.offset, ", +", slice.length, ") lies outside region ",
                       slice.region, " of ", region.length, " bytes"));
    }
    *total += slice.length;
    if (slice.length > 0) spans.push_back({region.base + slice.offset, slice.length, region.memh});
  }
  return spans;
}

std::pair<void*, size_t> UcxTransport::Impl::Describe(const std::vector<Span>& spans,
                                                      std::vector<ucp_dt_iov_t>& iov,
                                                      ucp_request_param_t& param) {
  if (spans.empty()) return {nullptr, 0};
  if (spans.size() == 1) {
    // Contiguous: the fast rendezvous path, and UCX may skip registering.
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    param.memh = spans[0].memh;
    return {spans[0].data, spans[0].length};
  }
  iov.reserve(spans.size());
  for (const Span& span : spans) iov.push_back({span.data, span.length});
  param.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
  param.datatype = ucp_dt_make_iov();
  return {iov.data(), iov.size()};
}

absl::StatusOr<SendId> UcxTransport::Impl::PostSend(PeerId id, std::string_view header,
                                                    std::span<const Slice> payload) {
  Peer* peer = FindPeer(id);
  if (peer == nullptr) return absl::NotFoundError(absl::StrCat("no peer ", id));
  if (peer->failed) return peer->failure;
  if (peer->disconnected || peer->ep == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("peer ", id, " is disconnected"));
  }
  if (header.size() > KvTransport::kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("header of ", header.size(),
                                                   " bytes exceeds the limit of ",
                                                   KvTransport::kMaxHeaderBytes));
  }
  uint64_t total = 0;
  ASSIGN_OR_RETURN(std::vector<Span> spans, Resolve(payload, &total));

  const SendId send_id = next_send_++;
  auto op = std::make_unique<SendOp>([this, send_id] { finished_sends_.push_back(send_id); });
  op->peer = id;
  op->wire_header = absl::StrCat(ucx_internal::EncodePrefix({peer->key, peer->initiator}), std::string(header));
  ucp_request_param_t param = op->request.SendParam();
  const auto [buffer, count] = Describe(spans, op->iov, param);
  op->request.Start(ucp_am_send_nbx(peer->ep, ucx_internal::kDataAmId, op->wire_header.data(),
                                    op->wire_header.size(), buffer, count, &param));
  if (op->request.done() && op->request.status() != UCS_OK) {
    finished_sends_.pop_back();
    return UcxError(op->request.status(), absl::StrCat("sending ", total, " bytes to peer ", id));
  }
  sends_[send_id] = std::move(op);
  return send_id;
}

absl::Status UcxTransport::Impl::Accept(IncomingId id, std::span<const Slice> destination) {
  auto it = incoming_.find(id);
  if (it == incoming_.end()) {
    return absl::NotFoundError(absl::StrCat("no pending incoming message ", id));
  }
  Incoming& incoming = *it->second;
  if (incoming.receiving) {
    return absl::FailedPreconditionError(absl::StrCat("incoming message ", id,
                                                      " was already accepted"));
  }
  if (Peer* peer = FindPeer(incoming.peer); peer != nullptr && peer->failed) {
    const absl::Status failure = peer->failure;
    incoming_.erase(it);
    return failure;
  }
  uint64_t total = 0;
  ASSIGN_OR_RETURN(std::vector<Span> spans, Resolve(destination, &total));
  if (total != incoming.payload_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("destination of ", total, " bytes for incoming message ", id, " carrying ",
                     incoming.payload_bytes));
  }
  if (!incoming.rendezvous) {
    // Eager data is already here: copy it out and hand the buffer back.
    // (ucp_am_recv_data_nbx on eager data does not return the buffer to
    // UCX's pool in 1.13.)
    const char* data = incoming.descriptor != nullptr
                           ? static_cast<const char*>(incoming.descriptor)
                           : incoming.copy.data();
    size_t at = 0;
    for (const Span& span : spans) {
      std::memcpy(span.data, data + at, span.length);
      at += span.length;
    }
    ReleaseDescriptor(incoming);
    events_.push_back(Event(TransportEvent::Kind::kReceiveDone, id, incoming.peer, absl::OkStatus()));
    incoming_.erase(it);
    return absl::OkStatus();
  }
  incoming.receiving = true;
  incoming.request =
      std::make_unique<UcxRequest>([this, id] { finished_receives_.push_back(id); });
  ucp_request_param_t param = incoming.request->AmReceiveParam();
  const auto [buffer, count] = Describe(spans, incoming.iov, param);
  void* descriptor = std::exchange(incoming.descriptor, nullptr);  // UCX owns it from here.
  incoming.request->Start(ucp_am_recv_data_nbx(worker_, descriptor, buffer, count, &param));
  return absl::OkStatus();
}

void UcxTransport::Impl::ReleaseDescriptor(Incoming& incoming) {
  if (incoming.descriptor != nullptr) {
    ucp_am_data_release(worker_, std::exchange(incoming.descriptor, nullptr));
  }
}

void UcxTransport::Impl::Discard(IncomingId id) {
  auto it = incoming_.find(id);
  if (it == incoming_.end() || it->second->receiving) return;
  ReleaseDescriptor(*it->second);
  incoming_.erase(it);
}

void UcxTransport::Impl::Cancel(SendId id) {
  auto it = sends_.find(id);
  if (it != sends_.end() && !it->second->request.done()) it->second->cancelled = true;
}

ucs_status_t UcxTransport::Impl::OnHello(void* arg, const void* header, size_t header_length,
                                         void* /*data*/, size_t /*length*/,
                                         const ucp_am_recv_param_t* /*param*/) {
  auto* self = static_cast<Impl*>(arg);
  const std::string_view bytes(static_cast<const char*>(header), header_length);
  absl::StatusOr<MessagePrefix> prefix = ucx_internal::DecodePrefix(bytes);
  if (!prefix.ok() || !prefix->from_initiator) {
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
  // Creating an endpoint from inside a UCX callback is not allowed; Poll()
  // does it right after progress, before the caller sees the peer.
  self->new_peers_.push_back(peer->id);
  self->peers_[peer->id] = std::move(peer);
  return UCS_OK;
}

ucs_status_t UcxTransport::Impl::OnData(void* arg, const void* header, size_t header_length,
                                        void* data, size_t length,
                                        const ucp_am_recv_param_t* param) {
  auto* self = static_cast<Impl*>(arg);
  const bool rendezvous = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  const std::string_view bytes(static_cast<const char*>(header), header_length);
  absl::StatusOr<MessagePrefix> prefix = ucx_internal::DecodePrefix(bytes);
  Peer* peer = prefix.ok() ? self->PeerOf(*prefix) : nullptr;
  if (peer == nullptr || peer->failed || peer->disconnected) {
    // Unknown or gone: drop it; a rendezvous sender learns it was refused.
    return rendezvous ? UCS_ERR_REJECTED : UCS_OK;
  }
  const IncomingId id = self->next_incoming_++;
  auto incoming = std::make_unique<Incoming>();
  incoming->peer = peer->id;
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
  event.header = std::string(bytes.substr(MessagePrefix::kEncodedBytes));
  event.payload_bytes = length;
  self->events_.push_back(std::move(event));
  self->incoming_[id] = std::move(incoming);
  return keep;
}

void UcxTransport::Impl::OnEndpointError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* peer = static_cast<Peer*>(arg);
  peer->impl->failed_peers_.emplace_back(peer->id, status);
}

void UcxTransport::Impl::CreateBackEndpoints() {
  for (PeerId id : std::exchange(new_peers_, {})) {
    Peer* peer = FindPeer(id);
    absl::StatusOr<ucp_ep_h> ep = CreateEndpoint(peer->back_address, peer);
    if (ep.ok()) {
      peer->ep = *ep;
      peer->back_address.clear();
    } else {
      LOG(WARNING) << ep.status();
      failed_peers_.emplace_back(id, UCS_ERR_UNREACHABLE);
    }
  }
}

void UcxTransport::Impl::HandleFailedPeers() {
  for (const auto& [id, ucs_status] : std::exchange(failed_peers_, {})) {
    Peer* peer = FindPeer(id);
    if (peer == nullptr || peer->failed || peer->disconnected) continue;
    peer->failed = true;
    peer->failure = UcxError(ucs_status, absl::StrCat("UCX connection to peer ", id));
    if (peer->failure.code() != absl::StatusCode::kUnavailable) {
      peer->failure = absl::UnavailableError(peer->failure.message());
    }
    // Force: a dead peer acknowledges nothing. Pending sends finish now with
    // UCS_ERR_CANCELED, or are reported below if UCX still holds them.
    CloseEndpoint(*peer, /*force=*/true);
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
        events_.push_back(Event(TransportEvent::Kind::kReceiveDone, incoming_id, id, peer->failure));
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
    if (!op.reported) {
      const Peer* peer = FindPeer(op.peer);
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
        status = absl::DataLossError(absl::StrCat(
            "incoming message ", id, " delivered ", incoming.request->received_length(),
            " of its ", incoming.payload_bytes, " bytes"));
      } else {
        status = UcxError(ucs_status, absl::StrCat("receiving message ", id, " from peer ",
                                                   incoming.peer));
      }
      events_.push_back(Event(TransportEvent::Kind::kReceiveDone, id, incoming.peer, std::move(status)));
    }
    incoming_.erase(it);
  }
}

void UcxTransport::Impl::Poll(std::vector<TransportEvent>& events) {
  // Bounded, so that a steady stream of arrivals cannot keep Poll() busy.
  for (int i = 0; i < 64 && ucp_worker_progress(worker_) != 0; ++i) {
  }
  CreateBackEndpoints();
  HandleFailedPeers();
  ReportFinishedSends();
  ReportFinishedReceives();
  std::erase_if(closing_, [](const auto& request) { return request->done(); });
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
  if (HasQueuedWork() || ucp_worker_progress(worker_) != 0 || HasQueuedWork()) return;
  // UCX_BUSY: events arrived between the progress call and arming.
  if (ucp_worker_arm(worker_) != UCS_OK) return;
  // Keepalive and some transports advance only inside progress, so a long
  // sleep is cut short; callers loop until their own deadline anyway.
  constexpr absl::Duration kMaxSleep = absl::Milliseconds(50);
  const absl::Duration wait = std::clamp(deadline - absl::Now(), absl::ZeroDuration(), kMaxSleep);
  pollfd fd{event_fd_, POLLIN, 0};
  ::poll(&fd, 1, static_cast<int>(absl::ToInt64Milliseconds(absl::Ceil(wait, absl::Milliseconds(1)))));
}

UcxTransport::UcxTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
UcxTransport::~UcxTransport() = default;

absl::StatusOr<std::unique_ptr<UcxTransport>> UcxTransport::Create(
    const UcxTransportOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<UcxTransport>(new UcxTransport(std::move(impl)));
}

absl::StatusOr<RegionId> UcxTransport::RegisterMemory(void* base, size_t length,
                                                      MemoryKind kind) {
  return impl_->RegisterMemory(base, length, kind);
}
absl::Status UcxTransport::DeregisterMemory(RegionId region) {
  return impl_->DeregisterMemory(region);
}
std::string UcxTransport::LocalAddress() const { return impl_->address(); }
absl::StatusOr<PeerId> UcxTransport::Connect(std::string_view address) {
  return impl_->Connect(address);
}
void UcxTransport::Disconnect(PeerId peer) { impl_->Disconnect(peer); }
absl::StatusOr<SendId> UcxTransport::PostSend(PeerId peer, std::string_view header,
                                              std::span<const Slice> payload) {
  return impl_->PostSend(peer, header, payload);
}
absl::Status UcxTransport::Accept(IncomingId incoming, std::span<const Slice> destination) {
  return impl_->Accept(incoming, destination);
}
void UcxTransport::Discard(IncomingId incoming) { impl_->Discard(incoming); }
void UcxTransport::Cancel(SendId send) { impl_->Cancel(send); }
void UcxTransport::Poll(std::vector<TransportEvent>& events) { impl_->Poll(events); }
void UcxTransport::WaitForActivity(absl::Time deadline) { impl_->WaitForActivity(deadline); }

std::string UcxTransport::Description() const {
  const char* tls = std::getenv("UCX_TLS");
  return absl::StrCat("UCX ", ucp_get_version_string(), " UCX_TLS=", tls != nullptr ? tls : "all");
}

}  // namespace tandem::kvtransfer
