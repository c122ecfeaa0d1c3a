// The sending side of a planned move (decode_handoff.h).
#include "decode_worker/decode_handoff.h"

#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "kvtransfer/slices.h"
#include "kvtransfer/wire_format.h"

namespace tandem::decode {

absl::StatusOr<Choice*> Handoffs::Check(Sequence& seq, const HandoffCommand& cmd) const {
  const std::string name = absl::StrCat("request '", cmd.request_id, "'");
  if (s_.sender == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(name,
                     ": this worker ships no K/V (no handoff transport, or its KV cache "
                     "is not in host memory); recompute the stream instead"));
  }
  if (seq.n() != 1 || seq.state != Sequence::State::kRunning || !seq.choices[0].running) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, " cannot be handed off: it has ", seq.n(),
                     " choices and is not decoding one (only a running single-choice stream can)"));
  }
  Choice& choice = seq.choices[0];
  const int p = seq.prompt_len();
  const int t = static_cast<int>(cmd.tokens.size());
  // The caller's tokens are the stream's first ones: written K/V for all
  // but the last, which is written too or is the next step's input.
  if (t < 1 || p + t - 1 > choice.table.num_tokens() ||
      p + t - 1 > static_cast<int>(choice.tokens.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": the handoff names ", t, " tokens; the stream has written K/V for ",
        choice.table.num_tokens() - p, " generated tokens here (send 1 to that many plus one)"));
  }
  for (int i = 0; i < t; ++i) {
    const int at = p + i;
    const int32_t own =
        at < static_cast<int>(choice.tokens.size()) ? choice.tokens[at] : choice.next_input;
    if (own != cmd.tokens[i]) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": handoff token ", i, " is ",
                                                     cmd.tokens[i], " but the stream's is ", own));
    }
  }
  return &choice;
}

void Handoffs::Start(HandoffCommand cmd) {
  auto it = s_.by_request_id.find(cmd.request_id);
  if (it == s_.by_request_id.end()) {
    cmd.done(absl::NotFoundError(
        absl::StrCat("request '", cmd.request_id, "' is not held here (ended or never admitted)")));
    return;
  }
  Sequence& seq = *s_.sequences.at(it->second);
  absl::StatusOr<Choice*> checked = Check(seq, cmd);
  if (!checked.ok()) {
    cmd.done(checked.status());
    return;
  }
  Choice& choice = **checked;
  absl::StatusOr<kvtransfer::TransferLease> lease =
      kvtransfer::TransferLease::Parse(cmd.kv_descriptor);
  if (!lease.ok()) {
    cmd.done(absl::InvalidArgumentError(
        absl::StrCat("request '", cmd.request_id, "': bad lease: ", lease.status().message())));
    return;
  }
  const KvLayout& layout = s_.engine->kv_layout();
  const int kv_tokens = seq.prompt_len() + static_cast<int>(cmd.tokens.size()) - 1;
  const size_t blocks = BlocksFor(kv_tokens, layout.block_size);
  if (lease->first_block >= blocks) {
    cmd.done(absl::InvalidArgumentError(
        absl::StrCat("request '", cmd.request_id, "': the lease starts at block ",
                     lease->first_block, " but the stream's K/V has ", blocks)));
    return;
  }
  kvtransfer::SendRequest send;
  send.descriptor = cmd.kv_descriptor;
  send.layers = kvtransfer::PagedKvSlices(
      s_.send_region, layout.n_layers, layout.layer_bytes(), layout.block_bytes(),
      choice.table.blocks().subspan(lease->first_block, blocks - lease->first_block));
  send.deadline = seq.request.deadline;
  const uint64_t bytes = lease->total_bytes();
  // Shared: a sender that refuses drops its callback unrun.
  auto done = std::make_shared<HandoffDoneFn>(std::move(cmd.done));
  send.done = [this, ticket = seq.ticket, done, received = cmd.received, bytes](
                  uint64_t, const absl::Status& status) {
    OnSent(ticket, done, received, bytes, status);
  };
  absl::StatusOr<uint64_t> id = s_.sender->Start(std::move(send));
  if (!id.ok()) {
    // Nothing was sent: the stream decodes on here.
    (*done)(absl::Status(id.status().code(),
                         absl::StrCat("request '", cmd.request_id,
                                      "': the handoff could not start: ", id.status().message())));
    return;
  }
  // Out of the batch: its K/V stays as it is while it ships.
  choice.running = false;
  seq.MoveTo(Sequence::State::kHandingOff);
  seq.handoff_send = *id;
  seq.handoff_done = done;
  for (int layer = 0; layer < layout.n_layers; ++layer) {
    if (absl::Status s = s_.sender->MarkLayerReady(*id, layer); !s.ok()) break;
  }
}

void Handoffs::Poll() {
  if (s_.sender != nullptr) s_.sender->Poll();
}

void Handoffs::OnSent(Ticket ticket, const std::shared_ptr<HandoffDoneFn>& done,
                      absl::Time received, uint64_t bytes, const absl::Status& status) {
  Sequence* seq = s_.Find(ticket);
  if (seq != nullptr) {
    seq->handoff_send.reset();
    seq->handoff_done.reset();
    if (seq->state == Sequence::State::kCancelling) {
      // Cancelled while sending: nothing reads its blocks any more.
      seq->MoveTo(Sequence::State::kEnded);
      emitter_.Remove(*seq);
    }
  }
  // Answered already when the request ended first (Emitter::Fail).
  if (!*done) return;
  HandoffDoneFn answer = std::exchange(*done, nullptr);
  if (!status.ok()) {
    answer(absl::Status(status.code(),
                        absl::StrCat("shipping the stream's K/V failed: ", status.message())));
    return;
  }
  answer(HandoffResult{.kv_bytes = bytes, .transfer = s_.clock->Now() - received});
}

}  // namespace tandem::decode
