// Internal to kvtransfer/ucx: the definition of UcxTransport::Impl, shared by
// ucx_transport.cc and ucx_transport_events.cc. Includes UCX headers.
#ifndef TANDEM_KVTRANSFER_UCX_UCX_TRANSPORT_IMPL_H_
#define TANDEM_KVTRANSFER_UCX_UCX_TRANSPORT_IMPL_H_

#include <poll.h>
#include <ucp/api/ucp.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtransfer/kv_transport.h"
#include "kvtransfer/ucx/ucx_request.h"
#include "kvtransfer/ucx/ucx_transport.h"
#include "kvtransfer/ucx/ucx_wire.h"

namespace tandem::kvtransfer {

// The state behind UcxTransport: every UCX object, and the bookkeeping that
// turns UCX callbacks into polled events. Its methods are split between
// ucx_transport.cc (setup, memory, posting, accepting),
// ucx_transport_connect.cc (the door, introductions, closing peers) and
// ucx_transport_events.cc (UCX callbacks, failures, Poll). Thread-compatible,
// as UcxTransport: one thread calls it and progresses every worker it owns.
class UcxTransport::Impl {
 public:
  explicit Impl(const UcxTransportOptions& options) : options_(options) {}
  ~Impl();

  absl::Status Init();
  size_t num_peers() const { return peers_.size(); }
  uint64_t doors_replaced() const { return doors_replaced_; }
  void IgnoreDoorProbes() { door_deaf_ = true; }

  absl::StatusOr<RegionId> RegisterMemory(void* base, size_t length, MemoryKind kind);
  absl::Status DeregisterMemory(RegionId region);
  const std::string& address() const { return address_; }
  // UCS_BIT(ucs_memory_type_t) of every memory type the context supports.
  uint64_t memory_types() const { return memory_types_; }
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

  // A peer that failed or was disconnected is released (ReleaseClosedPeers)
  // once UCX has closed its endpoints, since UCX holds a pointer to the
  // record as the argument of the endpoints' error handlers and of the
  // connection worker's message handlers until then, and once no send or
  // receive refers to it. Its id is never reused.
  struct Peer {
    Impl* impl;
    PeerId id;
    ucx_internal::ConnectionKey key;
    bool initiator;
    // The connection's own UCX worker: its message rings hear this one peer
    // only, so a peer that dies halfway through writing a message into one
    // can wedge nothing but its own connection. Destroyed with the record.
    ucp_worker_h worker = nullptr;
    int event_fd = -1;
    // To the far end's worker for this connection; null until it exists
    // (an initiator's until the welcome came).
    ucp_ep_h ep = nullptr;
    // The far worker's address, until the endpoint to it exists.
    std::string back_address;
    // Initiator side: the endpoint to the acceptor's door that carries the
    // hello, closed once the welcome came.
    ucp_ep_h door_ep = nullptr;
    std::unique_ptr<ucx_internal::UcxRequest> door_close;
    // The introduction (an initiator's hello, an acceptor's welcome), its
    // header kept until sent (UCX 1.13 reads the header of a queued send
    // when it goes out, not when it is posted).
    std::string hello_header;
    std::unique_ptr<ucx_internal::UcxRequest> hello;
    // An initiator's welcome must come by then, or the connection fails.
    absl::Time introduce_by = absl::InfiniteFuture();
    // The goodbye sent by Disconnect (its header kept until sent, as the
    // hello's), and the endpoint's close request.
    std::string bye_header;
    std::unique_ptr<ucx_internal::UcxRequest> bye;
    std::unique_ptr<ucx_internal::UcxRequest> close;
    bool disconnected = false;
    bool failed = false;
    absl::Status failure;
    // Sends handed to UCX and not yet finished, and the ones waiting for
    // room under UcxTransportOptions::max_sends_in_flight (or for the
    // welcome), oldest first.
    int in_flight = 0;
    std::deque<SendId> queued;
  };

  // The worker whose address LocalAddress() gives: it hears only hellos and
  // UCX's wire-up of new connections. A worker of the same transport probes
  // it through its ring; a door whose ring stopped moving (a peer died
  // halfway through writing into it) is replaced by a new one with a new
  // address, and retired: still polled for a while, then destroyed.
  struct Door {
    ucp_worker_h worker = nullptr;
    int event_fd = -1;
    std::string raw_address;  // The UCX worker address.
    ucp_worker_h prober = nullptr;
    int prober_fd = -1;
    ucp_ep_h probe_ep = nullptr;
    std::unique_ptr<ucx_internal::UcxRequest> probe;
    std::string probe_header;
    absl::Time retire_at = absl::InfiniteFuture();
  };

  // A contiguous run of registered memory.
  struct Span {
    char* data;
    size_t length;
    ucp_mem_h memh;
  };

  struct SendOp {
    explicit SendOp(std::function<void()> on_done) : request(std::move(on_done)) {}
    PeerId peer = 0;
    std::string wire_header;  // UCX may read it until the send finishes.
    std::vector<Span> spans;  // the payload
    std::vector<ucp_dt_iov_t> iov;
    bool started = false;  // handed to UCX (else queued on its peer)
    ucx_internal::UcxRequest request;
    bool cancelled = false;
    // kSendDone already reported (the peer failed); the record waits only
    // for UCX to let go of the request.
    bool reported = false;
  };

  struct Incoming {
    PeerId peer = 0;
    ucp_worker_h worker = nullptr;  // The worker that heard it (its peer's).
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
    std::unique_ptr<ucx_internal::UcxRequest> request;
  };

  static ucs_status_t OnHello(void* arg, const void* header, size_t header_length, void* data,
                              size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t OnProbe(void* arg, const void* header, size_t header_length, void* data,
                              size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t OnWelcome(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t OnData(void* arg, const void* header, size_t header_length, void* data,
                             size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t OnBye(void* arg, const void* header, size_t header_length, void* data,
                            size_t length, const ucp_am_recv_param_t* param);
  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);
  static void OnDoorEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);
  static void OnProbeEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);

  // A worker of the transport's context, with `handlers` (id, callback,
  // flags) bound to `arg`, and its event file descriptor.
  struct HandlerSpec {
    unsigned id;
    ucp_am_recv_callback_t callback;
    uint32_t flags;
  };
  absl::StatusOr<ucp_worker_h> NewWorker(std::span<const HandlerSpec> handlers, void* arg,
                                         int* event_fd);
  // The connection worker of `peer` (its handlers bound to the record).
  absl::Status NewPeerWorker(Peer& peer);
  static absl::StatusOr<std::string> WorkerAddress(ucp_worker_h worker);
  absl::StatusOr<ucp_ep_h> CreateEndpoint(ucp_worker_h worker, std::string_view worker_address,
                                          ucp_err_handler_cb_t on_error, void* arg,
                                          std::string_view what);
  // A new door (and its prober), which LocalAddress() names from now on.
  absl::Status OpenDoor();
  // Sends a probe through the door when due, and replaces the door when one
  // has not come through in time.
  void ProbeDoor(absl::Time now);
  // Destroys retired doors whose time has come (all of them with `all`).
  void CloseDoors(absl::Time now, bool all);
  void DestroyDoor(Door& door) const;
  // Every worker: the door, retired doors, probers, connections.
  void CollectWorkers();
  // Progresses every worker; whether anything happened.
  bool ProgressAll();
  Peer* FindPeer(PeerId id);
  absl::StatusOr<std::vector<Span>> Resolve(std::span<const Slice> slices, uint64_t* total);
  // Fills `param`'s datatype (and memory handle) and returns the buffer and
  // count for a UCP call over `spans`, building `iov` when there are several.
  static std::pair<void*, size_t> Describe(const std::vector<Span>& spans,
                                           std::vector<ucp_dt_iov_t>& iov,
                                           ucp_request_param_t& param);
  // Closes `ep` (if open) without blocking, `close` tracking it; `ep`
  // becomes null.
  void CloseEndpoint(ucp_ep_h& ep, std::unique_ptr<ucx_internal::UcxRequest>& close, bool force);
  void CloseEndpoint(Peer& peer, bool force) { CloseEndpoint(peer.ep, peer.close, force); }
  void CloseDoorEndpoint(Peer& peer, bool force) {
    CloseEndpoint(peer.door_ep, peer.door_close, force);
  }
  // Tells the peer that we close the connection (kByeAmId), ahead of
  // closing the endpoint; best effort.
  void SayGoodbye(Peer& peer);
  // Hands `op` to UCX.
  void StartSend(Peer& peer, SendOp& op);
  // Starts queued sends of every peer with room under the window (room
  // opens only when a send finishes).
  void StartQueuedSends();
  // Ends the sends still queued on `peer` with `status` (kSendDone).
  void DropQueuedSends(Peer& peer, const absl::Status& status);
  void ReleaseDescriptor(Incoming& incoming);
  // Opens the endpoints of introduced connections: an acceptor's back to
  // the initiator (and its welcome), an initiator's to the welcome's worker.
  // Returns whether an initiator's connection became ready to send.
  bool CreateBackEndpoints();
  // Fails connections whose welcome did not come in time.
  void CheckIntroductions(absl::Time now);
  void HandleFailedPeers();
  void ReportFinishedSends();
  void ReportFinishedReceives();
  // Frees the records of failed and disconnected peers that nothing refers
  // to any more.
  void ReleaseClosedPeers();
  bool HasQueuedWork() const;
  static TransportEvent Event(TransportEvent::Kind kind, uint64_t id, PeerId peer,
                              absl::Status status);

  // Constant after Init().
  const UcxTransportOptions options_;
  uint64_t nonce_ = 0;
  ucp_context_h context_ = nullptr;
  uint64_t memory_types_ = 0;
  size_t max_am_header_ = 0;

  Door door_;
  std::string address_;  // LocalAddress(): door_'s, framed.
  std::vector<Door> retired_doors_;
  uint64_t doors_replaced_ = 0;
  bool door_deaf_ = false;  // IgnoreDoorProbesForTesting(), until the door is replaced.
  uint64_t probes_sent_ = 0;
  uint64_t probes_heard_ = 0;  // The latest probe number the door heard.
  absl::Time probe_sent_at_ = absl::InfinitePast();
  absl::Time next_probe_ = absl::InfinitePast();
  int polls_since_probe_ = 0;
  std::vector<ucp_worker_h> workers_;  // CollectWorkers()'s, reused.
  std::vector<int> worker_fds_;
  std::vector<pollfd> pollfds_;

  absl::flat_hash_map<RegionId, Region> regions_;
  RegionId next_region_ = 1;

  absl::flat_hash_map<PeerId, std::unique_ptr<Peer>> peers_;
  absl::flat_hash_map<ucx_internal::ConnectionKey, PeerId> accepted_;
  PeerId next_peer_ = 1;
  std::vector<PeerId> new_peers_;
  std::vector<std::pair<PeerId, absl::Status>> failed_peers_;

  absl::flat_hash_map<SendId, std::unique_ptr<SendOp>> sends_;
  SendId next_send_ = 1;
  std::vector<SendId> finished_sends_;

  absl::flat_hash_map<IncomingId, std::unique_ptr<Incoming>> incoming_;
  IncomingId next_incoming_ = 1;
  std::vector<IncomingId> finished_receives_;

  std::vector<TransportEvent> events_;
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_UCX_UCX_TRANSPORT_IMPL_H_
