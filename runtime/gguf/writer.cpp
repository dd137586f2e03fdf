#include "runtime/gguf/writer.h"

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <future>
#include <memory>
#include <set>

#include "runtime/error.h"
#include "runtime/gguf/reader.h"
#include "runtime/io/output_file.h"

namespace hetmoe::gguf {

namespace {

class Out {
 public:
  explicit Out(io::OutputFile& f) : f_(f) {}

  void bytes(const void* p, size_t n) {
    f_.write(p, n);
    pos_ += n;
  }
  template <typename T>
  void pod(T v) {
    bytes(&v, sizeof v);
  }
  void string(const std::string& s) {
    pod<uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  void pad_to(uint64_t alignment) {
    static const uint8_t zeros[256] = {};
    uint64_t pad = (alignment - pos_ % alignment) % alignment;
    while (pad) {
      size_t n = pad < sizeof zeros ? pad : sizeof zeros;
      bytes(zeros, n);
      pad -= n;
    }
  }
  uint64_t pos() const { return pos_; }

 private:
  io::OutputFile& f_;
  uint64_t pos_ = 0;
};

void write_value(Out& out, const Value& v) {
  switch (v.type()) {
    case ValueType::kUint8:
      out.pod<uint8_t>(static_cast<uint8_t>(*v.as_int()));
      break;
    case ValueType::kInt8:
      out.pod<int8_t>(static_cast<int8_t>(*v.as_int()));
      break;
    case ValueType::kUint16:
      out.pod<uint16_t>(static_cast<uint16_t>(*v.as_int()));
      break;
    case ValueType::kInt16:
      out.pod<int16_t>(static_cast<int16_t>(*v.as_int()));
      break;
    case ValueType::kUint32:
      out.pod<uint32_t>(static_cast<uint32_t>(*v.as_int()));
      break;
    case ValueType::kInt32:
      out.pod<int32_t>(static_cast<int32_t>(*v.as_int()));
      break;
    case ValueType::kFloat32:
      out.pod<float>(static_cast<float>(*v.as_float()));
      break;
    case ValueType::kBool:
      out.pod<uint8_t>(*v.as_bool() ? 1 : 0);
      break;
    case ValueType::kUint64:
      out.pod<uint64_t>(v.u64_value());
      break;
    case ValueType::kInt64:
      out.pod<int64_t>(*v.as_int());
      break;
    case ValueType::kFloat64:
      out.pod<double>(*v.as_float());
      break;
    case ValueType::kString:
      out.string(*v.as_string());
      break;
    case ValueType::kArray:
      out.pod<uint32_t>(static_cast<uint32_t>(v.elem_type()));
      out.pod<uint64_t>(v.array_size());
      if (v.elem_type() == ValueType::kString) {
        for (const std::string& s : v.strings()) out.string(s);
      } else if (v.elem_type() == ValueType::kArray) {
        for (const Value& item : v.items()) write_value(out, item);
      } else {
        out.bytes(v.raw().data(), v.raw().size());
      }
      break;
  }
}

}  // namespace

void GgufWriter::set(std::string key, Value value) {
  if (key == "general.alignment") {
    auto a = value.as_int();
    if (value.type() != ValueType::kUint32 || !a || *a == 0 || (*a & (*a - 1)) != 0)
      fail("general.alignment must be a u32 power of two");
    alignment_ = static_cast<uint32_t>(*a);
  }
  for (auto& [k, v] : kv_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  kv_.emplace_back(std::move(key), std::move(value));
}

void GgufWriter::add_tensor(std::string name, quant::GgmlType type, std::vector<int64_t> ne, FillFn fill) {
  if (ne.empty() || ne.size() > static_cast<size_t>(kMaxDims))
    fail("tensor {}: {} dimensions (1..{} allowed)", name, ne.size(), kMaxDims);
  for (size_t d = 0; d < ne.size(); ++d)
    if (ne[d] <= 0) fail("tensor {}: dimension {} has size {} (must be positive)", name, d, ne[d]);
  size_t row = quant::row_bytes(type, ne[0]);
  if (row == 0) fail("tensor {}: row of {} elements does not fit type {}", name, ne[0], quant::type_info(type).name);
  // The reader rejects shapes whose element count or byte size overflows; the writer must not produce them.
  uint64_t nbytes = row, elements = static_cast<uint64_t>(ne[0]);
  for (size_t d = 1; d < ne.size(); ++d) {
    if (__builtin_mul_overflow(nbytes, static_cast<uint64_t>(ne[d]), &nbytes) ||
        __builtin_mul_overflow(elements, static_cast<uint64_t>(ne[d]), &elements) ||
        elements > static_cast<uint64_t>(INT64_MAX))
      fail("tensor {}: shape is too large", name);
  }
  for (const PendingTensor& t : tensors_)
    if (t.name == name) fail("duplicate tensor name {}", name);
  tensors_.push_back({std::move(name), type, std::move(ne), nbytes, std::move(fill)});
}

void GgufWriter::add_tensor_bytes(std::string name, quant::GgmlType type, std::vector<int64_t> ne,
                                  std::vector<uint8_t> bytes) {
  auto shared = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  std::string label = name;
  add_tensor(std::move(name), type, std::move(ne), [shared, label](std::span<uint8_t> out) {
    if (out.size() != shared->size()) fail("tensor {}: {} bytes given, {} expected", label, shared->size(), out.size());
    std::memcpy(out.data(), shared->data(), out.size());
  });
}

void GgufWriter::write_file(io::OutputFile& file, const std::vector<std::pair<std::string, Value>>& kv, size_t first,
                            size_t end) const {
  Out out(file);
  out.pod<uint32_t>(kMagic);
  out.pod<uint32_t>(3);
  out.pod<uint64_t>(end - first);
  out.pod<uint64_t>(kv.size());
  for (const auto& [key, value] : kv) {
    out.string(key);
    out.pod<uint32_t>(static_cast<uint32_t>(value.type()));
    write_value(out, value);
  }
  uint64_t offset = 0;
  for (size_t i = first; i < end; ++i) {
    const PendingTensor& t = tensors_[i];
    out.string(t.name);
    out.pod<uint32_t>(static_cast<uint32_t>(t.ne.size()));
    for (int64_t n : t.ne) out.pod<int64_t>(n);
    out.pod<uint32_t>(static_cast<uint32_t>(t.type));
    out.pod<uint64_t>(offset);
    offset += t.nbytes;
    offset += (alignment_ - offset % alignment_) % alignment_;
  }
  out.pad_to(alignment_);
  // Tensor i + 1 is filled while tensor i is written (a fill may compute, as a split's does; a write mostly waits
  // for the disk, the file bypassing the page cache): two buffers, each reused once its write is done.
  // Not cleared between tensors: a fill writes every byte (zeroing a tensor's worth first cost as much as a tenth
  // of a split's time). A buffer only grows.
  struct Buffer {
    std::unique_ptr<uint8_t[]> data;
    size_t capacity = 0, size = 0;
  } buffers[2];
  std::future<void> writing;
  struct Join {  // a fill that throws leaves while a write may still read the other buffer
    std::future<void>& f;
    ~Join() {
      if (f.valid()) f.wait();
    }
  } join{writing};
  for (size_t i = first; i < end; ++i) {
    const PendingTensor& t = tensors_[i];
    Buffer& buffer = buffers[(i - first) % 2];
    if (buffer.capacity < t.nbytes) {
      buffer.data.reset();
      buffer.data = std::make_unique_for_overwrite<uint8_t[]>(t.nbytes);
      buffer.capacity = t.nbytes;
    }
    buffer.size = t.nbytes;
    t.fill(std::span<uint8_t>(buffer.data.get(), buffer.size));
    if (writing.valid()) writing.get();  // rethrows a failed write
    writing = std::async(std::launch::async, [&out, &buffer, this] {
      out.bytes(buffer.data.get(), buffer.size);
      out.pad_to(alignment_);
    });
  }
  if (writing.valid()) writing.get();
}

std::vector<std::string> GgufWriter::write(const std::string& path, uint64_t max_shard_bytes) const {
  // The split keys describe how the file is cut: the writer decides that, whatever the metadata it was given says.
  std::vector<std::pair<std::string, Value>> kv;
  for (const auto& [key, value] : kv_)
    if (key != kSplitCountKey && key != kSplitNoKey && key != kSplitTensorsKey) kv.emplace_back(key, value);
  // Tensors in order, a new shard whenever the next one would take the current one past the limit (a tensor larger
  // than the limit gets a shard of its own).
  std::vector<size_t> starts{0};
  uint64_t in_shard = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const uint64_t bytes = tensors_[i].nbytes + alignment_;
    if (max_shard_bytes > 0 && in_shard > 0 && in_shard + bytes > max_shard_bytes) {
      starts.push_back(i);
      in_shard = 0;
    }
    in_shard += bytes;
  }
  const int count = static_cast<int>(starts.size());
  if (count > 99999) fail("{}: {} shards, more than a shard name can count; use a larger shard size", path, count);
  std::vector<std::string> paths, tmps;
  if (count == 1) {
    paths.push_back(path);
  } else {
    // <prefix>-00001-of-0000N.gguf, as llama.cpp's gguf-split names them.
    const std::string prefix =
        path.size() > 5 && path.compare(path.size() - 5, 5, ".gguf") == 0 ? path.substr(0, path.size() - 5) : path;
    for (int i = 0; i < count; ++i) paths.push_back(shard_path(prefix, i + 1, count));
  }
  // Every shard under a temporary name first; the set is renamed only once all of it is written (an error or a
  // signal before that removes every temporary file: OutputFile).
  std::vector<std::unique_ptr<io::OutputFile>> files;
  for (int i = 0; i < count; ++i) {
    std::vector<std::pair<std::string, Value>> shard_kv;
    if (i == 0) shard_kv = kv;
    if (count > 1) {
      shard_kv.emplace_back(std::string(kSplitNoKey), Value::u16(static_cast<uint16_t>(i)));
      shard_kv.emplace_back(std::string(kSplitTensorsKey), Value::i32(static_cast<int32_t>(tensors_.size())));
      shard_kv.emplace_back(std::string(kSplitCountKey), Value::u16(static_cast<uint16_t>(count)));
    }
    files.push_back(std::make_unique<io::OutputFile>(paths[i], io::OutputFile::Caching::kBypass));
    const size_t end = i + 1 < count ? starts[i + 1] : tensors_.size();
    write_file(*files.back(), shard_kv, starts[i], end);
  }
  // Every shard written out and synced before any is renamed: a full disk fails the set, not its last shard.
  for (auto& file : files) file->prepare();
  for (auto& file : files) file->publish();
  return paths;
}

}  // namespace hetmoe::gguf
