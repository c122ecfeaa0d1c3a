#include "tests/unit/chat/jinja2_reference.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "tests/testing/child_process.h"
#include "tests/testing/model_files.h"

namespace tandem::testing {

absl::StatusOr<std::vector<Jinja2Result>> RenderWithJinja2(const std::vector<Jinja2Job>& jobs) {
  {
    Child probe({"python3", "-c", "import jinja2"});
    if (probe.pid() < 0 || probe.Wait(absl::Seconds(30)) != 0) {
      return absl::UnavailableError(
          "python3 with the jinja2 module is not installed "
          "(apt-get install python3-jinja2)");
    }
  }
  nlohmann::ordered_json in = nlohmann::ordered_json::array();
  for (const Jinja2Job& job : jobs) {
    in.push_back(
        {{"template", job.source}, {"context", job.context}, {"now", job.now_unix_seconds}});
  }
  const std::string dir = TempDir();
  const std::string in_path = dir + "/jobs.json";
  const std::string out_path = dir + "/results.json";
  {
    std::ofstream f(in_path, std::ios::binary);
    f << in.dump();
  }
  Child child({"python3", TANDEM_JINJA_REFERENCE_SCRIPT, in_path, out_path}, dir + "/python.log");
  const int rc = child.Wait(absl::Seconds(120));
  std::ifstream log(dir + "/python.log");
  std::stringstream log_text;
  log_text << log.rdbuf();
  if (rc != 0) {
    return absl::InternalError(
        absl::StrCat("render_reference.py exited with ", rc, ": ", log_text.str()));
  }
  std::ifstream f(out_path, std::ios::binary);
  std::stringstream text;
  text << f.rdbuf();
  const nlohmann::json out = nlohmann::json::parse(text.str(), nullptr, false);
  if (!out.is_array() || out.size() != jobs.size()) {
    return absl::InternalError("render_reference.py wrote no usable results");
  }
  std::vector<Jinja2Result> results;
  for (const auto& r : out) {
    Jinja2Result res;
    res.ok = r.value("ok", false);
    res.output = r.value("output", "");
    res.error = r.value("error", "");
    results.push_back(std::move(res));
  }
  return results;
}

}  // namespace tandem::testing
