// moert-delta: signed delta packages of a model whose routed experts were retrained
// (docs/formats.md, "Delta packages").
//   moert-delta keygen -o NAME                 NAME.key (secret) and NAME.pub (public)
//   moert-delta make OLD.gguf NEW.gguf -o PKG --key SECRET
//   moert-delta apply MODEL.gguf PKG --pub PUBLIC -o NEW.gguf
//   moert-delta verify PKG --pub PUBLIC [MODEL.gguf]
//   moert-delta perturb MODEL.gguf -o NEW.gguf --experts L:E,... [--fraction F] [--seed N]
// A failure gives exit code 1 and one line naming what is wrong.
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/mapped_file.h"
#include "core/status.h"
#include "core/strings.h"
#include "experts/delta_apply.h"
#include "experts/delta_make.h"
#include "experts/delta_package.h"
#include "format/gguf.h"
#include "moert/version.h"

namespace {

using moert::StrCat;
namespace ex = moert::experts;

int Fail(const std::string& message) {
  std::fprintf(stderr, "moert-delta: error: %s\n", message.c_str());
  return 1;
}
int Fail(const absl::Status& status) { return Fail(status.ToString()); }

void PrintUsage() {
  std::printf(
      "usage: moert-delta keygen -o NAME\n"
      "       moert-delta make OLD.gguf NEW.gguf -o PKG --key SECRET\n"
      "       moert-delta apply MODEL.gguf PKG --pub PUBLIC -o NEW.gguf\n"
      "       moert-delta verify PKG --pub PUBLIC [MODEL.gguf]\n"
      "       moert-delta perturb MODEL.gguf -o NEW.gguf --experts L:E[,L:E...] "
      "[--fraction F] [--seed N]\n");
}

// Positional arguments and --flag VALUE pairs.
struct Args {
  std::vector<std::string> positional;
  std::map<std::string, std::string> flags;
};

absl::StatusOr<Args> ParseArgs(int argc, char** argv, int first) {
  Args args;
  for (int i = first; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.size() > 1 && arg[0] == '-') {
      if (i + 1 >= argc) return absl::InvalidArgumentError(StrCat("option '", arg, "' needs a value"));
      args.flags[std::string(arg)] = argv[++i];
    } else {
      args.positional.emplace_back(arg);
    }
  }
  return args;
}

absl::Status WriteFile(const std::string& path, std::span<const uint8_t> bytes, mode_t mode) {
  const std::string temp = path + ".tmp";
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    if (!out.flush()) return absl::InternalError(StrCat("cannot write '", temp, "'"));
  }
  ::chmod(temp.c_str(), mode);
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    std::remove(temp.c_str());
    return absl::InternalError(StrCat("cannot rename '", temp, "' to '", path, "'"));
  }
  return absl::OkStatus();
}

std::string Need(const Args& args, const std::string& flag, absl::Status* status) {
  auto it = args.flags.find(flag);
  if (it == args.flags.end()) {
    if (status->ok()) *status = absl::InvalidArgumentError(StrCat("missing ", flag));
    return "";
  }
  return it->second;
}

absl::Status CheckFlags(const Args& args, std::initializer_list<std::string_view> known,
                        size_t min_positional, size_t max_positional) {
  for (const auto& [flag, value] : args.flags) {
    bool ok = false;
    for (std::string_view k : known) ok = ok || flag == k;
    if (!ok) return absl::InvalidArgumentError(StrCat("unknown option '", flag, "'"));
  }
  if (args.positional.size() < min_positional || args.positional.size() > max_positional) {
    return absl::InvalidArgumentError(StrCat("expected ", min_positional,
                                             min_positional == max_positional ? "" : " or more",
                                             " file arguments, got ", args.positional.size()));
  }
  return absl::OkStatus();
}

std::string Mib(uint64_t bytes) {
  return absl::StrFormat("%.3f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

int Keygen(const Args& args) {
  absl::Status status = CheckFlags(args, {"-o"}, 0, 0);
  const std::string name = Need(args, "-o", &status);
  if (!status.ok()) return Fail(status);
  const ex::KeyPair pair = ex::GenerateKeyPair();
  const std::string secret = ex::ToHex(pair.secret_key) + "\n";
  const std::string pub = ex::ToHex(pair.public_key) + "\n";
  status = WriteFile(name + ".key", std::span(reinterpret_cast<const uint8_t*>(secret.data()), secret.size()), 0600);
  if (status.ok()) {
    status = WriteFile(name + ".pub", std::span(reinterpret_cast<const uint8_t*>(pub.data()), pub.size()), 0644);
  }
  if (!status.ok()) return Fail(status);
  std::printf("secret key: %s.key\npublic key: %s.pub (%s)\n", name.c_str(), name.c_str(),
              ex::ToHex(pair.public_key).c_str());
  return 0;
}

int Make(const Args& args) {
  absl::Status status = CheckFlags(args, {"-o", "--key"}, 2, 2);
  const std::string out = Need(args, "-o", &status);
  const std::string key_path = Need(args, "--key", &status);
  if (!status.ok()) return Fail(status);
  auto key = ex::ReadSecretKeyFile(key_path);
  if (!key.ok()) return Fail(key.status());
  auto base = moert::format::GgufFile::Open(args.positional[0]);
  if (!base.ok()) return Fail(base.status());
  auto target = moert::format::GgufFile::Open(args.positional[1]);
  if (!target.ok()) return Fail(target.status());
  ex::DeltaMakeStats stats;
  auto package = ex::MakeDeltaPackage(**base, **target, *key, &stats);
  if (!package.ok()) return Fail(package.status());
  status = WriteFile(out, *package, 0644);
  if (!status.ok()) return Fail(status);
  std::printf("%s: %zu experts changed (%s of %s of routed experts); package %s (%.2f%% of the "
              "changed experts' bytes; expert frames %s, header frame %llu bytes%s)\n",
              out.c_str(), stats.changed.size(), Mib(stats.changed_expert_bytes).c_str(),
              Mib(stats.all_expert_bytes).c_str(), Mib(stats.package_bytes).c_str(),
              stats.changed_expert_bytes == 0
                  ? 0.0
                  : 100.0 * static_cast<double>(stats.package_bytes) /
                        static_cast<double>(stats.changed_expert_bytes),
              Mib(stats.expert_frame_bytes).c_str(),
              static_cast<unsigned long long>(stats.header_frame_bytes),
              stats.changed_keys.empty()
                  ? ""
                  : StrCat("; metadata changed: ", moert::StrJoin(stats.changed_keys, ", ")).c_str());
  return 0;
}

// The package at `path`, read and checked with the public key at `pub_path`.
struct LoadedPackage {
  std::unique_ptr<moert::core::MappedFile> file;
  ex::DeltaPackage package;
};

absl::StatusOr<LoadedPackage> LoadPackage(const std::string& path, const std::string& pub_path) {
  MOERT_ASSIGN_OR_RETURN(const ex::PublicKey key, ex::ReadPublicKeyFile(pub_path));
  LoadedPackage loaded;
  MOERT_ASSIGN_OR_RETURN(loaded.file, moert::core::MappedFile::Open(path));
  auto package = ex::ParseDeltaPackage(loaded.file->bytes(), key);
  if (!package.ok()) {
    return absl::Status(package.status().code(), StrCat(path, ": ", package.status().message()));
  }
  loaded.package = *std::move(package);
  return loaded;
}

int Apply(const Args& args) {
  absl::Status status = CheckFlags(args, {"-o", "--pub"}, 2, 2);
  const std::string out = Need(args, "-o", &status);
  const std::string pub = Need(args, "--pub", &status);
  if (!status.ok()) return Fail(status);
  auto loaded = LoadPackage(args.positional[1], pub);
  if (!loaded.ok()) return Fail(loaded.status());
  auto result = ex::ApplyDeltaFile(args.positional[0], loaded->package, out);
  if (!result.ok()) return Fail(result.status());
  std::printf("%s: %zu experts updated, %s written\n", out.c_str(), result->experts.size(),
              Mib(result->bytes_written).c_str());
  return 0;
}

int Verify(const Args& args) {
  absl::Status status = CheckFlags(args, {"--pub"}, 1, 2);
  const std::string pub = Need(args, "--pub", &status);
  if (!status.ok()) return Fail(status);
  auto loaded = LoadPackage(args.positional[0], pub);
  if (!loaded.ok()) return Fail(loaded.status());
  const ex::DeltaManifest& m = loaded->package.manifest;
  std::printf("%s: signature OK, version %u, base %s (%llu bytes), target %s (%llu bytes), "
              "%zu experts\n",
              args.positional[0].c_str(), ex::kDeltaVersion, ex::ToHex(m.base_hash).c_str(),
              static_cast<unsigned long long>(m.base_size), ex::ToHex(m.target_hash).c_str(),
              static_cast<unsigned long long>(m.target_size), m.entries.size() - 1);
  if (args.positional.size() == 2) {
    auto model = moert::core::MappedFile::Open(args.positional[1]);
    if (!model.ok()) return Fail(model.status());
    status = ex::VerifyDelta((*model)->bytes(), loaded->package);
    if (!status.ok()) return Fail(status);
    std::printf("%s: is the package's base; every expert decodes to its checksum\n",
                args.positional[1].c_str());
  }
  return 0;
}

int Perturb(const Args& args) {
  absl::Status status = CheckFlags(args, {"-o", "--experts", "--fraction", "--seed"}, 1, 1);
  const std::string out = Need(args, "-o", &status);
  const std::string list = Need(args, "--experts", &status);
  if (!status.ok()) return Fail(status);
  const auto parsed = ex::ParseExpertList(list);
  if (!parsed.ok()) return Fail(StrCat("--experts: ", parsed.status().message()));
  const std::vector<std::pair<int, int>>& experts = *parsed;
  double fraction = 0.25;
  uint64_t seed = 1;
  try {
    if (args.flags.count("--fraction")) fraction = std::stod(args.flags.at("--fraction"));
    if (args.flags.count("--seed")) seed = std::stoull(args.flags.at("--seed"));
  } catch (const std::exception&) {
    return Fail("--fraction and --seed take numbers");
  }
  auto file = moert::format::GgufFile::Open(args.positional[0]);
  if (!file.ok()) return Fail(file.status());
  auto bytes = ex::PerturbExperts(**file, experts, fraction, seed);
  if (!bytes.ok()) return Fail(bytes.status());
  status = WriteFile(out, *bytes, 0644);
  if (!status.ok()) return Fail(status);
  std::printf("%s: %zu experts perturbed\n", out.c_str(), experts.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    PrintUsage();
    return Fail("expected a command: keygen, make, apply, verify or perturb");
  }
  const std::string_view command = argv[1];
  if (command == "-h" || command == "--help") {
    PrintUsage();
    return 0;
  }
  if (command == "--version") {
    std::printf("moert-delta %s\n", moert_version());
    return 0;
  }
  auto args = ParseArgs(argc, argv, 2);
  if (!args.ok()) return Fail(args.status());
  if (command == "keygen") return Keygen(*args);
  if (command == "make") return Make(*args);
  if (command == "apply") return Apply(*args);
  if (command == "verify") return Verify(*args);
  if (command == "perturb") return Perturb(*args);
  PrintUsage();
  return Fail(StrCat("unknown command '", command, "'"));
}
