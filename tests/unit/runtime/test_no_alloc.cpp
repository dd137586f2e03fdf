// The decode loop allocates nothing once warm: every heap allocation of the process is counted while a few
// single-token forward passes run (all threads: the global operator new of this test binary counts them).
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <new>
#include <vector>

#include "runtime/model/model.h"

namespace {

std::atomic<bool> g_counting{false};
std::atomic<long> g_allocations{0};

}  // namespace

// Every form of operator new and delete is replaced, so all allocations go to malloc/free (and ASan sees one
// family): plain, array, nothrow (std::stable_sort's temporary buffer) and over-aligned.
namespace {

void* counted_alloc(std::size_t size, std::size_t align) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (size == 0) size = 1;
  if (align <= alignof(std::max_align_t)) return std::malloc(size);
  return std::aligned_alloc(align, (size + align - 1) / align * align);
}

void* counted_or_throw(std::size_t size, std::size_t align) {
  if (void* p = counted_alloc(size, align)) return p;
  throw std::bad_alloc();
}

}  // namespace

void* operator new(std::size_t size) { return counted_or_throw(size, 0); }
void* operator new[](std::size_t size) { return counted_or_throw(size, 0); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept { return counted_alloc(size, 0); }
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept { return counted_alloc(size, 0); }
void* operator new(std::size_t size, std::align_val_t a) { return counted_or_throw(size, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t size, std::align_val_t a) {
  return counted_or_throw(size, static_cast<std::size_t>(a));
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace hetmoe {
namespace {

namespace fs = std::filesystem;

TEST(DecodeLoop, AllocatesNothingOnceWarm) {
  for (const char* name : {"tiny-deepseek3-Q4_K_M.gguf", "tiny-deepseek2lite-Q4_K_M.gguf", "tiny-qwen3moe-Q4_K_M.gguf",
                           "tiny-mixtral-Q4_K_M.gguf"}) {
    auto m = model::Model::load((fs::path(HETMOE_TEST_DATA_DIR) / "models" / name).string(), 2);
    model::KvCache cache = m->make_cache(64);
    std::vector<float> logits;
    const std::vector<int32_t> prompt = {3, 17, 42, 100, 7};
    m->forward(prompt, 0, cache, false, logits);
    int64_t pos = static_cast<int64_t>(prompt.size());
    // Warm-up: the first decode steps size the scratch buffers (the attention span grows by one key per step).
    for (int i = 0; i < 3; ++i, ++pos) {
      const int32_t token = 11 + i;
      m->forward({&token, 1}, pos, cache, false, logits);
    }
    g_allocations = 0;
    g_counting = true;
    for (int i = 0; i < 5; ++i, ++pos) {
      const int32_t token = 20 + i;
      m->forward({&token, 1}, pos, cache, false, logits);
    }
    g_counting = false;
    EXPECT_EQ(g_allocations.load(), 0) << name << ": allocations in 5 decode steps";
  }
}

}  // namespace
}  // namespace hetmoe
