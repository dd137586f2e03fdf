#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hetmoe::gguf {

// GGUF metadata value types, numbered as in the file format.
enum class ValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

const char* value_type_name(ValueType t);
bool is_valid_value_type(uint32_t raw);
// Bytes of one element of a fixed-size type; 0 for string and array.
size_t value_type_size(ValueType t);

// One metadata value. Scalars keep their exact type (a writer must write back what it read); numeric
// arrays keep their elements as little-endian bytes, which is compact for 100k-entry token-type arrays.
class Value {
 public:
  Value() = default;
  static Value u8(uint8_t v) { return integer(ValueType::kUint8, v); }
  static Value i8(int8_t v) { return integer(ValueType::kInt8, v); }
  static Value u16(uint16_t v) { return integer(ValueType::kUint16, v); }
  static Value i16(int16_t v) { return integer(ValueType::kInt16, v); }
  static Value u32(uint32_t v) { return integer(ValueType::kUint32, v); }
  static Value i32(int32_t v) { return integer(ValueType::kInt32, v); }
  static Value u64(uint64_t v);
  static Value i64(int64_t v) { return integer(ValueType::kInt64, v); }
  static Value f32(float v);
  static Value f64(double v);
  static Value boolean(bool v);
  static Value string(std::string v);
  static Value string_array(std::vector<std::string> v);
  static Value i32_array(const std::vector<int32_t>& v);
  static Value f32_array(const std::vector<float>& v);
  // A numeric array from raw little-endian element bytes.
  static Value numeric_array(ValueType elem, std::vector<uint8_t> raw);
  static Value nested_array(ValueType elem, std::vector<Value> items);

  ValueType type() const { return type_; }
  ValueType elem_type() const { return elem_type_; }
  bool is_array() const { return type_ == ValueType::kArray; }

  // Scalar conversions; nullopt when the type does not fit (a float is not an integer, -1 is not unsigned).
  std::optional<int64_t> as_int() const;
  std::optional<double> as_float() const;  // integers convert too
  std::optional<bool> as_bool() const;
  const std::string* as_string() const;
  uint64_t u64_value() const { return uint_; }  // kUint64 only

  size_t array_size() const;
  std::optional<int64_t> array_int(size_t i) const;
  std::optional<double> array_float(size_t i) const;
  const std::vector<std::string>& strings() const { return strings_; }
  const std::vector<uint8_t>& raw() const { return raw_; }
  const std::vector<Value>& items() const { return items_; }

  // A short human-readable rendering ("<array of 512 string>" for arrays).
  std::string to_display() const;

 private:
  static Value integer(ValueType t, int64_t v);

  ValueType type_ = ValueType::kUint8;
  ValueType elem_type_ = ValueType::kUint8;
  int64_t int_ = 0;
  uint64_t uint_ = 0;  // kUint64 only: the exact value (int_ holds it too when it fits)
  double float_ = 0;
  std::string string_;
  std::vector<std::string> strings_;
  std::vector<uint8_t> raw_;
  std::vector<Value> items_;
};

}  // namespace hetmoe::gguf
