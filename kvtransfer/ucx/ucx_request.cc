#include "kvtransfer/ucx/ucx_request.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"

namespace tandem::kvtransfer::ucx_internal {

absl::Status UcxError(ucs_status_t status, std::string_view what) {
  if (status == UCS_OK) return absl::OkStatus();
  const std::string message = absl::StrCat(std::string(what), ": ", ucs_status_string(status));
  if (UCS_IS_LINK_ERROR(status) || UCS_IS_ENDPOINT_ERROR(status)) {
    return absl::UnavailableError(message);
  }
  switch (status) {
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_TIMED_OUT:
      return absl::UnavailableError(message);
    case UCS_ERR_CANCELED:
      return absl::CancelledError(message);
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
    case UCS_ERR_MESSAGE_TRUNCATED:
    case UCS_ERR_BUFFER_TOO_SMALL:
      return absl::InvalidArgumentError(message);
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_NO_RESOURCE:
    case UCS_ERR_EXCEEDS_LIMIT:
      return absl::ResourceExhaustedError(message);
    case UCS_ERR_NOT_IMPLEMENTED:
    case UCS_ERR_UNSUPPORTED:
      return absl::UnimplementedError(message);
    case UCS_ERR_NO_DEVICE:
    case UCS_ERR_NO_ELEM:
      return absl::NotFoundError(message);
    default:
      return absl::InternalError(message);
  }
}

ucp_request_param_t UcxRequest::SendParam() {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &UcxRequest::OnSendDone;
  param.user_data = this;
  return param;
}

ucp_request_param_t UcxRequest::AmReceiveParam() {
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_RECV_INFO;
  param.cb.recv_am = &UcxRequest::OnAmReceiveDone;
  param.user_data = this;
  // Filled by UCX when the receive finishes at once.
  param.recv_info.length = &received_length_;
  return param;
}

void UcxRequest::Start(ucs_status_ptr_t returned) {
  CHECK(!done_) << "a UcxRequest is started once";
  if (returned == nullptr) {
    Finish(nullptr, UCS_OK);
  } else if (UCS_PTR_IS_ERR(returned)) {
    Finish(nullptr, UCS_PTR_STATUS(returned));
  } else {
    // UCX calls back when it finishes.
    pending_ = returned;
  }
}

void UcxRequest::Abandon() {
  if (done_ || abandoned_ || pending_ == nullptr) return;
  abandoned_ = true;
  ucp_request_free(std::exchange(pending_, nullptr));
}

void UcxRequest::OnSendDone(void* request, ucs_status_t status, void* user_data) {
  static_cast<UcxRequest*>(user_data)->Finish(request, status);
}

void UcxRequest::OnAmReceiveDone(void* request, ucs_status_t status, size_t length,
                                 void* user_data) {
  auto* self = static_cast<UcxRequest*>(user_data);
  self->received_length_ = length;
  self->Finish(request, status);
}

void UcxRequest::Finish(void* request, ucs_status_t status) {
  if (abandoned_) return;  // UCX frees an abandoned request itself.
  done_ = true;
  status_ = status;
  pending_ = nullptr;
  if (request != nullptr) ucp_request_free(request);
  if (on_done_) on_done_();
}

absl::Status WaitForRequest(ucp_worker_h worker, const UcxRequest& request, absl::Time deadline,
                            std::string_view what) {
  while (!request.done()) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(std::string(what), ": no completion before the deadline"));
    }
    ucp_worker_progress(worker);
  }
  return UcxError(request.status(), what);
}

}  // namespace tandem::kvtransfer::ucx_internal
