// UcxTransport: KvTransport over UCX's UCP layer, for KV transfers between
// processes and hosts (shared memory, TCP, or RDMA where UCX has it).
//
// Each transport owns one UCP context and a UCP worker per connection, all
// driven only by the thread that calls Poll() (no UCX progress thread). A
// worker per connection because UCX's same-host message rings (posix, sysv)
// are read in order: a writer killed between claiming a slot and filling it
// stops its reader from hearing anyone behind it, so a ring must hear one
// peer only. The worker LocalAddress() names (the door) hears only the
// introductions of new connections; it is probed through its own ring, and
// replaced, with a new address, if it ever stops moving. Messages are UCP active
// messages: our header plus the caller's header, and the payload gathered
// from the caller's slices. The receiving worker keeps the payload (eager
// data, or the rendezvous descriptor that has not moved a byte yet) until
// Accept() receives it into the destination slices (zero-copy for
// rendezvous) or Discard() drops it.
//
// Connections: Connect() opens a worker for the connection and introduces it
// to the peer's door; the peer opens a worker of its own for the connection
// and answers from it, and from then on the two talk only between these two
// workers. Sends posted before the answer wait for it. The peer gets a
// PeerId of its own for the connection (first seen on a kIncoming event)
// and may send on it. Either side learns of the other's death through UCX's
// peer-failure handling (socket errors, keepalive) as kPeerFailed: the
// peer's sends and receives then fail with UNAVAILABLE within a bounded time
// (unless UcxTransportOptions::detect_peer_failure is off). Disconnect() and
// the destructor say goodbye first, so the far end sees kPeerFailed at once
// (a send still in flight on the connection may then fail: disconnect idle
// connections).
// A failed or disconnected peer's endpoint is closed without blocking (Poll()
// progresses the close) and its record freed once nothing refers to it.
//
// Cancel() cannot withdraw bytes UCX is already moving: kSendDone(CANCELLED)
// comes once UCX has let go of the source slices (the peer took or dropped
// the message, or the connection closed), so the slices are safe to reuse
// as soon as it is reported.
//
// Memory: only host memory is registered. Create() asks UCX which memory
// types it can move (ucp_context_query), and SupportsMemory() says so;
// Debian's UCX has no CUDA transports, so workers on a GPU stage their KV
// through page-locked host memory (common/engine/kv_staging.h) and register
// that. Where UCX does support CUDA memory, the direct path would plug in
// here and in the workers only: RegisterMemory(kCuda) would map the region
// with ucp_mem_map's memory_type set to CUDA, and a worker would register
// its device KV cache instead of creating staging, still handing a layer to
// the sender only after the device has finished writing it (an event per
// layer, as the staging copy's ticket is today). The transfer protocol
// above already takes any registered region.
//
// Thread-compatible, like every KvTransport. This header does not include
// UCX: users of the transport never see UCX types.
#ifndef TANDEM_KVTRANSFER_UCX_UCX_TRANSPORT_H_
#define TANDEM_KVTRANSFER_UCX_UCX_TRANSPORT_H_

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtransfer/kv_transport.h"

namespace tandem::kvtransfer {

struct UcxTransportOptions {
  // How often UCX checks that a silent peer is still alive; bounds how long
  // a dead peer goes unnoticed on transports without connection errors
  // (shared memory). UCX's own default is 20 s. UCX_KEEPALIVE_INTERVAL in the
  // environment wins over this.
  absl::Duration keepalive_interval = absl::Seconds(1);
  // Endpoints with UCX's peer-failure handling (UCP_ERR_HANDLING_MODE_PEER):
  // a dead peer becomes kPeerFailed and its sends and receives fail. Create()
  // turns on UCX 1.13's error handling for shared memory so that one host
  // keeps its fast path; over TCP it costs UCX's zero-copy rendezvous (no
  // RMA lanes with it), about a third of loopback bandwidth. Off, a send to
  // a dead peer is never released by UCX (nor can it be cancelled or the
  // endpoint force-closed), so its source memory stays pinned for good:
  // keep it on wherever a peer may die.
  bool detect_peer_failure = true;
  // Sends to one peer handed to UCX at once; later ones wait in order and
  // start as earlier ones finish. Dozens of concurrent 1 MiB rendezvous
  // transfers on one connection move less than a handful do (on loopback
  // TCP, 32 in flight gave under half the bandwidth of 8).
  int max_sends_in_flight = 8;
  // How long the destructor waits for endpoints to flush before tearing the
  // worker down regardless.
  absl::Duration close_timeout = absl::Seconds(2);
  // How long an initiator's hello may wait for its welcome; then the
  // connection fails with UNAVAILABLE. A connection disconnected before its
  // welcome waits for it as long, to say goodbye, so that the acceptor lets
  // go of the worker it opened for it.
  absl::Duration connect_timeout = absl::Seconds(10);
  // How often the door (the worker LocalAddress() names) is probed through
  // its message ring, and how long a probe may take before the door counts
  // as wedged and is replaced (a new LocalAddress()). The old door is still
  // polled for door_retire_after, then destroyed.
  absl::Duration door_probe_interval = absl::Milliseconds(500);
  absl::Duration door_probe_timeout = absl::Seconds(2);
  absl::Duration door_retire_after = absl::Seconds(30);
  // The network devices UCX may use, as UCX_NET_DEVICES lists them ("lo",
  // "eth1", "mlx5_0:1", "all"); its TCP transport listens on each device's
  // own address only. Overrides UCX_NET_DEVICES; empty = UCX_NET_DEVICES,
  // else every device. Shared-memory transports (one host) are not network
  // devices and stay available.
  std::string net_devices;
};

class UcxTransport final : public KvTransport {
 public:
  // Reads UCX_* settings from the environment (UCX_TLS and the rest), then
  // creates the context and worker.
  static absl::StatusOr<std::unique_ptr<UcxTransport>> Create(
      const UcxTransportOptions& options = {});

  ~UcxTransport() override;

  std::string_view name() const override { return "ucx"; }
  absl::StatusOr<RegionId> RegisterMemory(void* base, size_t length, MemoryKind kind) override;
  absl::Status DeregisterMemory(RegionId region) override;
  std::string LocalAddress() const override;
  absl::StatusOr<PeerId> Connect(std::string_view address) override;
  void Disconnect(PeerId peer) override;
  absl::StatusOr<SendId> PostSend(PeerId peer, std::string_view header,
                                  std::span<const Slice> payload) override;
  absl::Status Accept(IncomingId incoming, std::span<const Slice> destination) override;
  void Discard(IncomingId incoming) override;
  void Cancel(SendId send) override;
  void Poll(std::vector<TransportEvent>& events) override;
  void WaitForActivity(absl::Time deadline) override;

  // Connections this transport holds a record of: open ones, and failed or
  // disconnected ones until their endpoint is closed and nothing refers to
  // them. A connection closed on purpose ends the peer's record too (the
  // peer sees kPeerFailed), so churning peers leave nothing behind.
  size_t num_peers() const;
  // How many times the door was found wedged and replaced.
  uint64_t doors_replaced() const;
  // Makes the current door ignore its probes, as a wedged ring would (the
  // wedge itself needs a peer killed inside a handful of instructions).
  void IgnoreDoorProbesForTesting();

  // UCX transports the worker's lanes may use, e.g. "sysv,cma,tcp"; for logs
  // and benchmark tables.
  std::string Description() const;

  // Whether UCX can move memory of `kind` (its context's memory types).
  // RegisterMemory takes host memory only, whatever this says.
  bool SupportsMemory(MemoryKind kind) const;
  // The memory types UCX can move, as it names them ("host" without CUDA
  // support, e.g. "host,cuda,cuda-managed" with it); for logs.
  std::string MemoryTypes() const;

 private:
  class Impl;  // Holds every UCX object; defined where UCX headers are included.
  explicit UcxTransport(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_UCX_UCX_TRANSPORT_H_
