// Reading and writing the hot-set file (see hot_set.h for the format).
#include "experts/hot_set.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/strings.h"

namespace moert::experts {
namespace {

constexpr char kMagic[] = "moert-hot";
constexpr int kVersion = 1;
constexpr size_t kMaxLines = size_t{1} << 22;

}  // namespace

std::string HotSetPath(const std::string& model_path) { return model_path + ".moert-hot"; }

absl::Status WriteHotSet(const std::string& path, const HotSetModel& model,
                         std::span<const HotExpert> experts) {
  std::string text = StrCat(kMagic, " ", kVersion, "\nmodel ", model.file_size, " ",
                            model.n_layer, " ", model.n_expert, "\n");
  for (const HotExpert& e : experts) StrAppend(&text, e.layer, " ", e.expert, " ", e.uses, "\n");
  const std::string temp = path + ".tmp";
  FILE* f = std::fopen(temp.c_str(), "wb");
  if (f == nullptr) {
    return absl::InternalError(
        StrCat("cannot write the hot set '", temp, "': ", std::strerror(errno)));
  }
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed || std::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(temp.c_str());
    return absl::InternalError(
        StrCat("cannot write the hot set '", path, "': ", std::strerror(err)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<HotExpert>> ReadHotSet(const std::string& path,
                                                  const HotSetModel& model) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(StrCat("no hot set '", path, "'"));
  std::string line;
  const auto bad = [&](size_t line_no, const std::string& what) {
    return absl::InvalidArgumentError(
        StrCat("hot set '", path, "', line ", line_no, ": ", what));
  };
  if (!std::getline(in, line) || line != StrCat(kMagic, " ", kVersion)) {
    return bad(1, StrCat("expected '", kMagic, " ", kVersion, "'"));
  }
  if (!std::getline(in, line)) return bad(2, "expected 'model SIZE LAYERS EXPERTS'");
  {
    std::istringstream fields(line);
    std::string word;
    uint64_t size = 0;
    int layers = 0, experts = 0;
    std::string rest;
    if (!(fields >> word >> size >> layers >> experts) || word != "model" || (fields >> rest)) {
      return bad(2, "expected 'model SIZE LAYERS EXPERTS'");
    }
    if (size != model.file_size || layers != model.n_layer || experts != model.n_expert) {
      return absl::FailedPreconditionError(
          StrCat("hot set '", path, "' belongs to another model (", size, " bytes, ", layers,
                 " layers, ", experts, " experts; this one: ", model.file_size, " bytes, ",
                 model.n_layer, " layers, ", model.n_expert, " experts)"));
    }
  }
  std::vector<HotExpert> out;
  for (size_t line_no = 3; std::getline(in, line); ++line_no) {
    if (line_no > kMaxLines) return bad(line_no, "too many lines");
    std::istringstream fields(line);
    HotExpert e;
    std::string rest;
    if (!(fields >> e.layer >> e.expert >> e.uses) || (fields >> rest)) {
      return bad(line_no, "expected 'LAYER EXPERT USES'");
    }
    if (e.layer < 0 || e.layer >= model.n_layer || e.expert < 0 || e.expert >= model.n_expert) {
      return bad(line_no, StrCat("expert (", e.layer, ", ", e.expert, ") is outside the model"));
    }
    out.push_back(e);
  }
  return out;
}

}  // namespace moert::experts
