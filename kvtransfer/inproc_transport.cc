#include "kvtransfer/inproc_transport.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tandem::kvtransfer {
namespace inproc_internal {

struct Connection;

// One message in flight. Every field is guarded by the fabric's mutex.
struct Message {
  enum class Stage { kQueued, kReported, kAccepted, kDone };

  SendId send_id = 0;
  Node* sender = nullptr;
  PeerId sender_peer = 0;  // The connection's PeerId at the sender.
  Node* receiver = nullptr;
  PeerId receiver_peer = 0;  // The connection's PeerId at the receiver.
  std::shared_ptr<Connection> connection;
  std::string header;
  std::vector<std::span<std::byte>> source;
  uint64_t payload_bytes = 0;

  Stage stage = Stage::kQueued;
  IncomingId incoming_id = 0;
  std::vector<std::span<std::byte>> destination;
  absl::Status failure;  // Why a message ended before its copy.
};

struct Connection {
  Node* end[2] = {nullptr, nullptr};
  PeerId peer[2] = {0, 0};  // The PeerId each end knows the connection by.
  bool broken = false;
};

// The fabric-side state of one transport. Guarded by the fabric's mutex.
struct Node {
  uint64_t id = 0;
  PeerId next_peer = 1;
  SendId next_send = 1;
  IncomingId next_incoming = 1;
  absl::flat_hash_map<PeerId, std::shared_ptr<Connection>> peers;
  // Sends not yet done, for Cancel and for failing them with a connection.
  absl::flat_hash_map<SendId, std::shared_ptr<Message>> sends;
  // Messages to this node not yet reported by Poll.
  std::deque<std::shared_ptr<Message>> inbox;
  // Reported messages not yet accepted and copied, or discarded.
  absl::flat_hash_map<IncomingId, std::shared_ptr<Message>> incoming;
  // Accepted messages whose payload the next Poll copies, in Accept order.
  std::vector<IncomingId> accepted;
  // Events other nodes (or this one) produced for the next Poll.
  std::vector<TransportEvent> events;
};

TransportEvent MakeEvent(TransportEvent::Kind kind, uint64_t id, PeerId peer, absl::Status status) {
  TransportEvent e;
  e.kind = kind;
  e.id = id;
  e.peer = peer;
  e.status = std::move(status);
  return e;
}

// Ends `m` without copying it: the sender gets kSendDone(send_status), an
// accepted receive gets kReceiveDone(receive_status).
void EndMessage(Message& m, const absl::Status& send_status, const absl::Status& receive_status) {
  if (m.stage == Message::Stage::kDone) return;
  if (m.sender != nullptr) {
    m.sender->events.push_back(
        MakeEvent(TransportEvent::Kind::kSendDone, m.send_id, m.sender_peer, send_status));
    m.sender->sends.erase(m.send_id);
  }
  if (m.stage == Message::Stage::kAccepted) {
    m.receiver->events.push_back(MakeEvent(TransportEvent::Kind::kReceiveDone, m.incoming_id,
                                           m.receiver_peer, receive_status));
    m.receiver->incoming.erase(m.incoming_id);
  }
  m.failure = receive_status;
  m.stage = Message::Stage::kDone;
}

// Fails everything in flight on `c` and tells the far end. `closer` (may be
// null) is the end that closed it, which gets no kPeerFailed.
void BreakConnection(Connection& c, Node* closer, const absl::Status& why) {
  if (c.broken) return;
  c.broken = true;
  for (int e = 0; e < 2; ++e) {
    Node* node = c.end[e];
    std::vector<std::shared_ptr<Message>> doomed;
    for (auto& [id, m] : node->sends) {
      if (m->connection.get() == &c) doomed.push_back(m);
    }
    for (auto& m : doomed) EndMessage(*m, why, why);
  }
  for (int e = 0; e < 2; ++e) {
    if (c.end[e] != closer) {
      c.end[e]->events.push_back(MakeEvent(TransportEvent::Kind::kPeerFailed, 0, c.peer[e], why));
    }
  }
}

std::atomic<uint64_t> next_fabric_serial{1};

}  // namespace inproc_internal

using inproc_internal::BreakConnection;
using inproc_internal::Connection;
using inproc_internal::EndMessage;
using inproc_internal::MakeEvent;
using inproc_internal::Message;
using inproc_internal::Node;

std::shared_ptr<InProcFabric> InProcFabric::Create() {
  return std::shared_ptr<InProcFabric>(new InProcFabric(inproc_internal::next_fabric_serial++));
}

std::unique_ptr<InProcTransport> InProcTransport::Create(std::shared_ptr<InProcFabric> fabric) {
  auto node = std::make_unique<Node>();
  {
    absl::MutexLock lock(&fabric->mu_);
    node->id = fabric->next_node_++;
    fabric->nodes_[node->id] = node.get();
  }
  return std::unique_ptr<InProcTransport>(new InProcTransport(std::move(fabric), std::move(node)));
}

InProcTransport::InProcTransport(std::shared_ptr<InProcFabric> fabric, std::unique_ptr<Node> node)
    : fabric_(std::move(fabric)), node_(std::move(node)) {
  address_ = absl::StrCat("inproc:", fabric_->serial_, ":", node_->id);
}

InProcTransport::~InProcTransport() {
  absl::MutexLock lock(&fabric_->mu_);
  const absl::Status why = absl::UnavailableError(absl::StrCat("transport ", address_, " closed"));
  for (auto& [peer, c] : node_->peers) BreakConnection(*c, node_.get(), why);
  // Messages this node sent are all done now; drop what others still hold of
  // it so that nothing points at the freed node.
  for (auto& [peer, c] : node_->peers) {
    for (int e = 0; e < 2; ++e) {
      if (c->end[e] == node_.get()) c->end[e] = nullptr;
    }
  }
  fabric_->nodes_.erase(node_->id);
}

absl::StatusOr<RegionId> InProcTransport::RegisterMemory(void* base, size_t length,
                                                         MemoryKind kind) {
  if (kind != MemoryKind::kHost) {
    return absl::UnimplementedError("inproc transport registers host memory only");
  }
  if (base == nullptr && length != 0) return absl::InvalidArgumentError("null region");
  const RegionId id = next_region_++;
  regions_.Add(id, base, length, kind);
  return id;
}

absl::Status InProcTransport::DeregisterMemory(RegionId region) {
  if (!regions_.Bytes(Slice{region, 0, 0}).ok()) {
    return absl::NotFoundError(absl::StrCat("region ", region, " is not registered"));
  }
  regions_.Remove(region);
  return absl::OkStatus();
}

absl::StatusOr<PeerId> InProcTransport::Connect(std::string_view address) {
  std::vector<absl::string_view> parts =
      absl::StrSplit(absl::string_view(address.data(), address.size()), ':');
  uint64_t serial = 0;
  uint64_t node_id = 0;
  if (parts.size() != 3 || parts[0] != "inproc" || !absl::SimpleAtoi(parts[1], &serial) ||
      !absl::SimpleAtoi(parts[2], &node_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("not an inproc address: \"", absl::CHexEscape(std::string(address)), "\""));
  }
  if (serial != fabric_->serial_) {
    return absl::InvalidArgumentError(
        absl::StrCat("address ", std::string(address), " belongs to another fabric"));
  }
  absl::MutexLock lock(&fabric_->mu_);
  auto it = fabric_->nodes_.find(node_id);
  if (it == fabric_->nodes_.end()) {
    return absl::UnavailableError(
        absl::StrCat("no transport at ", std::string(address), " (closed?)"));
  }
  Node* remote = it->second;
  auto c = std::make_shared<Connection>();
  c->end[0] = node_.get();
  c->peer[0] = node_->next_peer++;
  c->end[1] = remote;
  c->peer[1] = remote->next_peer++;
  node_->peers[c->peer[0]] = c;
  remote->peers[c->peer[1]] = c;
  return c->peer[0];
}

void InProcTransport::Disconnect(PeerId peer) {
  absl::MutexLock lock(&fabric_->mu_);
  auto it = node_->peers.find(peer);
  if (it == node_->peers.end()) return;
  BreakConnection(*it->second, node_.get(),
                  absl::UnavailableError(absl::StrCat("connection closed by ", address_)));
  node_->peers.erase(it);
}

absl::StatusOr<std::vector<std::span<std::byte>>> InProcTransport::Resolve(
    std::span<const Slice> slices) const {
  std::vector<std::span<std::byte>> out;
  out.reserve(slices.size());
  for (const Slice& s : slices) {
    absl::StatusOr<std::span<std::byte>> bytes = regions_.Bytes(s);
    if (!bytes.ok()) return absl::InvalidArgumentError(bytes.status().message());
    out.push_back(*bytes);
  }
  return out;
}

absl::StatusOr<SendId> InProcTransport::PostSend(PeerId peer, std::string_view header,
                                                 std::span<const Slice> payload) {
  if (header.size() > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("header of ", header.size(), " bytes exceeds ", kMaxHeaderBytes));
  }
  absl::StatusOr<std::vector<std::span<std::byte>>> source = Resolve(payload);
  if (!source.ok()) return source.status();
  absl::MutexLock lock(&fabric_->mu_);
  auto it = node_->peers.find(peer);
  if (it == node_->peers.end()) return absl::NotFoundError(absl::StrCat("unknown peer ", peer));
  Connection& c = *it->second;
  if (c.broken) return absl::UnavailableError(absl::StrCat("connection to peer ", peer, " broke"));
  const int far = c.end[0] == node_.get() && c.peer[0] == peer ? 1 : 0;
  auto m = std::make_shared<Message>();
  m->send_id = node_->next_send++;
  m->sender = node_.get();
  m->sender_peer = peer;
  m->receiver = c.end[far];
  m->receiver_peer = c.peer[far];
  m->connection = it->second;
  m->header = std::string(header);
  m->source = *std::move(source);
  m->payload_bytes = TotalBytes(payload);
  node_->sends[m->send_id] = m;
  m->receiver->inbox.push_back(m);
  return m->send_id;
}

absl::Status InProcTransport::Accept(IncomingId incoming, std::span<const Slice> destination) {
  absl::StatusOr<std::vector<std::span<std::byte>>> dest = Resolve(destination);
  if (!dest.ok()) return dest.status();
  absl::MutexLock lock(&fabric_->mu_);
  auto it = node_->incoming.find(incoming);
  if (it == node_->incoming.end()) {
    return absl::NotFoundError(absl::StrCat("no incoming message ", incoming));
  }
  Message& m = *it->second;
  if (m.stage == Message::Stage::kDone) {
    const absl::Status why = m.failure;
    node_->incoming.erase(it);
    return why;
  }
  if (m.stage != Message::Stage::kReported) {
    return absl::FailedPreconditionError(absl::StrCat("message ", incoming, " already accepted"));
  }
  if (TotalBytes(destination) != m.payload_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("destination of ", TotalBytes(destination),
                                                   " bytes for a payload of ", m.payload_bytes));
  }
  m.destination = *std::move(dest);
  m.stage = Message::Stage::kAccepted;
  node_->accepted.push_back(incoming);
  return absl::OkStatus();
}

void InProcTransport::Discard(IncomingId incoming) {
  absl::MutexLock lock(&fabric_->mu_);
  auto it = node_->incoming.find(incoming);
  // An accepted message is past the point of dropping: its copy goes ahead.
  if (it == node_->incoming.end() || it->second->stage == Message::Stage::kAccepted) return;
  std::shared_ptr<Message> m = it->second;
  node_->incoming.erase(it);
  // The receiver chose to drop it: for the sender the message was delivered.
  EndMessage(*m, absl::OkStatus(), absl::OkStatus());
}

void InProcTransport::Cancel(SendId send) {
  absl::MutexLock lock(&fabric_->mu_);
  auto it = node_->sends.find(send);
  if (it == node_->sends.end()) return;
  std::shared_ptr<Message> m = it->second;
  const absl::Status why = absl::CancelledError(absl::StrCat("send ", send, " cancelled"));
  EndMessage(*m, why, why);
}

void InProcTransport::Poll(std::vector<TransportEvent>& events) {
  absl::MutexLock lock(&fabric_->mu_);
  Node& n = *node_;
  std::vector<IncomingId> accepted;
  accepted.swap(n.accepted);
  for (IncomingId id : accepted) {
    auto it = n.incoming.find(id);
    if (it == n.incoming.end()) continue;  // Ended (cancelled or broken) before its copy.
    std::shared_ptr<Message> m = it->second;
    // Gather from the source spans, scatter into the destination spans.
    size_t si = 0, so = 0, di = 0, d_off = 0;
    uint64_t left = m->payload_bytes;
    while (left > 0) {
      std::span<std::byte> s = m->source[si];
      std::span<std::byte> d = m->destination[di];
      const size_t n_bytes = std::min({s.size() - so, d.size() - d_off, static_cast<size_t>(left)});
      if (n_bytes > 0) std::memcpy(d.data() + d_off, s.data() + so, n_bytes);
      so += n_bytes;
      d_off += n_bytes;
      left -= n_bytes;
      if (so == s.size()) ++si, so = 0;
      if (d_off == d.size()) ++di, d_off = 0;
    }
    EndMessage(*m, absl::OkStatus(), absl::OkStatus());
  }
  for (TransportEvent& e : n.events) events.push_back(std::move(e));
  n.events.clear();
  while (!n.inbox.empty()) {
    std::shared_ptr<Message> m = std::move(n.inbox.front());
    n.inbox.pop_front();
    if (m->stage != Message::Stage::kQueued) continue;  // Cancelled or broken while queued.
    m->stage = Message::Stage::kReported;
    m->incoming_id = n.next_incoming++;
    n.incoming[m->incoming_id] = m;
    TransportEvent e = MakeEvent(TransportEvent::Kind::kIncoming, m->incoming_id, m->receiver_peer,
                                 absl::OkStatus());
    e.header = m->header;
    e.payload_bytes = m->payload_bytes;
    events.push_back(std::move(e));
  }
}

void InProcTransport::WaitForActivity(absl::Time deadline) {
  Node* n = node_.get();
  auto has_work = [n]() { return !n->inbox.empty() || !n->accepted.empty() || !n->events.empty(); };
  absl::MutexLock lock(&fabric_->mu_);
  fabric_->mu_.AwaitWithDeadline(absl::Condition(&has_work), deadline);
}

}  // namespace tandem::kvtransfer
