#include "kvtransfer/ucx/ucx_transport.h"

#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <random>
#include <utility>

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

TransportEvent UcxTransport::Impl::Event(TransportEvent::Kind kind, uint64_t id, PeerId peer,
                                         absl::Status status) {
  TransportEvent event;
  event.kind = kind;
  event.id = id;
  event.peer = peer;
  event.status = std::move(status);
  return event;
}

namespace {

// Whether UCX_TLS leaves any of `transports` allowed (UCX warns about
// settings for transports it does not load).
bool MayUse(std::initializer_list<std::string_view> transports) {
  const char* tls = std::getenv("UCX_TLS");
  if (tls == nullptr) return true;
  const std::string_view list(tls);
  for (std::string_view word : {"all", "^", "sm", "shm"}) {
    if (list.find(word) != std::string_view::npos) return true;
  }
  for (std::string_view word : transports) {
    if (list.find(word) != std::string_view::npos) return true;
  }
  return false;
}

// The names of the memory types in `types` (UCS_BIT(ucs_memory_type_t)
// each), as UCX spells them: "host,cuda".
std::string MemoryTypeNames(uint64_t types) {
  std::string names;
  for (int t = UCS_MEMORY_TYPE_HOST; t < UCS_MEMORY_TYPE_LAST; ++t) {
    if ((types & UCS_BIT(t)) == 0) continue;
    absl::StrAppend(&names, names.empty() ? "" : ",", ucs_memory_type_names[t]);
  }
  return names.empty() ? "none" : names;
}

// Sets environment variables that are unset for as long as it lives, then
// removes them again, so that processes started later do not inherit them.
class ScopedEnvDefaults {
 public:
  ScopedEnvDefaults() = default;
  ScopedEnvDefaults(const ScopedEnvDefaults&) = delete;
  ScopedEnvDefaults& operator=(const ScopedEnvDefaults&) = delete;
  ~ScopedEnvDefaults() {
    for (const std::string& name : added_) unsetenv(name.c_str());
  }
  void Set(const char* name, const char* value) {
    if (std::getenv(name) == nullptr && setenv(name, value, /*overwrite=*/0) == 0) {
      added_.emplace_back(name);
    }
  }

 private:
  std::vector<std::string> added_;
};

// Settings of UCX's shared-memory interfaces (posix, sysv), which UCX reads
// each time a worker is created: given to ucp_config_modify, which applies
// them to every worker of the context, unless the environment sets them.
// - ERROR_HANDLING: UCX 1.13 keeps these transports away from endpoints with
//   peer-failure handling unless it is on; with it such endpoints get the
//   full shared-memory bandwidth, and a dead peer is found by keepalive.
// - RX_BUFS_GROW: each interface sets aside this many 8 KiB receive buffers
//   at once (UCX grows the pool as it needs); UCX's 512 made a worker take
//   15 ms to create, 16 take 4.
struct SharedMemorySetting {
  const char* key;  // For ucp_config_modify: UCX's name after "UCX_POSIX_".
  const char* value;
};
constexpr SharedMemorySetting kSharedMemorySettings[] = {
    {"ERROR_HANDLING", "y"},
    {"RX_BUFS_GROW", "16"},
};

// UCX's transports unless UCX_TLS names them: all but posix shared memory.
// Every connection has a worker of its own, and a posix interface holds
// seven descriptors and its segments under /dev/shm (64 MiB in a default
// container) for each, where sysv's hold none; the two move messages the
// same way.
constexpr char kDefaultTransports[] = "^posix";

bool SetInEnvironment(std::string_view key) {
  for (const char* prefix : {"UCX_POSIX_", "UCX_SYSV_", "UCX_MM_"}) {
    if (std::getenv(absl::StrCat(prefix, std::string(key)).c_str()) != nullptr) return true;
  }
  return false;
}

}  // namespace

absl::Status UcxTransport::Impl::Init() {
  if (options_.max_sends_in_flight < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_sends_in_flight is ", options_.max_sends_in_flight, "; it must be at least 1"));
  }
  nonce_ = (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}() ^
           (uint64_t(getpid()) << 16);

  // The shared-memory copy's memory-invalidation support, which peer-failure
  // handling needs, is read from the environment only, when the context
  // opens its memory domains below.
  ScopedEnvDefaults env;
  if (options_.detect_peer_failure && MayUse({"cma"})) {
    env.Set("UCX_CMA_MEMORY_INVALIDATE", "y");
  }
  ucp_config_t* config = nullptr;
  RETURN_IF_ERROR(UcxError(ucp_config_read(nullptr, nullptr, &config), "reading UCX_* settings"));
  absl::Status status;
  if (std::getenv("UCX_KEEPALIVE_INTERVAL") == nullptr) {
    const std::string interval =
        absl::StrCat(absl::ToInt64Milliseconds(options_.keepalive_interval), "ms");
    status = UcxError(ucp_config_modify(config, "KEEPALIVE_INTERVAL", interval.c_str()),
                      "setting the UCX keepalive interval");
  }
  if (status.ok() && std::getenv("UCX_TLS") == nullptr) {
    status =
        UcxError(ucp_config_modify(config, "TLS", kDefaultTransports), "setting UCX's transports");
  }
  if (MayUse({"posix", "sysv", "mm"})) {
    for (const auto& [key, value] : kSharedMemorySettings) {
      if (!status.ok() || SetInEnvironment(key)) continue;
      status = UcxError(ucp_config_modify(config, absl::StrCat("MM_", key).c_str(), value),
                        absl::StrCat("setting UCX's shared-memory ", key, " to ", value));
    }
  }
  if (status.ok() && !options_.net_devices.empty()) {
    status =
        UcxError(ucp_config_modify(config, "NET_DEVICES", options_.net_devices.c_str()),
                 absl::StrCat("setting the UCX network devices to '", options_.net_devices, "'"));
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
  // Which memory this UCX build can move (host only without its CUDA
  // transports), so that the workers can say how their KV reaches it.
  ucp_context_attr_t context_attr{};
  context_attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  RETURN_IF_ERROR(UcxError(ucp_context_query(context_, &context_attr),
                           "querying the memory types of the UCP context"));
  memory_types_ = context_attr.memory_types;

  RETURN_IF_ERROR(OpenDoor());
  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
  RETURN_IF_ERROR(UcxError(ucp_worker_query(door_.worker, &attr), "querying the UCP worker"));
  max_am_header_ = attr.max_am_header;
  const size_t needed = MessagePrefix::kEncodedBytes +
                        std::max(KvTransport::kMaxHeaderBytes, door_.raw_address.size());
  if (max_am_header_ < needed) {
    return absl::FailedPreconditionError(absl::StrCat("UCX allows active-message headers of ",
                                                      max_am_header_,
                                                      " bytes; the transport needs ", needed));
  }
  return absl::OkStatus();
}

absl::StatusOr<ucp_worker_h> UcxTransport::Impl::NewWorker(std::span<const HandlerSpec> handlers,
                                                           void* arg, int* event_fd) {
  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h worker = nullptr;
  RETURN_IF_ERROR(
      UcxError(ucp_worker_create(context_, &worker_params, &worker), "creating a UCP worker"));
  absl::Status status;
  for (const HandlerSpec& handler : handlers) {
    ucp_am_handler_param_t param{};
    param.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                       UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    param.id = handler.id;
    param.flags = handler.flags;
    param.cb = handler.callback;
    param.arg = arg;
    status = UcxError(ucp_worker_set_am_recv_handler(worker, &param),
                      absl::StrCat("setting the handler of active message ", handler.id));
    if (!status.ok()) break;
  }
  if (status.ok()) {
    status = UcxError(ucp_worker_get_efd(worker, event_fd),
                      "getting a UCP worker's event file descriptor");
  }
  if (!status.ok()) {
    ucp_worker_destroy(worker);
    return status;
  }
  return worker;
}

absl::StatusOr<std::string> UcxTransport::Impl::WorkerAddress(ucp_worker_h worker) {
  ucp_address_t* address = nullptr;
  size_t length = 0;
  RETURN_IF_ERROR(UcxError(ucp_worker_get_address(worker, &address, &length),
                           "getting a UCP worker's address"));
  std::string bytes(reinterpret_cast<const char*>(address), length);
  ucp_worker_release_address(worker, address);
  return bytes;
}

UcxTransport::Impl::~Impl() {
  // Hand held messages back first: a rendezvous sender's request finishes
  // only when the receiver takes or drops the data, and the flush below
  // would wait for it.
  for (auto& [id, incoming] : incoming_) ReleaseDescriptor(*incoming);
  for (auto& [id, peer] : peers_) {
    if (!peer->failed && !peer->disconnected) SayGoodbye(*peer);
    CloseEndpoint(*peer, /*force=*/false);
    CloseDoorEndpoint(*peer, /*force=*/true);
  }
  const auto closed = [this] {
    for (const auto& [id, peer] : peers_) {
      for (const auto* request : {peer->close.get(), peer->door_close.get()}) {
        if (request != nullptr && !request->done()) return false;
      }
    }
    return true;
  };
  const absl::Time deadline = absl::Now() + options_.close_timeout;
  while (!closed() && absl::Now() < deadline) ProgressAll();
  if (!closed()) {
    // An endpoint that did not flush may still hold operations in a
    // transport's queue, and UCX aborts the process when it destroys a
    // worker with such an endpoint (it purges them through handlers that
    // accept none). Nothing progresses these workers again, so no callback
    // reaches the records cleared below; the workers, registrations and the
    // context are left as they are, a bounded leak on a path taken only
    // when a peer stops answering during shutdown.
    LOG(WARNING) << "UCX endpoints did not close within " << options_.close_timeout
                 << "; leaving the UCX workers to the process's exit";
    sends_.clear();
    incoming_.clear();
    peers_.clear();
    return;
  }
  for (auto& [id, op] : sends_) op->request.Abandon();
  for (auto& [id, incoming] : incoming_) {
    if (incoming->request != nullptr) incoming->request->Abandon();
  }
  for (auto& [id, peer] : peers_) {
    for (auto* request : {peer->hello.get(), peer->bye.get(), peer->close.get()}) {
      if (request != nullptr) request->Abandon();
    }
    if (peer->worker != nullptr) ucp_worker_destroy(peer->worker);
  }
  DestroyDoor(door_);
  CloseDoors(absl::InfiniteFuture(), /*all=*/true);
  // Requests UCX still held were finished or dropped with the workers; only
  // now may the records their callbacks point to go.
  sends_.clear();
  incoming_.clear();
  peers_.clear();
  for (auto& [id, region] : regions_) ucp_mem_unmap(context_, region.memh);
  if (context_ != nullptr) ucp_cleanup(context_);
}

absl::StatusOr<RegionId> UcxTransport::Impl::RegisterMemory(void* base, size_t length,
                                                            MemoryKind kind) {
  if (kind == MemoryKind::kCuda) {
    return absl::UnimplementedError(absl::StrCat(
        "UcxTransport does not register CUDA memory (this UCX supports ",
        MemoryTypeNames(memory_types_), "); stage GPU KV through page-locked host memory"));
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

absl::StatusOr<std::vector<UcxTransport::Impl::Span>> UcxTransport::Impl::Resolve(
    std::span<const Slice> slices, uint64_t* total) {
  std::vector<Span> spans;
  spans.reserve(slices.size());
  *total = 0;
  for (const Slice& slice : slices) {
    auto it = regions_.find(slice.region);
    if (it == regions_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("slice names unregistered region ", slice.region));
    }
    const Region& region = it->second;
    if (slice.offset > region.length || slice.length > region.length - slice.offset) {
      return absl::InvalidArgumentError(absl::StrCat("slice [", slice.offset, ", +", slice.length,
                                                     ") lies outside region ", slice.region, " of ",
                                                     region.length, " bytes"));
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
  if (peer == nullptr && id > 0 && id < next_peer_) {
    return absl::UnavailableError(
        absl::StrCat("peer ", id, " is closed: it failed or was disconnected"));
  }
  if (peer == nullptr) return absl::NotFoundError(absl::StrCat("no peer ", id));
  if (peer->failed) return peer->failure;
  if (peer->disconnected) {
    return absl::FailedPreconditionError(absl::StrCat("peer ", id, " is disconnected"));
  }
  if (header.size() > KvTransport::kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "header of ", header.size(), " bytes exceeds the limit of ", KvTransport::kMaxHeaderBytes));
  }
  uint64_t total = 0;
  ASSIGN_OR_RETURN(std::vector<Span> spans, Resolve(payload, &total));

  const SendId send_id = next_send_++;
  auto op = std::make_unique<SendOp>([this, send_id] { finished_sends_.push_back(send_id); });
  op->peer = id;
  op->wire_header =
      absl::StrCat(ucx_internal::EncodePrefix({peer->key, peer->initiator}), std::string(header));
  op->spans = std::move(spans);
  SendOp& posted = *op;
  sends_[send_id] = std::move(op);
  // Behind earlier queued sends even when there is room: order is kept.
  // Before the welcome there is no endpoint yet.
  if (peer->ep == nullptr || peer->in_flight >= options_.max_sends_in_flight ||
      !peer->queued.empty()) {
    peer->queued.push_back(send_id);
    return send_id;
  }
  StartSend(*peer, posted);
  if (posted.request.done() && posted.request.status() != UCS_OK) {
    finished_sends_.pop_back();
    --peer->in_flight;
    const absl::Status status =
        UcxError(posted.request.status(), absl::StrCat("sending ", total, " bytes to peer ", id));
    sends_.erase(send_id);
    return status;
  }
  return send_id;
}

void UcxTransport::Impl::StartSend(Peer& peer, SendOp& op) {
  ucp_request_param_t param = op.request.SendParam();
  const auto [buffer, count] = Describe(op.spans, op.iov, param);
  op.started = true;
  ++peer.in_flight;
  op.request.Start(ucp_am_send_nbx(peer.ep, ucx_internal::kDataAmId, op.wire_header.data(),
                                   op.wire_header.size(), buffer, count, &param));
}

void UcxTransport::Impl::StartQueuedSends() {
  for (auto& [peer_id, peer] : peers_) {
    while (!peer->queued.empty() && peer->in_flight < options_.max_sends_in_flight &&
           peer->ep != nullptr && !peer->failed && !peer->disconnected) {
      const SendId id = peer->queued.front();
      peer->queued.pop_front();
      auto it = sends_.find(id);
      if (it != sends_.end()) StartSend(*peer, *it->second);
    }
  }
}

void UcxTransport::Impl::DropQueuedSends(Peer& peer, const absl::Status& status) {
  for (SendId id : std::exchange(peer.queued, {})) {
    if (sends_.erase(id) > 0) {
      events_.push_back(Event(TransportEvent::Kind::kSendDone, id, peer.id, status));
    }
  }
}

absl::Status UcxTransport::Impl::Accept(IncomingId id, std::span<const Slice> destination) {
  auto it = incoming_.find(id);
  if (it == incoming_.end()) {
    return absl::NotFoundError(absl::StrCat("no pending incoming message ", id));
  }
  Incoming& incoming = *it->second;
  if (incoming.receiving) {
    return absl::FailedPreconditionError(
        absl::StrCat("incoming message ", id, " was already accepted"));
  }
  if (Peer* peer = FindPeer(incoming.peer); peer != nullptr && peer->failed) {
    const absl::Status failure = peer->failure;
    incoming_.erase(it);
    return failure;
  }
  uint64_t total = 0;
  ASSIGN_OR_RETURN(std::vector<Span> spans, Resolve(destination, &total));
  if (total != incoming.payload_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("destination of ", total,
                                                   " bytes for incoming message ", id, " carrying ",
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
    events_.push_back(
        Event(TransportEvent::Kind::kReceiveDone, id, incoming.peer, absl::OkStatus()));
    incoming_.erase(it);
    return absl::OkStatus();
  }
  incoming.receiving = true;
  incoming.request = std::make_unique<UcxRequest>([this, id] { finished_receives_.push_back(id); });
  ucp_request_param_t param = incoming.request->AmReceiveParam();
  const auto [buffer, count] = Describe(spans, incoming.iov, param);
  void* descriptor = std::exchange(incoming.descriptor, nullptr);  // UCX owns it from here.
  incoming.request->Start(ucp_am_recv_data_nbx(incoming.worker, descriptor, buffer, count, &param));
  return absl::OkStatus();
}

void UcxTransport::Impl::ReleaseDescriptor(Incoming& incoming) {
  if (incoming.descriptor != nullptr) {
    ucp_am_data_release(incoming.worker, std::exchange(incoming.descriptor, nullptr));
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
  if (it == sends_.end()) return;
  SendOp& op = *it->second;
  if (op.started) {
    if (!op.request.done()) op.cancelled = true;
    return;
  }
  // Still queued: UCX never saw it.
  if (Peer* peer = FindPeer(op.peer); peer != nullptr) std::erase(peer->queued, id);
  events_.push_back(Event(TransportEvent::Kind::kSendDone, id, op.peer,
                          absl::CancelledError(absl::StrCat("send ", id, " was cancelled"))));
  sends_.erase(it);
}

UcxTransport::UcxTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
UcxTransport::~UcxTransport() = default;

absl::StatusOr<std::unique_ptr<UcxTransport>> UcxTransport::Create(
    const UcxTransportOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<UcxTransport>(new UcxTransport(std::move(impl)));
}

absl::StatusOr<RegionId> UcxTransport::RegisterMemory(void* base, size_t length, MemoryKind kind) {
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
size_t UcxTransport::num_peers() const { return impl_->num_peers(); }
uint64_t UcxTransport::doors_replaced() const { return impl_->doors_replaced(); }
void UcxTransport::IgnoreDoorProbesForTesting() { impl_->IgnoreDoorProbes(); }
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

bool UcxTransport::SupportsMemory(MemoryKind kind) const {
  switch (kind) {
    case MemoryKind::kHost:
      return (impl_->memory_types() & UCS_BIT(UCS_MEMORY_TYPE_HOST)) != 0;
    case MemoryKind::kCuda:
      return (impl_->memory_types() & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
  }
  return false;
}

std::string UcxTransport::MemoryTypes() const { return MemoryTypeNames(impl_->memory_types()); }

std::string UcxTransport::Description() const {
  const char* tls = std::getenv("UCX_TLS");
  return absl::StrCat("UCX ", ucp_get_version_string(),
                      " UCX_TLS=", tls != nullptr ? tls : kDefaultTransports);
}

}  // namespace tandem::kvtransfer
