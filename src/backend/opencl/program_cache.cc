// Building OpenCL programs through an in-memory and an on-disk binary cache (see
// program_cache.h).
#include "backend/opencl/program_cache.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "backend/opencl/device.h"
#include "backend/opencl/embedded_sources.h"
#include "core/status.h"
#include "core/cache_dir.h"
#include "core/strings.h"

namespace moert::backend::opencl {
namespace {

// A cached file: magic, the key's second hash (a guard against a first-hash
// collision), the binary size, the binary.
constexpr char kMagic[8] = {'M', 'O', 'E', 'R', 'T', 'C', 'L', '1'};

uint64_t Fnv1a(std::string_view s, uint64_t seed) {
  uint64_t h = seed;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string Hex(uint64_t v) {
  static const char kDigits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<size_t>(i)] = kDigits[v & 15];
  return s;
}

std::string BuildLog(cl_program program, cl_device_id device) {
  size_t size = 0;
  if (clGetProgramBuildInfo(program, device, CL_PROGRAM_BUILD_LOG, 0, nullptr, &size) !=
      CL_SUCCESS) {
    return "<no build log>";
  }
  std::string log(size, '\0');
  clGetProgramBuildInfo(program, device, CL_PROGRAM_BUILD_LOG, size, log.data(), nullptr);
  while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  return log;
}

}  // namespace

std::string DefaultCacheDir() {
  const std::string dir = core::DefaultCacheDir();
  return dir.empty() ? dir : StrCat(dir, "/opencl");
}

ProgramCache::ProgramCache(cl_context context, cl_device_id device, const DeviceInfo& info,
                           std::string base_options, std::string cache_dir)
    : context_(context),
      device_(device),
      device_key_(StrCat(info.platform_name, "\n", info.name, "\n", info.driver_version, "\n",
                         info.device_version, "\n")),
      base_options_(std::move(base_options)),
      cache_dir_(std::move(cache_dir)) {}

ProgramCache::~ProgramCache() {
  for (auto& [key, kernel] : kernels_) clReleaseKernel(kernel);
  for (auto& [key, program] : programs_) clReleaseProgram(program);
}

absl::StatusOr<cl_kernel> ProgramCache::Kernel(std::string_view source, std::string_view kernel,
                                               std::string_view options) {
  const std::optional<std::string_view> common = EmbeddedSource("common");
  const std::optional<std::string_view> text = EmbeddedSource(source);
  if (!common || !text) {
    return absl::NotFoundError(StrCat("OpenCL: no embedded kernel source '", source, ".cl'"));
  }
  std::string program_text = StrCat(*common, "\n", *text);
  MOERT_ASSIGN_OR_RETURN(cl_program program, Build(program_text, options));
  const auto key = std::make_pair(program, std::string(kernel));
  if (auto it = kernels_.find(key); it != kernels_.end()) return it->second;
  cl_int err = CL_SUCCESS;
  const std::string name(kernel);
  cl_kernel k = clCreateKernel(program, name.c_str(), &err);
  MOERT_CL_RETURN_IF_ERROR(err, StrCat("clCreateKernel(", name, ") of ", source, ".cl"));
  kernels_.emplace(key, k);
  return k;
}

absl::StatusOr<cl_program> ProgramCache::Build(std::string_view text, std::string_view options) {
  std::string all_options = base_options_;
  if (!options.empty()) StrAppend(&all_options, " ", options);
  auto key = std::make_pair(std::string(text), all_options);
  if (auto it = programs_.find(key); it != programs_.end()) return it->second;

  std::string path;
  uint64_t guard = 0;
  if (!cache_dir_.empty()) {
    const std::string full = StrCat(device_key_, all_options, "\n", text);
    path = StrCat(cache_dir_, "/", Hex(Fnv1a(full, 0xcbf29ce484222325ull)), ".bin");
    guard = Fnv1a(full, 0x84222325cbf29ce4ull);
    std::ifstream in(path, std::ios::binary);
    if (in) {
      std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
      cl_program program = nullptr;
      uint64_t file_guard = 0, size = 0;
      if (bytes.size() >= 24 && std::equal(kMagic, kMagic + 8, bytes.begin())) {
        std::memcpy(&file_guard, bytes.data() + 8, 8);
        std::memcpy(&size, bytes.data() + 16, 8);
      }
      if (file_guard == guard && size > 0 && size == bytes.size() - 24) {
        const auto* binary = reinterpret_cast<const unsigned char*>(bytes.data() + 24);
        const size_t length = static_cast<size_t>(size);
        cl_int binary_status = CL_SUCCESS;
        cl_int err = CL_SUCCESS;
        program = clCreateProgramWithBinary(context_, 1, &device_, &length, &binary, &binary_status,
                                            &err);
        if (err == CL_SUCCESS && binary_status == CL_SUCCESS &&
            clBuildProgram(program, 1, &device_, all_options.c_str(), nullptr, nullptr) ==
                CL_SUCCESS) {
          ++stats_.disk_hits;
          programs_.emplace(std::move(key), program);
          return program;
        }
        if (program != nullptr) clReleaseProgram(program);
      }
      // A stale or foreign file (driver update, truncated write): rebuilt below and
      // overwritten.
      ++stats_.binaries_rejected;
    }
  }

  const char* src = text.data();
  const size_t length = text.size();
  cl_int err = CL_SUCCESS;
  cl_program program = clCreateProgramWithSource(context_, 1, &src, &length, &err);
  MOERT_CL_RETURN_IF_ERROR(err, "clCreateProgramWithSource");
  err = clBuildProgram(program, 1, &device_, all_options.c_str(), nullptr, nullptr);
  if (err != CL_SUCCESS) {
    const std::string log = BuildLog(program, device_);
    clReleaseProgram(program);
    const absl::Status status = ClStatus(err, "clBuildProgram");
    return absl::Status(status.code(), StrCat(std::string(status.message()),
                                              " (options: ", all_options, "); build log:\n", log));
  }
  ++stats_.source_builds;
  if (!path.empty()) {
    // The cache is an optimisation: a failure to write it is not an error.
    std::error_code ec;
    std::filesystem::create_directories(cache_dir_, ec);
    size_t size = 0;
    if (!ec &&
        clGetProgramInfo(program, CL_PROGRAM_BINARY_SIZES, sizeof(size), &size, nullptr) ==
            CL_SUCCESS &&
        size > 0) {
      std::vector<unsigned char> binary(size);
      unsigned char* ptr = binary.data();
      if (clGetProgramInfo(program, CL_PROGRAM_BINARIES, sizeof(ptr), &ptr, nullptr) ==
          CL_SUCCESS) {
        // Written to a temporary name and renamed: another process never reads half a file.
        const std::string tmp = StrCat(path, ".tmp", getpid());
        {
          std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
          const uint64_t size64 = size;
          out.write(kMagic, 8);
          out.write(reinterpret_cast<const char*>(&guard), 8);
          out.write(reinterpret_cast<const char*>(&size64), 8);
          out.write(reinterpret_cast<const char*>(binary.data()),
                    static_cast<std::streamsize>(size));
        }
        std::filesystem::rename(tmp, path, ec);
        if (ec) {
          std::filesystem::remove(tmp, ec);
        } else {
          ++stats_.disk_writes;
        }
      }
    }
  }
  programs_.emplace(std::move(key), program);
  return program;
}

}  // namespace moert::backend::opencl
