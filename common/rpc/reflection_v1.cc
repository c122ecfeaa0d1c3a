#include "common/rpc/reflection_v1.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace tandem::rpc {
namespace {

using google::protobuf::DescriptorPool;
using google::protobuf::FileDescriptor;
using grpc::reflection::v1::ServerReflectionRequest;
using grpc::reflection::v1::ServerReflectionResponse;

void Error(ServerReflectionResponse& response, grpc::StatusCode code, std::string message) {
  response.mutable_error_response()->set_error_code(code);
  response.mutable_error_response()->set_error_message(std::move(message));
}

// `file` and every file it imports, each once, `file` first.
void AddFiles(const FileDescriptor* file, ServerReflectionResponse& response) {
  absl::flat_hash_set<const FileDescriptor*> seen = {file};
  std::vector<const FileDescriptor*> todo = {file};
  auto* out = response.mutable_file_descriptor_response();
  while (!todo.empty()) {
    const FileDescriptor* f = todo.back();
    todo.pop_back();
    google::protobuf::FileDescriptorProto proto;
    f->CopyTo(&proto);
    out->add_file_descriptor_proto(proto.SerializeAsString());
    for (int i = 0; i < f->dependency_count(); ++i) {
      if (seen.insert(f->dependency(i)).second) todo.push_back(f->dependency(i));
    }
  }
}

// One request in, its answer out, until the client half-closes.
class Reactor final
    : public grpc::ServerBidiReactor<ServerReflectionRequest, ServerReflectionResponse> {
 public:
  explicit Reactor(const ReflectionV1Service* service) : service_(service) { StartRead(&request_); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    response_ = service_->Answer(request_);
    StartWrite(&response_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the client went away"));
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  const ReflectionV1Service* const service_;
  ServerReflectionRequest request_;
  ServerReflectionResponse response_;
};

}  // namespace

grpc::ServerBidiReactor<ServerReflectionRequest, ServerReflectionResponse>*
ReflectionV1Service::ServerReflectionInfo(grpc::CallbackServerContext*) {
  return new Reactor(this);
}

ServerReflectionResponse ReflectionV1Service::Answer(const ServerReflectionRequest& request) const {
  const DescriptorPool* pool = DescriptorPool::generated_pool();
  ServerReflectionResponse response;
  response.set_valid_host(request.host());
  *response.mutable_original_request() = request;
  switch (request.message_request_case()) {
    case ServerReflectionRequest::kListServices:
      for (const std::string& name : services_) {
        response.mutable_list_services_response()->add_service()->set_name(name);
      }
      break;
    case ServerReflectionRequest::kFileByFilename: {
      const FileDescriptor* file = pool->FindFileByName(request.file_by_filename());
      if (file == nullptr) {
        Error(response, grpc::StatusCode::NOT_FOUND,
              absl::StrCat("no file '", request.file_by_filename(), "'"));
      } else {
        AddFiles(file, response);
      }
      break;
    }
    case ServerReflectionRequest::kFileContainingSymbol: {
      const FileDescriptor* file = pool->FindFileContainingSymbol(request.file_containing_symbol());
      if (file == nullptr) {
        Error(response, grpc::StatusCode::NOT_FOUND,
              absl::StrCat("no symbol '", request.file_containing_symbol(), "'"));
      } else {
        AddFiles(file, response);
      }
      break;
    }
    case ServerReflectionRequest::kFileContainingExtension: {
      const auto& ext = request.file_containing_extension();
      const google::protobuf::Descriptor* type = pool->FindMessageTypeByName(ext.containing_type());
      const google::protobuf::FieldDescriptor* field =
          type == nullptr ? nullptr : pool->FindExtensionByNumber(type, ext.extension_number());
      if (field == nullptr) {
        Error(response, grpc::StatusCode::NOT_FOUND,
              absl::StrCat("no extension ", ext.extension_number(), " of '", ext.containing_type(),
                           "'"));
      } else {
        AddFiles(field->file(), response);
      }
      break;
    }
    case ServerReflectionRequest::kAllExtensionNumbersOfType: {
      const google::protobuf::Descriptor* type =
          pool->FindMessageTypeByName(request.all_extension_numbers_of_type());
      if (type == nullptr) {
        Error(response, grpc::StatusCode::NOT_FOUND,
              absl::StrCat("no message type '", request.all_extension_numbers_of_type(), "'"));
        break;
      }
      std::vector<const google::protobuf::FieldDescriptor*> extensions;
      pool->FindAllExtensions(type, &extensions);
      auto* out = response.mutable_all_extension_numbers_response();
      out->set_base_type_name(type->full_name());
      for (const auto* e : extensions) out->add_extension_number(e->number());
      break;
    }
    default:
      Error(response, grpc::StatusCode::INVALID_ARGUMENT,
            "the request names nothing to look up: send one of file_by_filename, "
            "file_containing_symbol, file_containing_extension, all_extension_numbers_of_type, "
            "list_services");
      break;
  }
  return response;
}

}  // namespace tandem::rpc
