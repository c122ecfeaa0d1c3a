// Reading safetensors: the dtype table, header parsing and validation of one
// file (SafetensorsFile), and model folders of one file or several shards
// (OpenSafetensorsFolder). The writer is in safetensors_writer.cc.
#include "common/model/safetensors.h"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/mapped_file.h"
#include "common/base/status_macros.h"
#include "common/model/safetensors_internal.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using json = nlohmann::json;
using safetensors_internal::kMetadataKey;

// The reference implementation's limit; real headers are a few hundred KB.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DTypeRow {
  SafetensorsDType dtype;
  std::string_view name;
  size_t size;
};

constexpr std::array<DTypeRow, 15> kDTypes = {{
    {SafetensorsDType::kBool, "BOOL", 1},
    {SafetensorsDType::kU8, "U8", 1},
    {SafetensorsDType::kI8, "I8", 1},
    {SafetensorsDType::kF8E5M2, "F8_E5M2", 1},
    {SafetensorsDType::kF8E4M3, "F8_E4M3", 1},
    {SafetensorsDType::kI16, "I16", 2},
    {SafetensorsDType::kU16, "U16", 2},
    {SafetensorsDType::kF16, "F16", 2},
    {SafetensorsDType::kBF16, "BF16", 2},
    {SafetensorsDType::kI32, "I32", 4},
    {SafetensorsDType::kU32, "U32", 4},
    {SafetensorsDType::kF32, "F32", 4},
    {SafetensorsDType::kI64, "I64", 8},
    {SafetensorsDType::kU64, "U64", 8},
    {SafetensorsDType::kF64, "F64", 8},
}};

const DTypeRow& RowOf(SafetensorsDType dtype) {
  for (const DTypeRow& row : kDTypes) {
    if (row.dtype == dtype) return row;
  }
  return kDTypes[0];  // unreachable for values of the enum
}

const char* JsonTypeName(const json& j) {
  switch (j.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "an array";
    case json::value_t::string:
      return "a string";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float:
      return "a number";
    default:
      return "another JSON type";
  }
}

// Parses `text` as JSON and rejects repeated keys in any object, which
// nlohmann::json would otherwise resolve silently (last one wins).
// `what` names the text in messages ("<path>: header").
absl::StatusOr<json> ParseJsonNoDuplicates(std::string_view text, const std::string& what) {
  std::vector<std::set<std::string>> open_objects;
  std::string top_level_key;
  std::string duplicate;  // message for the first repeated key
  const json::parser_callback_t callback = [&](int /*depth*/, json::parse_event_t event,
                                               json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key: {
        if (open_objects.empty() || !parsed.is_string()) break;
        const std::string& key = parsed.get_ref<const std::string&>();
        if (!open_objects.back().insert(key).second && duplicate.empty()) {
          duplicate = open_objects.size() == 1 ? absl::StrCat("tensor '", key, "' appears twice")
                                               : absl::StrCat("under '", top_level_key, "': key '",
                                                              key, "' appears twice");
        }
        if (open_objects.size() == 1) top_level_key = key;
        break;
      }
      default:
        break;
    }
    return true;
  };
  json parsed;
  try {
    parsed = json::parse(text.begin(), text.end(), callback);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not valid JSON: ", e.what()));
  }
  if (!duplicate.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", duplicate));
  return parsed;
}

uint64_t LoadLe64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Validates one header entry; `data_size` is the data section's size.
absl::StatusOr<TensorInfo> ParseEntry(const std::string& path, const std::string& name,
                                      const json& entry, std::span<const uint8_t> data) {
  const std::string where = absl::StrCat(path, ": tensor '", name, "'");
  if (!entry.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": entry is ", JsonTypeName(entry), ", not an object"));
  }
  TensorInfo info;
  info.name = name;

  const auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": field 'dtype' is missing"));
  }
  if (!dtype_it->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": field 'dtype' is ", JsonTypeName(*dtype_it), ", not a string"));
  }
  const std::string& dtype_name = dtype_it->get_ref<const std::string&>();
  const std::optional<SafetensorsDType> dtype = ParseSafetensorsDType(dtype_name);
  if (!dtype.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": field 'dtype': unknown dtype '", dtype_name, "'"));
  }
  info.dtype = *dtype;

  const auto shape_it = entry.find("shape");
  if (shape_it == entry.end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": field 'shape' is missing"));
  }
  if (!shape_it->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": field 'shape' is ", JsonTypeName(*shape_it), ", not an array"));
  }
  uint64_t elements = 1;
  bool elements_overflow = false;
  for (const json& dim : *shape_it) {
    if (!dim.is_number_unsigned()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": field 'shape' holds ", dim.dump(),
                                                     ", not a non-negative integer"));
    }
    const uint64_t d = dim.get<uint64_t>();
    if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": field 'shape': dimension ", d, " is too large"));
    }
    info.shape.push_back(static_cast<int64_t>(d));
    elements_overflow = elements_overflow || __builtin_mul_overflow(elements, d, &elements);
  }
  const size_t element_size = SafetensorsDTypeSize(info.dtype);
  uint64_t expected_bytes = 0;
  if (elements_overflow || elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
      __builtin_mul_overflow(elements, element_size, &expected_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": field 'shape': ", shape_it->dump(), " has too many elements"));
  }
  info.num_elements = static_cast<int64_t>(elements);

  const auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": field 'data_offsets' is missing"));
  }
  if (!offsets_it->is_array() || offsets_it->size() != 2 ||
      !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": field 'data_offsets' is ",
                                                   offsets_it->dump(),
                                                   ", not [begin, end] of non-negative integers"));
  }
  info.data_begin = (*offsets_it)[0].get<uint64_t>();
  info.data_end = (*offsets_it)[1].get<uint64_t>();
  if (info.data_end < info.data_begin) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": field 'data_offsets': end ",
                                                   info.data_end, " < begin ", info.data_begin));
  }
  if (info.data_end > data.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": field 'data_offsets': [", info.data_begin, ", ", info.data_end,
                     "] runs past the data section (", data.size(), " bytes)"));
  }
  if (info.data_end - info.data_begin != expected_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": field 'data_offsets': [", info.data_begin, ", ", info.data_end,
                     "] holds ", info.data_end - info.data_begin, " bytes but field 'shape' ",
                     shape_it->dump(), " of ", dtype_name, " needs ", expected_bytes));
  }
  info.bytes = data.subspan(info.data_begin, info.data_end - info.data_begin);
  return info;
}

}  // namespace

std::optional<SafetensorsDType> ParseSafetensorsDType(std::string_view name) {
  for (const DTypeRow& row : kDTypes) {
    if (row.name == name) return row.dtype;
  }
  return std::nullopt;
}

std::string_view SafetensorsDTypeName(SafetensorsDType dtype) { return RowOf(dtype).name; }

size_t SafetensorsDTypeSize(SafetensorsDType dtype) { return RowOf(dtype).size; }

std::optional<DType> ToDType(SafetensorsDType dtype) {
  switch (dtype) {
    case SafetensorsDType::kF32:
      return DType::kF32;
    case SafetensorsDType::kF16:
      return DType::kF16;
    case SafetensorsDType::kBF16:
      return DType::kBF16;
    default:
      return std::nullopt;
  }
}

SafetensorsDType ToSafetensorsDType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return SafetensorsDType::kF32;
    case DType::kF16:
      return SafetensorsDType::kF16;
    case DType::kBF16:
      return SafetensorsDType::kBF16;
    default:  // quantized types are written widened (ParseDType names none)
      break;
  }
  return SafetensorsDType::kF32;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::Open(path));
  auto storage = std::make_shared<const MappedFile>(std::move(mapped));
  const std::span<const uint8_t> bytes = storage->bytes();
  return Parse(std::move(storage), bytes, path);
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Parse(std::shared_ptr<const void> storage,
                                                       std::span<const uint8_t> bytes,
                                                       std::string path) {
  if (bytes.size() < 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": file is ", bytes.size(), " bytes, too short for the 8-byte header length"));
  }
  const uint64_t header_len = LoadLe64(bytes.data());
  if (header_len > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header length ", header_len,
                                                   " exceeds the limit of ", kMaxHeaderBytes));
  }
  if (header_len > bytes.size() - 8) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header length ", header_len,
                                                   " runs past the end of the file (", bytes.size(),
                                                   " bytes)"));
  }
  const std::string_view header_text(reinterpret_cast<const char*>(bytes.data() + 8), header_len);
  ASSIGN_OR_RETURN(const json header,
                   ParseJsonNoDuplicates(header_text, absl::StrCat(path, ": header")));
  if (!header.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header is ", JsonTypeName(header), ", not a JSON object"));
  }
  const std::span<const uint8_t> data = bytes.subspan(8 + header_len);

  SafetensorsFile file;
  file.path_ = std::move(path);
  file.storage_ = std::move(storage);
  for (const auto& [name, entry] : header.items()) {
    if (name == kMetadataKey) {
      if (!entry.is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(file.path_, ": field '", kMetadataKey,
                                                       "' is ", JsonTypeName(entry),
                                                       ", not an object"));
      }
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(file.path_, ": field '", kMetadataKey,
                                                         "': value of '", key, "' is ",
                                                         JsonTypeName(value), ", not a string"));
        }
        file.metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    ASSIGN_OR_RETURN(TensorInfo info, ParseEntry(file.path_, name, entry, data));
    file.tensors_.push_back(std::move(info));
  }

  std::sort(file.tensors_.begin(), file.tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) {
              return std::tie(a.data_begin, a.data_end, a.name) <
                     std::tie(b.data_begin, b.data_end, b.name);
            });
  // Empty tensors hold no bytes and so overlap nothing.
  const TensorInfo* furthest = nullptr;  // the non-empty tensor reaching furthest so far
  for (const TensorInfo& t : file.tensors_) {
    if (t.data_begin == t.data_end) continue;
    if (furthest != nullptr && t.data_begin < furthest->data_end) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.path_, ": tensor '", t.name, "': field 'data_offsets' [", t.data_begin,
                       ", ", t.data_end, "] overlaps tensor '", furthest->name, "' [",
                       furthest->data_begin, ", ", furthest->data_end, "]"));
    }
    if (furthest == nullptr || t.data_end > furthest->data_end) furthest = &t;
  }
  for (size_t i = 0; i < file.tensors_.size(); ++i) file.index_[file.tensors_[i].name] = i;
  return file;
}

std::vector<std::string> SafetensorsFile::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const TensorInfo& t : tensors_) names.push_back(t.name);
  return names;
}

const TensorInfo* SafetensorsFile::Find(std::string_view name) const {
  const auto it = index_.find(absl::string_view(name.data(), name.size()));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo* SafetensorsModel::Find(std::string_view name) const {
  const auto it = index_.find(absl::string_view(name.data(), name.size()));
  return it == index_.end() ? nullptr : it->second;
}

std::vector<std::string> SafetensorsModel::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(index_.size());
  for (const auto& [name, info] : index_) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

namespace {

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// A shard name must name a file directly inside the folder.
bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find_first_of(std::string_view("/\\\0", 3)) == std::string::npos;
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::Open(path));
  if (mapped.size() > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", mapped.size(), " bytes exceeds the limit of ", kMaxHeaderBytes));
  }
  return std::string(reinterpret_cast<const char*>(mapped.bytes().data()), mapped.size());
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsModel>> OpenSafetensorsFolder(const std::string& dir) {
  auto model = std::make_unique<SafetensorsModel>();
  model->dir_ = dir;
  const std::string single = absl::StrCat(dir, "/", kSafetensorsSingleFile);
  const std::string index_path = absl::StrCat(dir, "/", kSafetensorsIndexFile);

  if (FileExists(single)) {
    ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(single));
    model->metadata_ = file.metadata();
    model->storage_ = file.keep_alive();
    model->shards_.push_back(std::move(file));
  } else if (FileExists(index_path)) {
    ASSIGN_OR_RETURN(const std::string text, ReadSmallFile(index_path));
    ASSIGN_OR_RETURN(const json index, ParseJsonNoDuplicates(text, index_path));
    if (!index.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": is ", JsonTypeName(index), ", not a JSON object"));
    }
    if (const auto it = index.find("metadata"); it != index.end()) {
      if (!it->is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(index_path, ": field 'metadata' is ",
                                                       JsonTypeName(*it), ", not an object"));
      }
      for (const auto& [key, value] : it->items()) {
        model->metadata_[key] = value.is_string() ? value.get<std::string>() : value.dump();
      }
    }
    const auto map_it = index.find("weight_map");
    if (map_it == index.end() || !map_it->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": field 'weight_map' is missing or not an object"));
    }
    // Shards in order of first mention; tensor -> shard name.
    std::vector<std::string> shard_names;
    std::map<std::string, size_t> shard_of_name;
    std::vector<std::pair<std::string, size_t>> listed;  // tensor, shard
    for (const auto& [tensor, shard] : map_it->items()) {
      if (!shard.is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(index_path, ": field 'weight_map': tensor '",
                                                       tensor, "' maps to ", JsonTypeName(shard),
                                                       ", not a file name"));
      }
      const std::string& shard_name = shard.get_ref<const std::string&>();
      if (!IsPlainFileName(shard_name)) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": field 'weight_map': tensor '", tensor, "' maps to '",
                         shard_name, "', not a plain file name inside the folder"));
      }
      const auto [it, added] = shard_of_name.emplace(shard_name, shard_names.size());
      if (added) shard_names.push_back(shard_name);
      listed.emplace_back(tensor, it->second);
    }
    if (shard_names.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": field 'weight_map' lists no tensors"));
    }
    auto keep = std::make_shared<std::vector<std::shared_ptr<const void>>>();
    for (const std::string& name : shard_names) {
      ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(absl::StrCat(dir, "/", name)));
      keep->push_back(file.keep_alive());
      model->shards_.push_back(std::move(file));
    }
    model->storage_ = std::move(keep);
    for (const SafetensorsFile& file : model->shards_) {
      for (const TensorInfo& t : file.tensors()) {
        if (!map_it->contains(t.name)) {
          return absl::InvalidArgumentError(absl::StrCat(index_path, ": tensor '", t.name, "' of '",
                                                         file.path(),
                                                         "' is not listed in field 'weight_map'"));
        }
      }
    }
    for (const auto& [tensor, shard] : listed) {
      if (model->shards_[shard].Find(tensor) == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(index_path, ": field 'weight_map': tensor '",
                                                       tensor, "' is not in '", shard_names[shard],
                                                       "', the shard it names"));
      }
    }
  } else {
    return absl::NotFoundError(absl::StrCat(dir, ": neither ", kSafetensorsSingleFile, " nor ",
                                            kSafetensorsIndexFile, " exists"));
  }

  std::map<std::string_view, const std::string*> shard_of_tensor;
  for (const SafetensorsFile& shard : model->shards_) {
    for (const TensorInfo& t : shard.tensors()) {
      const auto [it, added] = shard_of_tensor.emplace(t.name, &shard.path());
      if (!added) {
        return absl::InvalidArgumentError(absl::StrCat(dir, ": tensor '", t.name, "' is in both '",
                                                       *it->second, "' and '", shard.path(), "'"));
      }
      model->index_.emplace(t.name, &t);
    }
  }
  return model;
}

}  // namespace tandem
