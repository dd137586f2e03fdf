#include "runtime/gguf/value.h"

#include <fmt/format.h>

#include <cstring>

namespace hetmoe::gguf {

namespace {

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Reads element i of a raw numeric array as a double; integer types go through as_int's rules elsewhere.
double element_as_double(ValueType t, const uint8_t* p) {
  switch (t) {
    case ValueType::kUint8:
      return load<uint8_t>(p);
    case ValueType::kInt8:
      return load<int8_t>(p);
    case ValueType::kUint16:
      return load<uint16_t>(p);
    case ValueType::kInt16:
      return load<int16_t>(p);
    case ValueType::kUint32:
      return load<uint32_t>(p);
    case ValueType::kInt32:
      return load<int32_t>(p);
    case ValueType::kFloat32:
      return load<float>(p);
    case ValueType::kBool:
      return load<uint8_t>(p) != 0;
    case ValueType::kUint64:
      return static_cast<double>(load<uint64_t>(p));
    case ValueType::kInt64:
      return static_cast<double>(load<int64_t>(p));
    case ValueType::kFloat64:
      return load<double>(p);
    default:
      return 0;
  }
}

std::optional<int64_t> element_as_int(ValueType t, const uint8_t* p) {
  switch (t) {
    case ValueType::kUint8:
      return load<uint8_t>(p);
    case ValueType::kInt8:
      return load<int8_t>(p);
    case ValueType::kUint16:
      return load<uint16_t>(p);
    case ValueType::kInt16:
      return load<int16_t>(p);
    case ValueType::kUint32:
      return load<uint32_t>(p);
    case ValueType::kInt32:
      return load<int32_t>(p);
    case ValueType::kBool:
      return load<uint8_t>(p) != 0;
    case ValueType::kInt64:
      return load<int64_t>(p);
    case ValueType::kUint64: {
      uint64_t v = load<uint64_t>(p);
      if (v > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
      return static_cast<int64_t>(v);
    }
    default:
      return std::nullopt;
  }
}

}  // namespace

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::kUint8:
      return "u8";
    case ValueType::kInt8:
      return "i8";
    case ValueType::kUint16:
      return "u16";
    case ValueType::kInt16:
      return "i16";
    case ValueType::kUint32:
      return "u32";
    case ValueType::kInt32:
      return "i32";
    case ValueType::kFloat32:
      return "f32";
    case ValueType::kBool:
      return "bool";
    case ValueType::kString:
      return "string";
    case ValueType::kArray:
      return "array";
    case ValueType::kUint64:
      return "u64";
    case ValueType::kInt64:
      return "i64";
    case ValueType::kFloat64:
      return "f64";
  }
  return "?";
}

bool is_valid_value_type(uint32_t raw) { return raw <= static_cast<uint32_t>(ValueType::kFloat64); }

size_t value_type_size(ValueType t) {
  switch (t) {
    case ValueType::kUint8:
    case ValueType::kInt8:
    case ValueType::kBool:
      return 1;
    case ValueType::kUint16:
    case ValueType::kInt16:
      return 2;
    case ValueType::kUint32:
    case ValueType::kInt32:
    case ValueType::kFloat32:
      return 4;
    case ValueType::kUint64:
    case ValueType::kInt64:
    case ValueType::kFloat64:
      return 8;
    case ValueType::kString:
    case ValueType::kArray:
      return 0;
  }
  return 0;
}

Value Value::integer(ValueType t, int64_t v) {
  Value out;
  out.type_ = t;
  out.int_ = v;
  return out;
}

Value Value::u64(uint64_t v) {
  Value out;
  out.type_ = ValueType::kUint64;
  out.uint_ = v;
  out.int_ = v > static_cast<uint64_t>(INT64_MAX) ? -1 : static_cast<int64_t>(v);
  return out;
}

Value Value::f32(float v) {
  Value out;
  out.type_ = ValueType::kFloat32;
  out.float_ = v;
  return out;
}

Value Value::f64(double v) {
  Value out;
  out.type_ = ValueType::kFloat64;
  out.float_ = v;
  return out;
}

Value Value::boolean(bool v) {
  Value out;
  out.type_ = ValueType::kBool;
  out.int_ = v ? 1 : 0;
  return out;
}

Value Value::string(std::string v) {
  Value out;
  out.type_ = ValueType::kString;
  out.string_ = std::move(v);
  return out;
}

Value Value::string_array(std::vector<std::string> v) {
  Value out;
  out.type_ = ValueType::kArray;
  out.elem_type_ = ValueType::kString;
  out.strings_ = std::move(v);
  return out;
}

Value Value::numeric_array(ValueType elem, std::vector<uint8_t> raw) {
  Value out;
  out.type_ = ValueType::kArray;
  out.elem_type_ = elem;
  out.raw_ = std::move(raw);
  return out;
}

Value Value::i32_array(const std::vector<int32_t>& v) {
  std::vector<uint8_t> raw(v.size() * sizeof(int32_t));
  if (!v.empty()) std::memcpy(raw.data(), v.data(), raw.size());
  return numeric_array(ValueType::kInt32, std::move(raw));
}

Value Value::f32_array(const std::vector<float>& v) {
  std::vector<uint8_t> raw(v.size() * sizeof(float));
  if (!v.empty()) std::memcpy(raw.data(), v.data(), raw.size());
  return numeric_array(ValueType::kFloat32, std::move(raw));
}

Value Value::nested_array(ValueType elem, std::vector<Value> items) {
  Value out;
  out.type_ = ValueType::kArray;
  out.elem_type_ = elem;
  out.items_ = std::move(items);
  return out;
}

std::optional<int64_t> Value::as_int() const {
  switch (type_) {
    case ValueType::kFloat32:
    case ValueType::kFloat64:
    case ValueType::kString:
    case ValueType::kArray:
      return std::nullopt;
    case ValueType::kUint64:
      if (uint_ > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
      return int_;
    default:
      return int_;
  }
}

std::optional<double> Value::as_float() const {
  if (type_ == ValueType::kFloat32 || type_ == ValueType::kFloat64) return float_;
  if (type_ == ValueType::kUint64) return static_cast<double>(uint_);
  if (auto i = as_int()) return static_cast<double>(*i);
  return std::nullopt;
}

std::optional<bool> Value::as_bool() const {
  if (type_ == ValueType::kBool) return int_ != 0;
  return std::nullopt;
}

const std::string* Value::as_string() const { return type_ == ValueType::kString ? &string_ : nullptr; }

size_t Value::array_size() const {
  if (type_ != ValueType::kArray) return 0;
  if (elem_type_ == ValueType::kString) return strings_.size();
  if (elem_type_ == ValueType::kArray) return items_.size();
  return raw_.size() / value_type_size(elem_type_);
}

std::optional<int64_t> Value::array_int(size_t i) const {
  if (type_ != ValueType::kArray || i >= array_size()) return std::nullopt;
  size_t width = value_type_size(elem_type_);
  if (width == 0) return std::nullopt;
  return element_as_int(elem_type_, raw_.data() + i * width);
}

std::optional<double> Value::array_float(size_t i) const {
  if (type_ != ValueType::kArray || i >= array_size()) return std::nullopt;
  size_t width = value_type_size(elem_type_);
  if (width == 0) return std::nullopt;
  return element_as_double(elem_type_, raw_.data() + i * width);
}

std::string Value::to_display() const {
  switch (type_) {
    case ValueType::kString: {
      std::string s = string_.size() > 60 ? string_.substr(0, 57) + "..." : string_;
      // Control characters (newlines, terminal escapes) from an untrusted file would break a one-line display.
      for (char& c : s)
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
      return fmt::format("\"{}\"", s);
    }
    case ValueType::kArray:
      return fmt::format("<array of {} {}>", array_size(), value_type_name(elem_type_));
    case ValueType::kFloat32:
    case ValueType::kFloat64:
      return fmt::format("{:g}", float_);
    case ValueType::kBool:
      return int_ ? "true" : "false";
    case ValueType::kUint64:
      return fmt::format("{}", uint_);
    default:
      return fmt::format("{}", int_);
  }
}

}  // namespace hetmoe::gguf
