// The summary table, JSON result and HTML report.
#include "tools/bench/report.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::bench {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

RunResult MakeRun(double rate) {
  RunResult run;
  run.options.request_rate = rate;
  run.options.slo.ttft = 0.2;
  run.records = {{.start = 0.0,
                  .success = true,
                  .error = "",
                  .ttft = 0.1,
                  .e2e = 0.5,
                  .prompt_tokens = 10,
                  .output_tokens = 5,
                  .itls = {0.1, 0.1, 0.1, 0.1}},
                 {.start = 0.5,
                  .success = true,
                  .error = "",
                  .ttft = 0.3,
                  .e2e = 0.3,
                  .prompt_tokens = 20,
                  .output_tokens = 1,
                  .itls = {}},
                 {.start = 1.0,
                  .success = false,
                  .error = "UNAVAILABLE: <gone>",
                  .ttft = 0,
                  .e2e = 0,
                  .prompt_tokens = 0,
                  .output_tokens = 0,
                  .itls = {}}};
  run.metrics = ComputeMetrics(run.records, 2.0, run.options.slo);
  return run;
}

TEST(ReportTest, SummaryTableHasVllmRows) {
  const std::string t = SummaryTable(MakeRun(4));
  EXPECT_THAT(t, HasSubstr("Successful requests:                    2"));
  EXPECT_THAT(t, HasSubstr("Failed requests:                        1"));
  EXPECT_THAT(t, HasSubstr("Request goodput (req/s):                0.50"));
  EXPECT_THAT(t, HasSubstr("Mean TTFT (ms):                         200.00"));
  EXPECT_THAT(t, HasSubstr("Mean TPOT (ms):                         100.00"));
  EXPECT_THAT(t, HasSubstr("error: UNAVAILABLE"));
}

TEST(ReportTest, JsonHasMetricsConfigAndRecords) {
  const nlohmann::json j = ResultJson({MakeRun(4)}, {{"target", "null://"}});
  EXPECT_EQ(j["completed"], 2);
  EXPECT_EQ(j["failed"], 1);
  EXPECT_DOUBLE_EQ(j["request_throughput"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j["request_goodput"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(j["ttft_ms"]["median"].get<double>(), 200);
  EXPECT_DOUBLE_EQ(j["tpot_ms"]["p99"].get<double>(), 100);
  EXPECT_TRUE(j["itl_ms"].contains("std"));
  EXPECT_EQ(j["config"]["target"], "null://");
  ASSERT_EQ(j["runs"].size(), 1u);
  const auto& req = j["runs"][0]["requests"];
  ASSERT_EQ(req.size(), 3u);
  EXPECT_DOUBLE_EQ(req[1]["start"].get<double>(), 0.5);
  EXPECT_EQ(req[0]["itls"].size(), 4u);
  EXPECT_EQ(req[2]["error"], "UNAVAILABLE: <gone>");
}

TEST(ReportTest, HtmlIsSelfContainedWithCharts) {
  const std::string html = HtmlReport({MakeRun(4)}, {{"target", "x<y"}});
  EXPECT_THAT(html, HasSubstr("<svg"));
  EXPECT_THAT(html, HasSubstr("TTFT CDF"));
  EXPECT_THAT(html, HasSubstr("E2E latency CDF"));
  EXPECT_THAT(html, HasSubstr("TTFT over time"));
  EXPECT_THAT(html, HasSubstr("TPOT over time"));
  EXPECT_THAT(html, HasSubstr("<polyline"));
  EXPECT_THAT(html, HasSubstr("<circle"));
  EXPECT_THAT(html, HasSubstr("<td>200.00</td>"));  // mean TTFT
  EXPECT_THAT(html, HasSubstr("x&lt;y"));           // escaped
  EXPECT_THAT(html, Not(HasSubstr("<script")));
  EXPECT_THAT(html, Not(HasSubstr("http")));
  EXPECT_THAT(html, Not(HasSubstr("Throughput vs request rate")));
}

TEST(ReportTest, SweepAddsRateCharts) {
  const std::string html = HtmlReport({MakeRun(1), MakeRun(2), MakeRun(4)}, {});
  EXPECT_THAT(html, HasSubstr("Throughput vs request rate"));
  EXPECT_THAT(html, HasSubstr("TTFT vs request rate"));
  EXPECT_THAT(html, HasSubstr("2 req/s"));
  const std::string table = SweepTable({MakeRun(1), MakeRun(2)});
  EXPECT_THAT(table, HasSubstr("TTFT p99"));
}

}  // namespace
}  // namespace tandem::bench
