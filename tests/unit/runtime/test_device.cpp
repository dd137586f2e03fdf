// The Device interface on the emulated device: capacity, copies and their counts, the modelled link, ordering
// within and across streams, host callbacks, failures, and the ops against the CPU reference.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "quant/ref.h"
#include "runtime/device/device.h"
#include "runtime/error.h"
#include "tests/support/device_checks.h"

namespace hetmoe::device {
namespace {

TEST(EmulatedDevice, SaysEmulatedAndEnforcesItsCapacity) {
  auto d = make_emulated_device({.capacity = 1000});
  EXPECT_TRUE(d->emulated());
  EXPECT_NE(d->name().find("emulated"), std::string::npos);
  {
    DeviceMemory a(*d, 600);
    EXPECT_EQ(d->used(), 600u);
    EXPECT_THROW(DeviceMemory(*d, 401), Error);
    DeviceMemory b(*d, 400);
    EXPECT_EQ(d->used(), 1000u);
  }
  EXPECT_EQ(d->used(), 0u);
}

TEST(EmulatedDevice, CopiesRoundTripAndAreCounted) {
  auto d = make_emulated_device({});
  const int s = d->create_stream();
  std::vector<float> host(1000), back(1000, -1.0f);
  std::iota(host.begin(), host.end(), 0.0f);
  DeviceMemory mem(*d, host.size() * sizeof(float));
  d->copy_to_device(s, mem.get(), host.data(), host.size() * sizeof(float));
  d->copy_to_host(s, back.data(), mem.get(), back.size() * sizeof(float));
  d->synchronize(d->record(s));
  EXPECT_EQ(back, host);
  const TransferStats t = d->transfers();
  EXPECT_EQ(t.to_device_bytes, 4000u);
  EXPECT_EQ(t.to_host_bytes, 4000u);
  EXPECT_EQ(t.to_device_copies, 1u);
  EXPECT_EQ(t.to_host_copies, 1u);
  EXPECT_EQ(t.link_seconds, 0.0);
}

TEST(EmulatedDevice, ThrottledLinkTakesBandwidthAndLatency) {
  // 1 MB at 1 GB/s plus 2 ms latency: at least 3 ms, modelled exactly.
  auto d = make_emulated_device({.link_gb_s = 1.0, .link_latency_us = 2000});
  const int s = d->create_stream();
  std::vector<uint8_t> host(1'000'000, 7);
  DeviceMemory mem(*d, host.size());
  const auto start = std::chrono::steady_clock::now();
  d->copy_to_device(s, mem.get(), host.data(), host.size());
  d->synchronize();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(took, 0.003);
  EXPECT_NEAR(d->transfers().link_seconds, 0.003, 1e-9);
}

// Work on a stream waits for an event of another: the compute stream's op sees the copy stream's data. (Without
// the wait the add would run at once, while the slow copy of a is still asleep, and read memory never written.)
TEST(EmulatedDevice, EventsOrderStreamsAndHostCallbacksRunInOrder) {
  auto d = make_emulated_device({.link_gb_s = 0.5, .link_latency_us = 5000});  // a slow copy
  const int compute = d->create_stream(), copy = d->create_stream();
  std::vector<float> a(4096, 1.5f), b(4096, 2.0f), out(4096);
  DeviceMemory da(*d, a.size() * 4), db(*d, b.size() * 4);
  d->copy_to_device(compute, db.get(), b.data(), b.size() * 4);
  d->synchronize();
  d->copy_to_device(copy, da.get(), a.data(), a.size() * 4);
  d->wait(compute, d->record(copy));
  d->add(compute, da.as<float>(), 4096, db.as<float>());  // b += a, only after the copy of a
  std::vector<int> order;
  d->host_callback(compute, [&] { order.push_back(1); });
  d->copy_to_host(compute, out.data(), db.get(), out.size() * 4);
  d->host_callback(compute, [&] { order.push_back(2); });
  d->synchronize(d->record(compute));
  for (float v : out) ASSERT_EQ(v, 3.5f);
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
}

TEST(EmulatedDevice, AFailureReachesSynchronizeAndLaterWorkStillRuns) {
  auto d = make_emulated_device({});
  const int s = d->create_stream();
  std::atomic<bool> later{false};
  d->host_callback(s, [] { throw Error("boom"); });
  d->host_callback(s, [&] { later = true; });
  EXPECT_THROW(d->synchronize(d->record(s)), Error);
  EXPECT_TRUE(later);
  EXPECT_NO_THROW(d->synchronize());  // reported once
}

// Leaving a scope early still waits for the device work it queued: the host buffer stays valid until the copy ran.
TEST(EmulatedDevice, PendingWorkWaitsEvenWhenTheScopeIsLeftByAnException) {
  auto d = make_emulated_device({.link_gb_s = 0.1, .link_latency_us = 20000});  // a 20 ms copy
  const int s = d->create_stream();
  DeviceMemory mem(*d, 4096);
  std::atomic<bool> copied{false};
  try {
    std::vector<uint8_t> host(4096, 1);
    d->copy_to_device(s, mem.get(), host.data(), host.size());
    d->host_callback(s, [&] { copied = true; });
    device::PendingWork pending(*d, s);
    throw Error("host side failed");
  } catch (const Error&) {
    EXPECT_TRUE(copied);  // the guard waited before `host` went away
  }
}

TEST(EmulatedDevice, MatmulAndSiluMatchTheReference) {
  auto d = make_emulated_device({});
  const int s = d->create_stream();
  test_support::check_matmul_and_silu(*d, s, quant::GgmlType::HQ2_G64, 256, 24, 3, 1e-5, 5);
  test_support::check_matmul_and_silu(*d, s, quant::GgmlType::HQ4_G128, 1408, 17, 5, 1e-5, 6);
  // Q4_K's activations go through Q8_K (8 bits); the low-bit types take them as floats.
  test_support::check_matmul_and_silu(*d, s, quant::GgmlType::Q4_K, 256, 24, 3, 2e-2, 7);
}

// The op harness: every layer op against the CPU reference.
TEST(EmulatedDevice, LayerOpsMatchTheCpuReference) {
  auto d = make_emulated_device({});
  test_support::check_layer_ops(*d, d->create_stream(), 1e-5);
}

}  // namespace
}  // namespace hetmoe::device
