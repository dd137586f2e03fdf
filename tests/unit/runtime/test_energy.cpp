// bench's energy meter on a made-up powercap tree: packages summed, sub-zones skipped, a wrapped counter unwrapped;
// and the modelled figure where nothing is readable.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "runtime/device/energy.h"
#include "tests/support/temp_dir.h"

namespace hetmoe::device {
namespace {

namespace fs = std::filesystem;

void write(const fs::path& p, uint64_t v) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << v << "\n";
}

TEST(Energy, RaplPackagesAreSummedAndUnwrapped) {
  const fs::path root = test_support::temp_dir("hetmoe_energy_") / "powercap";
  write(root / "intel-rapl:0" / "energy_uj", 1'000'000);
  write(root / "intel-rapl:0" / "max_energy_range_uj", 4'000'000);
  write(root / "intel-rapl:1" / "energy_uj", 0);
  write(root / "intel-rapl:0:0" / "energy_uj", 0);  // a sub-zone (cores) of package 0: not counted again
  EnergyMeter m(root.string(), /*gpu=*/false);
  ASSERT_TRUE(m.measured());
  EXPECT_EQ(m.source(), "RAPL, 2 packages");
  write(root / "intel-rapl:0" / "energy_uj", 3'000'000);
  write(root / "intel-rapl:1" / "energy_uj", 500'000);
  write(root / "intel-rapl:0:0" / "energy_uj", 9'000'000);
  EXPECT_DOUBLE_EQ(m.joules(), 2.5);
  write(root / "intel-rapl:0" / "energy_uj", 500);  // wrapped past 4 J
  EXPECT_NEAR(m.joules(), 2.5 + 1.0005, 1e-9);
}

TEST(Energy, NothingReadableMeansTheModelledFigure) {
  EnergyMeter m((test_support::temp_dir("hetmoe_energy_") / "none").string(), /*gpu=*/false);
  EXPECT_FALSE(m.measured());
  EXPECT_EQ(m.source(), kModelledEnergy);
  EXPECT_DOUBLE_EQ(m.joules(), 0.0);
  // 2 cores: 19 W for 0.1 s, plus 1 GB at 60 pJ per byte.
  EXPECT_NEAR(modelled_joules_per_token(2, 0.1, 1e9), 1.9 + 0.06, 1e-12);
}

}  // namespace
}  // namespace hetmoe::device
