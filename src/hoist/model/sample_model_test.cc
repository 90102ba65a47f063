#include "hoist/model/sample_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "hoist/base/bytes.h"
#include "hoist/save_plan.h"

namespace hoist {
namespace {

TEST(SampleModelTest, Gpt2SmallHasItsParameterCount) {
  GptConfig config;
  config.vocab = 50257;
  // GPT-2 small: 124,439,808 parameters with tied embeddings.
  EXPECT_EQ(GptParameterCount(config), 124439808);
}

TEST(SampleModelTest, PlansOnA2x4MeshWithAdam) {
  Mesh mesh = *Mesh::Create({"data", "model"}, {2, 4});
  absl::StatusOr<std::vector<ArraySpec>> model = GptModel({}, mesh);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->size(), 3u * (2 + 12 * 12 + 2) + 1);
  EXPECT_EQ(model->back().name, "opt/count");
  EXPECT_EQ((*model)[0].name, "params/wte");
  EXPECT_EQ((*model)[148].name, "opt/mu/wte");
  absl::StatusOr<SavePlan> plan = MakeSavePlan(*model, Topology::Uniform(2, 4));
  ASSERT_TRUE(plan.ok()) << plan.status();
  const PlanSummary summary = Summarize(*plan, Topology::Uniform(2, 4));
  EXPECT_EQ(summary.total_bytes, (3 * 124439808 + 1) * int64_t{4} - 3 * 0);
}

TEST(SampleModelTest, ConfigForBytesComesClose) {
  for (int64_t target : {kGiB / 4, 2 * kGiB, 8 * kGiB}) {
    GptConfig config = GptConfigForBytes(target);
    const double bytes = 3.0 * 4 * GptParameterCount(config);
    EXPECT_NEAR(bytes / target, 1.0, 0.15) << target;
  }
}

TEST(SampleModelTest, MeshWithoutModelAxisIsRejected) {
  Mesh mesh = *Mesh::Create({"x"}, {8});
  EXPECT_THAT(GptModel({}, mesh).status().message(),
              ::testing::HasSubstr("'data' and 'model'"));
}

}  // namespace
}  // namespace hoist
