#include "fuzz/proto_mutator.h"

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"

namespace samplerd {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

constexpr int kMaxDepth = 6;

struct Site {
  Message* message;
  const FieldDescriptor* field;
};

// Every (message, field) pair reachable from `message`, present or not.
void CollectSites(Message* message, int depth, std::vector<Site>* sites) {
  const auto* descriptor = message->GetDescriptor();
  const Reflection* reflection = message->GetReflection();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor* field = descriptor->field(i);
    sites->push_back({message, field});
    // Map entries are never reached through reflection's repeated view (see MutateMap).
    if (field->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE || field->is_map() ||
        depth >= kMaxDepth) {
      continue;
    }
    if (field->is_repeated()) {
      for (int k = 0; k < reflection->FieldSize(*message, field); ++k) {
        CollectSites(reflection->MutableRepeatedMessage(message, field, k), depth + 1, sites);
      }
    } else if (reflection->HasField(*message, field)) {
      CollectSites(reflection->MutableMessage(message, field), depth + 1, sites);
    }
  }
}

template <typename T>
T Pick(std::mt19937_64& rng, const std::vector<T>& values) {
  return values[rng() % values.size()];
}

int64_t Int64(std::mt19937_64& rng) {
  static const std::vector<int64_t> kEdges = {
      0, 1, -1, 2, 3, 4, 7, 8, 31, 32, 63, 64, 100, 255, 256, 1000, 1024, 4096, 8192, 65535,
      65536, int64_t{1} << 20, std::numeric_limits<int32_t>::max(),
      std::numeric_limits<int32_t>::min(), int64_t{1} << 31, int64_t{1} << 32,
      int64_t{1} << 62, (int64_t{1} << 62) + 1, std::numeric_limits<int64_t>::max(),
      std::numeric_limits<int64_t>::min()};
  switch (rng() % 4) {
    case 0:
      return static_cast<int64_t>(rng() % 64);
    case 1:
      return static_cast<int64_t>(rng());
    default:
      return Pick(rng, kEdges);
  }
}

float Float(std::mt19937_64& rng) {
  static const std::vector<float> kEdges = {
      0.0f, -0.0f, 1.0f, -1.0f, 0.5f, 0.7f, 0.95f, 2.0f, 1e-5f, 1e-6f, 1e-38f, 1e-45f,
      1e34f, 1e38f, 3e38f, -3e38f, std::numeric_limits<float>::max(),
      std::numeric_limits<float>::lowest(), std::numeric_limits<float>::infinity(),
      -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
  if (rng() % 3 == 0) {
    return std::uniform_real_distribution<float>(-20.0f, 20.0f)(rng);
  }
  return Pick(rng, kEdges);
}

std::string Bytes(std::mt19937_64& rng) {
  static const std::vector<size_t> kSizes = {0, 1, 2, 3, 4, 7, 8, 16, 64, 66, 256, 1024, 4096};
  std::string out(Pick(rng, kSizes), '\0');
  const int fill = static_cast<int>(rng() % 3);
  for (char& c : out) c = fill == 0 ? '\0' : fill == 1 ? '\xff' : static_cast<char>(rng());
  if (rng() % 4 == 0 && !out.empty()) out[0] = '/';  // shm names start with '/'
  return out;
}

// Sets (or, for repeated fields, adds or replaces element `index`) one value of a scalar field.
void SetScalar(Message* m, const FieldDescriptor* f, std::mt19937_64& rng, int index) {
  const Reflection* r = m->GetReflection();
  const bool rep = f->is_repeated();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32: {
      const int32_t v = static_cast<int32_t>(Int64(rng));
      if (!rep) r->SetInt32(m, f, v); else if (index < 0) r->AddInt32(m, f, v); else r->SetRepeatedInt32(m, f, index, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_INT64: {
      const int64_t v = Int64(rng);
      if (!rep) r->SetInt64(m, f, v); else if (index < 0) r->AddInt64(m, f, v); else r->SetRepeatedInt64(m, f, index, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_UINT32: {
      const uint32_t v = static_cast<uint32_t>(Int64(rng));
      if (!rep) r->SetUInt32(m, f, v); else if (index < 0) r->AddUInt32(m, f, v); else r->SetRepeatedUInt32(m, f, index, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_UINT64: {
      const uint64_t v = static_cast<uint64_t>(Int64(rng));
      if (!rep) r->SetUInt64(m, f, v); else if (index < 0) r->AddUInt64(m, f, v); else r->SetRepeatedUInt64(m, f, index, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_FLOAT: {
      const float v = Float(rng);
      if (!rep) r->SetFloat(m, f, v); else if (index < 0) r->AddFloat(m, f, v); else r->SetRepeatedFloat(m, f, index, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_DOUBLE: {
      const double v = Float(rng);
      if (!rep) r->SetDouble(m, f, v); else if (index < 0) r->AddDouble(m, f, v); else r->SetRepeatedDouble(m, f, index, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_BOOL: {
      const bool v = rng() % 2;
      if (!rep) r->SetBool(m, f, v); else if (index < 0) r->AddBool(m, f, v); else r->SetRepeatedBool(m, f, index, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_ENUM: {
      const auto* e = f->enum_type();
      // A declared value most of the time; proto3 enums are open, so sometimes an unknown one.
      const int v = rng() % 8 == 0 ? static_cast<int>(Int64(rng)) : e->value(rng() % e->value_count())->number();
      if (!rep) r->SetEnumValue(m, f, v); else if (index < 0) r->AddEnumValue(m, f, v); else r->SetRepeatedEnumValue(m, f, index, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      std::string v = Bytes(rng);
      // `string` fields must hold UTF-8 (protobuf refuses to parse anything else): ASCII.
      if (f->type() == FieldDescriptor::TYPE_STRING) {
        for (char& c : v) c = static_cast<char>(0x20 + (static_cast<unsigned char>(c) % 0x5f));
      }
      if (!rep) r->SetString(m, f, v); else if (index < 0) r->AddString(m, f, v); else r->SetRepeatedString(m, f, index, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      break;
  }
}

// A map field changes only by parsing: one entry (a random key and value set on a standalone
// entry message) appended as wire bytes, which may repeat a key (valid on the wire: the last
// wins), or the field cleared. Reflection's repeated view of a map and the map itself sync
// lazily, and adding entries through that view crashed protobuf 3.21 inside its map sync.
void MutateMap(Message* m, const FieldDescriptor* f, std::mt19937_64& rng) {
  const Reflection* r = m->GetReflection();
  if (rng() % 8 == 0) {
    r->ClearField(m, f);
    return;
  }
  std::unique_ptr<Message> entry(
      r->GetMessageFactory()->GetPrototype(f->message_type())->New());
  SetScalar(entry.get(), f->message_type()->map_key(), rng, -1);
  SetScalar(entry.get(), f->message_type()->map_value(), rng, -1);  // no-op for message values
  const std::string bytes = entry->SerializeAsString();
  std::string wire;
  {
    google::protobuf::io::StringOutputStream stream(&wire);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.WriteTag(google::protobuf::internal::WireFormatLite::MakeTag(
        f->number(), google::protobuf::internal::WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
    coded.WriteVarint32(static_cast<uint32_t>(bytes.size()));
    coded.WriteString(bytes);
  }
  m->MergeFromString(wire);
}

void MutateSite(const Site& site, std::mt19937_64& rng) {
  Message* m = site.message;
  const FieldDescriptor* f = site.field;
  const Reflection* r = m->GetReflection();
  if (f->is_map()) {
    MutateMap(m, f, rng);
    return;
  }
  if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
    if (f->is_repeated()) {
      const int size = r->FieldSize(*m, f);
      const int op = static_cast<int>(rng() % 3);
      if (op == 0 || size == 0) {
        r->AddMessage(m, f);
      } else if (op == 1) {
        r->RemoveLast(m, f);
      } else {
        r->AddMessage(m, f)->CopyFrom(r->GetRepeatedMessage(*m, f, static_cast<int>(rng() % size)));
      }
    } else if (r->HasField(*m, f) && rng() % 2 == 0) {
      r->ClearField(m, f);
    } else {
      r->MutableMessage(m, f);
    }
    return;
  }
  if (!f->is_repeated()) {
    if (r->HasField(*m, f) && rng() % 8 == 0) {
      r->ClearField(m, f);
    } else {
      SetScalar(m, f, rng, -1);
    }
    return;
  }
  const int size = r->FieldSize(*m, f);
  switch (rng() % 4) {
    case 0:
      if (size > 0) {
        SetScalar(m, f, rng, static_cast<int>(rng() % size));
        break;
      }
      [[fallthrough]];
    case 1:
      SetScalar(m, f, rng, -1);
      break;
    case 2:
      if (size > 0) r->RemoveLast(m, f);
      break;
    default: {
      // Many elements at once: tensors need rows x cols values.
      const int add = 1 + static_cast<int>(rng() % 64);
      for (int i = 0; i < add; ++i) SetScalar(m, f, rng, -1);
    }
  }
}

}  // namespace

void MutateMessage(Message* message, std::mt19937_64& rng) {
  std::vector<Site> sites;
  CollectSites(message, 0, &sites);
  if (sites.empty()) return;
  MutateSite(sites[rng() % sites.size()], rng);
}

}  // namespace samplerd
