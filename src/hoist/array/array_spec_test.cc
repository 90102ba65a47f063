#include "hoist/array_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace hoist {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(TopologyTest, UniformGivesConsecutiveDevices) {
  Topology topology = Topology::Uniform(2, 4);
  EXPECT_EQ(topology.num_processes(), 2);
  EXPECT_EQ(topology.num_devices(), 8);
  EXPECT_THAT(topology.devices(1), ElementsAre(4, 5, 6, 7));
  EXPECT_EQ(topology.ProcessOf(5), 1);
  EXPECT_EQ(topology.ProcessOf(8), std::nullopt);
}

TEST(TopologyTest, RejectsSharedDevicesAndEmptyJobs) {
  EXPECT_THAT(Topology::Create({{0, 1}, {1}}).status().message(),
              HasSubstr("device 1 is owned by both process 0 and 1"));
  EXPECT_EQ(Topology::Create({}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(Topology::Create({{-2}}).ok());
  EXPECT_TRUE(Topology::Create({{0}, {}}).ok());
}

}  // namespace
}  // namespace hoist
