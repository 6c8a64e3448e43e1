// Tests of the expert checksums moert-pack writes (moert.expert_xxh64), as the expert
// cache reads them: one per expert, equal to what the loader computes from the packed
// file's bytes, so that a corrupted expert fails its very first load; and of the
// packed model itself: with its experts in a pool it computes the same bits as fully
// resident (W4 and 2:4-sparse W4S24 experts, which the pool hands to the kernels as is).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "core/strings.h"
#include "experts/checksum.h"
#include "experts/expert_cache.h"
#include "experts/expert_directory.h"
#include "experts/loader.h"
#include "format/gguf.h"
#include "format/model_spec.h"
#include "model/model.h"

namespace moert {
namespace {

using experts::ExpertCache;
using experts::ExpertCacheOptions;
using experts::ExpertDirectory;
using experts::ExpertInfo;
using experts::ExpertPart;
using format::GgufFile;

const std::string kOracle = StrCat(MOERT_SHARED_DIR, "/models/tiny-moe-shakespeare-q4_0.gguf");

// Runs moert-pack with `args`; its exit status.
int Pack(const std::string& args) {
  const std::string command = StrCat(MOERT_PACK_COMMAND, " ", args, " 2>/dev/null");
  return std::system(command.c_str());
}

// Unique per process: ctest runs each test of this binary as its own process, in
// parallel.
std::string TempPath(const std::string& name) {
  return StrCat(::testing::TempDir(), "/", getpid(), "_", name);
}

// An open packed file and its expert directory.
struct Packed {
  std::unique_ptr<GgufFile> file;
  std::optional<ExpertDirectory> directory;
};

Packed Open(const std::string& path) {
  Packed packed;
  auto file = GgufFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return packed;
  packed.file = std::move(*file);
  auto spec = format::ReadModelSpec(*packed.file);
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (!spec.ok()) return packed;
  auto dir =
      ExpertDirectory::Build(*packed.file, static_cast<int>(spec->n_layer),
                             static_cast<int>(spec->n_expert), spec->n_embd, spec->n_ff_expert);
  EXPECT_TRUE(dir.ok()) << dir.status();
  if (dir.ok()) packed.directory.emplace(std::move(*dir));
  return packed;
}

// A cache whose pool holds two of the largest experts: loading every expert once
// evicts all along, and every load is checked against the stored checksum.
std::unique_ptr<ExpertCache> SmallCache(const ExpertDirectory& dir) {
  ExpertCacheOptions options;
  options.pool_bytes =
      2 * ExpertCache::BlockBytes(dir.max_runtime_bytes(), options.min_block_bytes);
  options.loader.mode = experts::IoMode::kBuffered;
  auto cache = ExpertCache::Create(dir, options);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return cache.ok() ? std::move(*cache) : nullptr;
}

// The oracle model, packed by moert-pack with the parameter's options.
class PackChecksums : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    path_ = TempPath("pack_test.gguf");
    ASSERT_EQ(Pack(StrCat(kOracle, " ", path_, " ", GetParam())), 0) << GetParam();
  }
  void TearDown() override {
    std::filesystem::remove(path_);
    std::filesystem::remove(path_ + ".corrupt");
  }
  std::string path_;
};

TEST_P(PackChecksums, OnePerExpertEqualToTheLoaders) {
  const Packed packed = Open(path_);
  ASSERT_TRUE(packed.directory.has_value());
  const ExpertDirectory& dir = *packed.directory;
  ASSERT_EQ(dir.pooled_layers(), dir.n_layer());  // every layer of the oracle is MoE
  auto loader = experts::Loader::Create(dir, {.mode = experts::IoMode::kBuffered});
  ASSERT_TRUE(loader.ok()) << loader.status();
  std::unique_ptr<uint8_t, decltype(&std::free)> block(
      static_cast<uint8_t*>(std::aligned_alloc(64, (dir.max_runtime_bytes() + 63) / 64 * 64)),
      &std::free);
  std::vector<uint64_t> seen;
  for (int l = 0; l < dir.n_layer(); ++l) {
    for (int e = 0; e < dir.n_expert(); ++e) {
      SCOPED_TRACE(StrCat("layer ", l, ", expert ", e));
      const std::optional<uint64_t> stored = dir.stored_checksum(l, e);
      ASSERT_TRUE(stored.has_value());
      // The bytes the directory says the expert has, hashed here.
      const ExpertInfo& info = dir.info(l, e);
      std::span<const uint8_t> parts[3];
      for (size_t p = 0; p < 3; ++p) {
        const ExpertPart& part = info.parts[p];
        EXPECT_TRUE(part.packed_in_file) << part.tensor;
        parts[p] = packed.file->bytes().subspan(part.file_offset, part.file_bytes);
      }
      EXPECT_EQ(*stored, experts::ExpertChecksum(parts[0], parts[1], parts[2]));
      // What the loader computes when it reads them.
      experts::LoadResult r = (*loader)->Wait((*loader)->Submit(info, block.get(), std::nullopt));
      ASSERT_TRUE(r.status.ok()) << r.status;
      EXPECT_EQ(r.checksum, *stored);
      seen.push_back(*stored);
    }
  }
  EXPECT_EQ(std::set<uint64_t>(seen.begin(), seen.end()).size(), seen.size())
      << "two experts with one checksum";

  // Every expert through a small cache, verified against the stored checksums.
  std::unique_ptr<ExpertCache> cache = SmallCache(dir);
  ASSERT_NE(cache, nullptr);
  for (int l = 0; l < dir.n_layer(); ++l) {
    for (int e = 0; e < dir.n_expert(); ++e) {
      auto view = cache->Acquire(l, e);
      ASSERT_TRUE(view.ok()) << view.status();
      cache->Release(l, e);
    }
  }
  EXPECT_EQ(cache->stats().loads, dir.expert_count());
  EXPECT_EQ(cache->stats().failed_loads, 0u);
}

// One byte of one expert's down matrix flipped: that expert's first load is DataLoss
// naming it (without stored checksums it would load the bad bytes and trust them);
// every other expert loads.
TEST_P(PackChecksums, CorruptExpertFailsItsFirstLoad) {
  constexpr int kLayer = 2, kExpert = 5;
  uint64_t offset = 0;
  {
    const Packed packed = Open(path_);
    ASSERT_TRUE(packed.directory.has_value());
    const ExpertPart& down = packed.directory->info(kLayer, kExpert).parts[2];
    offset = down.file_offset + down.file_bytes / 2;
  }
  const std::string corrupt = path_ + ".corrupt";
  std::filesystem::copy_file(path_, corrupt, std::filesystem::copy_options::overwrite_existing);
  {
    std::fstream f(corrupt, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    f.seekg(static_cast<std::streamoff>(offset));
    char byte = 0;
    f.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x01);
    f.seekp(static_cast<std::streamoff>(offset));
    f.write(&byte, 1);
    ASSERT_TRUE(f.good());
  }
  const Packed packed = Open(corrupt);
  ASSERT_TRUE(packed.directory.has_value());
  const ExpertDirectory& dir = *packed.directory;
  std::unique_ptr<ExpertCache> cache = SmallCache(dir);
  ASSERT_NE(cache, nullptr);
  auto bad = cache->Acquire(kLayer, kExpert);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  const std::string message(bad.status().message());
  EXPECT_NE(message.find(StrCat("layer ", kLayer, ", expert ", kExpert)), std::string::npos)
      << message;
  EXPECT_NE(message.find("checksum mismatch"), std::string::npos) << message;
  EXPECT_FALSE(cache->IsResident(kLayer, kExpert));
  for (int l = 0; l < dir.n_layer(); ++l) {
    for (int e = 0; e < dir.n_expert(); ++e) {
      if (l == kLayer && e == kExpert) continue;
      auto view = cache->Acquire(l, e);
      ASSERT_TRUE(view.ok()) << "layer " << l << ", expert " << e << ": " << view.status();
      cache->Release(l, e);
    }
  }
  EXPECT_EQ(cache->stats().failed_loads, 1u);
}

// Prefill then 6 greedy decode steps of the packed model; every logit, in order, and
// the model's memory stats after them.
std::vector<float> GreedyLogits(const GgufFile& file, const model::ModelLoadOptions& options,
                                model::MemoryStats* stats) {
  auto m = model::Model::Load(file, options);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return {};
  auto kv = (*m)->NewKvCache(64);
  EXPECT_TRUE(kv.ok()) << kv.status();
  if (!kv.ok()) return {};
  std::vector<int32_t> tokens;
  for (int i = 0; i < 24; ++i) tokens.push_back((7 * i + 3) % 50);
  std::vector<float> all, logits;
  EXPECT_TRUE((*m)->Forward(tokens, kv->get(), model::LogitsFor::kAll, &logits).ok());
  all.insert(all.end(), logits.begin(), logits.end());
  for (int step = 0; step < 6; ++step) {
    const size_t n_vocab = logits.size() / (step == 0 ? tokens.size() : 1);
    const auto last = logits.end() - static_cast<std::ptrdiff_t>(n_vocab);
    const int32_t next = static_cast<int32_t>(std::max_element(last, logits.end()) - last);
    const int32_t one[1] = {next};
    EXPECT_TRUE((*m)->Forward(one, kv->get(), model::LogitsFor::kLast, &logits).ok());
    all.insert(all.end(), logits.begin(), logits.end());
  }
  *stats = (*m)->memory_stats();
  return all;
}

TEST_P(PackChecksums, ExpertPoolGivesTheResidentBits) {
  const Packed packed = Open(path_);
  ASSERT_NE(packed.file, nullptr);
  model::ModelLoadOptions options;
  options.threads = 2;
  options.kv_cache_positions = 64;
  options.router.alpha = 0;  // no residency penalty: the same experts as resident
  // The experts are in the parameter's layout.
  const std::string want_type = std::string(GetParam()).empty() ? "moert_w4" : "moert_w4s24";
  const format::GgufTensorInfo* up = packed.file->FindTensor("blk.0.ffn_up_exps.weight");
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(format::GgmlTypeName(up->type), want_type);
  // --sparse-attn: the attention projections too; else they stay as IN has them.
  const bool sparse_attn = std::string(GetParam()).find("--sparse-attn") != std::string::npos;
  auto in = GgufFile::Open(kOracle);
  ASSERT_TRUE(in.ok()) << in.status();
  for (const char* name : {"blk.1.attn_q.weight", "blk.1.attn_k.weight", "blk.1.attn_v.weight",
                           "blk.1.attn_output.weight"}) {
    const format::GgufTensorInfo* t = packed.file->FindTensor(name);
    const format::GgufTensorInfo* t_in = (*in)->FindTensor(name);
    ASSERT_NE(t, nullptr) << name;
    ASSERT_NE(t_in, nullptr) << name;
    EXPECT_EQ(std::string(format::GgmlTypeName(t->type)),
              sparse_attn ? "moert_w4s24" : format::GgmlTypeName(t_in->type))
        << name;
  }
  model::MemoryStats stats;
  const std::vector<float> resident = GreedyLogits(*packed.file, options, &stats);
  ASSERT_FALSE(resident.empty());
  EXPECT_FALSE(stats.expert_pool);
  options.expert_pool_fraction = 0.25;
  options.io_mode = experts::IoMode::kBuffered;
  const std::vector<float> pooled = GreedyLogits(*packed.file, options, &stats);
  EXPECT_TRUE(stats.expert_pool);
  EXPECT_GT(stats.pool.evictions, 0u);  // a quarter of the experts: loads all along
  ASSERT_EQ(pooled.size(), resident.size());
  EXPECT_EQ(std::memcmp(pooled.data(), resident.data(), resident.size() * sizeof(float)), 0);
}

// Dense (lossless W4), 2:4 pruned by magnitude (W4S24: packed, then pruned), and 2:4 with
// the attention projections pruned too (--sparse-attn).
INSTANTIATE_TEST_SUITE_P(Modes, PackChecksums,
                         ::testing::Values("", "--sparsity 2:4", "--sparsity 2:4 --sparse-attn"),
                         [](const ::testing::TestParamInfo<const char*>& param) {
                           const std::string p = param.param;
                           return p.empty()                                       ? "Dense"
                                  : p.find("--sparse-attn") != std::string::npos ? "Sparse24Attn"
                                                                                 : "Sparse24";
                         });

}  // namespace
}  // namespace moert
