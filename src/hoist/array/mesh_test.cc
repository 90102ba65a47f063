#include "hoist/mesh.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace hoist {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(MeshTest, DefaultDeviceIdsAreRowMajorPositions) {
  absl::StatusOr<Mesh> mesh = Mesh::Create({"data", "model"}, {2, 4});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_EQ(mesh->num_devices(), 8);
  EXPECT_THAT(mesh->device_ids(), ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
  EXPECT_THAT(mesh->Coords(6), ElementsAre(1, 2));
  EXPECT_EQ(mesh->AxisIndex("model"), 1);
  EXPECT_EQ(mesh->AxisIndex("pipe"), std::nullopt);
  EXPECT_EQ(mesh->ToString(), "Mesh(data=2, model=4)");
}

TEST(MeshTest, CustomDeviceIdsAreKept) {
  absl::StatusOr<Mesh> mesh = Mesh::Create({"x"}, {3}, {7, 3, 5});
  ASSERT_TRUE(mesh.ok());
  EXPECT_THAT(mesh->device_ids(), ElementsAre(7, 3, 5));
}

TEST(MeshTest, CopiesAreEqualAndOtherDevicesAreNot) {
  const Mesh mesh = *Mesh::Create({"x", "y"}, {2, 2});
  const Mesh copy = mesh;
  EXPECT_EQ(copy, mesh);
  EXPECT_EQ(copy.device_ids(), mesh.device_ids());
  EXPECT_EQ(*Mesh::Create({"x", "y"}, {2, 2}), mesh);  // built apart
  EXPECT_FALSE(*Mesh::Create({"x", "y"}, {2, 2}, {3, 2, 1, 0}) == mesh);
  EXPECT_FALSE(*Mesh::Create({"x", "z"}, {2, 2}) == mesh);
}

TEST(MeshTest, InvalidMeshesAreRejectedWithTheReason) {
  EXPECT_THAT(Mesh::Create({"a", "a"}, {2, 2}).status().message(),
              HasSubstr("more than once"));
  EXPECT_THAT(Mesh::Create({"a"}, {0}).status().message(), HasSubstr("size 0"));
  EXPECT_THAT(Mesh::Create({""}, {2}).status().message(),
              HasSubstr("empty name"));
  EXPECT_THAT(Mesh::Create({"a"}, {2}, {1, 1}).status().message(),
              HasSubstr("device 1 more than once"));
  EXPECT_THAT(Mesh::Create({"a"}, {2}, {0, 1, 2}).status().message(),
              HasSubstr("needs 2 device ids, got 3"));
  EXPECT_THAT(Mesh::Create({"a", "b"}, {2}).status().message(),
              HasSubstr("2 axis names but 1 axis sizes"));
}

}  // namespace
}  // namespace hoist
