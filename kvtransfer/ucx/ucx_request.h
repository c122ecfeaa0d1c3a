// The one place that turns UCX status codes and nonblocking UCP operations
// into our terms. Internal to kvtransfer/ucx: includes UCX headers.
//
// Every UCP *_nbx call returns a ucs_status_ptr_t meaning one of three things:
// NULL (finished at once, the callback will never run), an error pointer
// (failed at once), or a request that finishes later through the callback
// and must then be freed with ucp_request_free. UcxRequest handles all three,
// so no call site repeats that logic.
#ifndef TANDEM_KVTRANSFER_UCX_UCX_REQUEST_H_
#define TANDEM_KVTRANSFER_UCX_UCX_REQUEST_H_

#include <ucp/api/ucp.h>

#include <cstddef>
#include <functional>
#include <string_view>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace tandem::kvtransfer::ucx_internal {

// `status` as an absl::Status whose message says what was being done and
// what UCX said. UCS_OK maps to OK; peer and link failures to UNAVAILABLE.
absl::Status UcxError(ucs_status_t status, std::string_view what);

// One nonblocking UCP operation. Not copyable or movable: UCX holds its
// address as the callback's user data until the operation finishes, so the
// owner must keep it alive until done() (or until the worker is destroyed).
// Thread-compatible: used only by the thread that progresses its worker.
class UcxRequest {
 public:
  // `on_done` (optional) runs once when the operation finishes: inside
  // Start() when it finished at once, otherwise inside ucp_worker_progress.
  explicit UcxRequest(std::function<void()> on_done = nullptr) : on_done_(std::move(on_done)) {}
  UcxRequest(const UcxRequest&) = delete;
  UcxRequest& operator=(const UcxRequest&) = delete;

  // Parameters for a send-like call (ucp_am_send_nbx, ucp_ep_close_nbx) or
  // for ucp_am_recv_data_nbx, with the callback bound to this request. The
  // caller may add datatype, flags and memh.
  ucp_request_param_t SendParam();
  ucp_request_param_t AmReceiveParam();

  // Records what the UCP call made with one of the parameters above returned.
  void Start(ucs_status_ptr_t returned);

  // Gives up on an unfinished operation: UCX frees the request when the
  // operation ends, and on_done never runs. Required before destroying the
  // worker, which refuses requests the user still owns.
  void Abandon();

  bool done() const { return done_; }
  // UCS_INPROGRESS until done().
  ucs_status_t status() const { return status_; }
  // Bytes a finished ucp_am_recv_data_nbx placed; unset for other calls.
  size_t received_length() const { return received_length_; }

 private:
  static void OnSendDone(void* request, ucs_status_t status, void* user_data);
  static void OnAmReceiveDone(void* request, ucs_status_t status, size_t length, void* user_data);
  void Finish(void* request, ucs_status_t status);

  std::function<void()> on_done_;
  void* pending_ = nullptr;  // The UCX request while unfinished.
  bool abandoned_ = false;
  bool done_ = false;
  ucs_status_t status_ = UCS_INPROGRESS;
  size_t received_length_ = 0;
};

// Progresses `worker` until `request` is done or `deadline` passes; returns
// DEADLINE_EXCEEDED (mentioning `what`) in the latter case, else the
// operation's status.
absl::Status WaitForRequest(ucp_worker_h worker, const UcxRequest& request, absl::Time deadline,
                            std::string_view what);

}  // namespace tandem::kvtransfer::ucx_internal

#endif  // TANDEM_KVTRANSFER_UCX_UCX_REQUEST_H_
