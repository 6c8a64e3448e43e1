// The tracer (telemetry/trace.h): nothing is recorded while it is off; scopes nest per
// thread on several threads at once; async begin/end pairs match across threads; each
// thread's ring keeps its newest events within its bound and counts what it dropped;
// CollectTrace(since) keeps what ended since; the Chrome JSON parses (a small validating
// parser below), escapes names and nests per thread; a sink sees every scope; and a
// forward pass of the tiny model traces one layer span per layer with its router inside,
// and, with an expert pool, the loads as async events on the loader's track and the
// prefetch decisions as instants.
#include "telemetry/trace.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "common/greedy_run.h"
#include "common/oracle_file.h"
#include "model/model.h"
#include "telemetry/platform.h"

namespace moert::telemetry {
namespace {

// A clock that moves 1 us per reading: timestamps distinct and whole microseconds.
std::atomic<uint64_t> g_ticks{1'000'000};
uint64_t TickClock() { return g_ticks.fetch_add(1000) + 1000; }

class TraceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetClock(TickClock);
    SetTraceCapacityPerThread(32768);
    ClearTrace();
    EnableTracing();
  }
  void TearDown() override {
    DisableTracing();
    SetTraceSink(nullptr);
    SetClock(nullptr);
    ClearTrace();
  }
};

// A span as read back: from a snapshot or from the JSON.
struct Span {
  std::string name;
  uint64_t tid = 0;
  double begin = 0, end = 0;
};

// Empty when every thread's spans nest (each one inside the last open span that has not
// ended before it starts); else what does not. `parent_of` says who encloses a span.
std::string NestingErrors(std::vector<Span> spans, std::map<std::string, std::string> parent_of) {
  std::stable_sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    if (a.tid != b.tid) return a.tid < b.tid;
    if (a.begin != b.begin) return a.begin < b.begin;
    return a.end > b.end;
  });
  std::string errors;
  std::vector<const Span*> open;
  uint64_t tid = 0;
  for (const Span& s : spans) {
    if (s.tid != tid) open.clear();
    tid = s.tid;
    while (!open.empty() && open.back()->end <= s.begin) open.pop_back();
    if (!open.empty() && s.end > open.back()->end) {
      errors += s.name + " overlaps " + open.back()->name + "; ";
    }
    const auto it = parent_of.find(s.name);
    if (it != parent_of.end()) {
      const std::string got = open.empty() ? "(none)" : open.back()->name;
      if (got != it->second) errors += s.name + " inside " + got + "; ";
    }
    open.push_back(&s);
  }
  return errors;
}

std::vector<Span> SpansOf(const TraceSnapshot& snapshot) {
  std::vector<Span> spans;
  for (const TraceEvent& e : snapshot.events) {
    if (e.phase != TraceEvent::Phase::kComplete) continue;
    spans.push_back({e.name, e.tid, static_cast<double>(e.ts_ns), static_cast<double>(e.end_ns())});
  }
  return spans;
}

size_t Count(const TraceSnapshot& snapshot, std::string_view name, TraceEvent::Phase phase) {
  return static_cast<size_t>(
      std::count_if(snapshot.events.begin(), snapshot.events.end(),
                    [&](const TraceEvent& e) { return e.phase == phase && name == e.name; }));
}

// A validating JSON parser: just enough to read the trace back (numbers as doubles).
struct Json {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = Kind::kNull;
  double number = 0;
  std::string string;
  std::vector<Json> array;
  std::vector<std::pair<std::string, Json>> object;
  const Json* Find(std::string_view key) const {
    for (const auto& [k, v] : object) {
      if (k == key) return &v;
    }
    return nullptr;
  }
};

class JsonParser {
 public:
  explicit JsonParser(std::string_view text) : s_(text) {}
  // The value, or false when the text is not exactly one JSON value.
  bool Parse(Json* out) {
    if (!Value(out, 0)) return false;
    Skip();
    return i_ == s_.size();
  }

 private:
  void Skip() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool Eat(char c) {
    Skip();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool Literal(std::string_view word) {
    if (s_.substr(i_, word.size()) != word) return false;
    i_ += word.size();
    return true;
  }
  bool String(std::string* out) {
    if (!Eat('"')) return false;
    while (i_ < s_.size() && s_[i_] != '"') {
      const unsigned char c = static_cast<unsigned char>(s_[i_++]);
      if (c < 0x20) return false;  // control characters must be escaped
      if (c != '\\') {
        out->push_back(static_cast<char>(c));
        continue;
      }
      if (i_ >= s_.size()) return false;
      const char e = s_[i_++];
      const std::string_view simple = "\"\\/bfnrt", value = "\"\\/\b\f\n\r\t";
      if (const size_t k = simple.find(e); k != std::string_view::npos) {
        out->push_back(value[k]);
      } else if (e == 'u' && i_ + 4 <= s_.size()) {
        const std::string hex(s_.substr(i_, 4));
        if (hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) return false;
        const long code = std::strtol(hex.c_str(), nullptr, 16);
        if (code >= 0x80) return false;  // the writer escapes only control characters
        out->push_back(static_cast<char>(code));
        i_ += 4;
      } else {
        return false;
      }
    }
    return i_++ < s_.size();
  }
  bool Number(double* out) {
    const size_t start = i_;
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    const auto digits = [&] {
      const size_t from = i_;
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
      return i_ > from;
    };
    if (!digits()) return false;
    if (i_ < s_.size() && s_[i_] == '.') {
      ++i_;
      if (!digits()) return false;
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (!digits()) return false;
    }
    *out = std::strtod(std::string(s_.substr(start, i_ - start)).c_str(), nullptr);
    return true;
  }
  bool Value(Json* out, int depth) {
    if (depth > 64) return false;
    Skip();
    if (i_ >= s_.size()) return false;
    const char c = s_[i_];
    if (c == '{') {
      out->kind = Json::Kind::kObject;
      ++i_;
      if (Eat('}')) return true;
      do {
        std::string key;
        Json value;
        if (!String(&key) || !Eat(':') || !Value(&value, depth + 1)) return false;
        out->object.emplace_back(std::move(key), std::move(value));
      } while (Eat(','));
      return Eat('}');
    }
    if (c == '[') {
      out->kind = Json::Kind::kArray;
      ++i_;
      if (Eat(']')) return true;
      do {
        out->array.emplace_back();
        if (!Value(&out->array.back(), depth + 1)) return false;
      } while (Eat(','));
      return Eat(']');
    }
    if (c == '"') {
      out->kind = Json::Kind::kString;
      return String(&out->string);
    }
    if (c == 't' || c == 'f') {
      out->kind = Json::Kind::kBool;
      return Literal(c == 't' ? "true" : "false");
    }
    if (c == 'n') return Literal("null");
    out->kind = Json::Kind::kNumber;
    return Number(&out->number);
  }

  std::string_view s_;
  size_t i_ = 0;
};

void Nest(int depth, int thread) {
  MOERT_TRACE_SCOPE_ARG("outer", "thread", thread);
  for (int i = 0; i < depth; ++i) {
    MOERT_TRACE_SCOPE("middle");
    MOERT_TRACE_SCOPE("inner");  // opens after middle in the same scope: inside it
  }
}

TEST_F(TraceTest, NothingIsRecordedWhileOff) {
  DisableTracing();
  EXPECT_FALSE(TracingEnabled());
  Nest(3, 0);
  EXPECT_EQ(TraceAsyncBegin("load", "loader"), 0u);
  TraceAsyncEnd(0, "load", "loader");
  TraceInstant("decision");
  const TraceSnapshot snapshot = CollectTrace();
  EXPECT_TRUE(snapshot.events.empty());
  EXPECT_EQ(snapshot.dropped, 0u);
}

TEST_F(TraceTest, ScopesNestPerThreadOnSeveralThreads) {
  constexpr int kThreads = 4, kDepth = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t] {
      SetTraceThreadName("worker " + std::to_string(t));
      for (int round = 0; round < 3; ++round) Nest(kDepth, t);
    });
  }
  for (std::thread& t : threads) t.join();
  const TraceSnapshot snapshot = CollectTrace();
  EXPECT_EQ(snapshot.dropped, 0u);
  EXPECT_EQ(Count(snapshot, "outer", TraceEvent::Phase::kComplete), size_t{kThreads * 3});
  EXPECT_EQ(Count(snapshot, "inner", TraceEvent::Phase::kComplete), size_t{kThreads * 3 * kDepth});
  std::set<uint32_t> tids;
  for (const TraceEvent& e : snapshot.events) tids.insert(e.tid);
  EXPECT_EQ(tids.size(), size_t{kThreads});
  EXPECT_EQ(snapshot.thread_names.size(), size_t{kThreads});
  // Each thread's outer spans carry its argument, and the events come in time order.
  for (size_t i = 1; i < snapshot.events.size(); ++i) {
    EXPECT_LE(snapshot.events[i - 1].ts_ns, snapshot.events[i].ts_ns);
  }
  EXPECT_EQ(NestingErrors(SpansOf(snapshot),
                          {{"outer", "(none)"}, {"middle", "outer"}, {"inner", "middle"}}),
            "");
}

TEST_F(TraceTest, AsyncPairsMatchAcrossThreads) {
  const uint64_t first = TraceAsyncBegin("expert load", "loader", "layer", 3, "expert", 7);
  const uint64_t second = TraceAsyncBegin("expert load", "loader", "layer", 4, "expert", 1);
  ASSERT_NE(first, 0u);
  ASSERT_NE(second, 0u);
  EXPECT_NE(first, second);
  std::thread([&] {
    SetTraceThreadName("moert-loader");
    TraceAsyncEnd(second, "expert load", "loader");
  }).join();
  DisableTracing();  // a begun pair still ends
  TraceAsyncEnd(first, "expert load", "loader");
  const TraceSnapshot snapshot = CollectTrace();
  std::map<uint64_t, std::pair<const TraceEvent*, const TraceEvent*>> pairs;
  for (const TraceEvent& e : snapshot.events) {
    if (e.phase == TraceEvent::Phase::kAsyncBegin) pairs[e.id].first = &e;
    if (e.phase == TraceEvent::Phase::kAsyncEnd) pairs[e.id].second = &e;
  }
  ASSERT_EQ(pairs.size(), 2u);
  for (const auto& [id, pair] : pairs) {
    ASSERT_NE(pair.first, nullptr) << id;
    ASSERT_NE(pair.second, nullptr) << id;
    EXPECT_STREQ(pair.first->category, "loader");
    EXPECT_STREQ(pair.second->category, "loader");
    EXPECT_LE(pair.first->ts_ns, pair.second->ts_ns);
  }
  EXPECT_NE(pairs[second].first->tid, pairs[second].second->tid);
  EXPECT_EQ(pairs[first].first->arg, 3);
  EXPECT_EQ(pairs[first].first->arg2, 7);
}

TEST_F(TraceTest, TheRingKeepsTheNewestWithinItsBound) {
  SetTraceCapacityPerThread(16);
  for (int i = 0; i < 100; ++i) MOERT_TRACE_SCOPE_ARG("step", "i", i);
  TraceSnapshot snapshot = CollectTrace();
  ASSERT_EQ(snapshot.events.size(), 16u);
  EXPECT_EQ(snapshot.dropped, 84u);
  for (size_t i = 0; i < snapshot.events.size(); ++i) {
    EXPECT_EQ(snapshot.events[i].arg, static_cast<int64_t>(84 + i));
  }
  // What ended at or after a time: the last five steps.
  const uint64_t since = snapshot.events[11].end_ns();
  snapshot = CollectTrace(since);
  ASSERT_EQ(snapshot.events.size(), 5u);
  EXPECT_EQ(snapshot.events.front().arg, 95);
  // A span that began before `since` and ended after it is kept.
  {
    MOERT_TRACE_SCOPE("long");
    MOERT_TRACE_SCOPE("short");
  }
  snapshot = CollectTrace();
  ASSERT_STREQ(snapshot.events.back().name, "short");
  snapshot = CollectTrace(snapshot.events.back().end_ns() + 1);
  ASSERT_EQ(snapshot.events.size(), 1u);
  EXPECT_STREQ(snapshot.events[0].name, "long");
  ClearTrace();
  EXPECT_TRUE(CollectTrace().events.empty());
  EXPECT_EQ(CollectTrace().dropped, 0u);
}

TEST_F(TraceTest, TheJsonParsesAndItsSpansNestPerThread) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([t] {
      SetTraceThreadName(t == 0 ? std::string("quote \" slash \\ newline \n tab \t") : "plain");
      Nest(5, t);
      TraceInstant("decision", "value", -t);
    });
  }
  for (std::thread& t : threads) t.join();
  const uint64_t id = TraceAsyncBegin("expert load", "loader", "layer", 1);
  TraceAsyncEnd(id, "expert load", "loader");
  const std::string text = TraceJson(CollectTrace());
  Json root;
  ASSERT_TRUE(JsonParser(text).Parse(&root)) << text;
  ASSERT_EQ(root.kind, Json::Kind::kObject);
  const Json* unit = root.Find("displayTimeUnit");
  ASSERT_NE(unit, nullptr);
  EXPECT_EQ(unit->string, "ms");
  const Json* events = root.Find("traceEvents");
  ASSERT_NE(events, nullptr);
  ASSERT_EQ(events->kind, Json::Kind::kArray);
  std::vector<Span> spans;
  std::set<std::string> names;
  int async_begin = 0, async_end = 0, instants = 0;
  for (const Json& e : events->array) {
    const Json* ph = e.Find("ph");
    const Json* name = e.Find("name");
    const Json* tid = e.Find("tid");
    ASSERT_NE(ph, nullptr);
    ASSERT_NE(name, nullptr);
    ASSERT_NE(tid, nullptr);
    ASSERT_NE(e.Find("pid"), nullptr);
    if (ph->string == "M") {
      EXPECT_EQ(name->string, "thread_name");
      names.insert(e.Find("args")->Find("name")->string);
      continue;
    }
    const Json* ts = e.Find("ts");
    ASSERT_NE(ts, nullptr);
    ASSERT_EQ(ts->kind, Json::Kind::kNumber);
    if (ph->string == "X") {
      const Json* dur = e.Find("dur");
      ASSERT_NE(dur, nullptr);
      spans.push_back(
          {name->string, static_cast<uint64_t>(tid->number), ts->number, ts->number + dur->number});
    } else if (ph->string == "b" || ph->string == "e") {
      EXPECT_EQ(e.Find("cat")->string, "loader");
      ASSERT_NE(e.Find("id"), nullptr);
      (ph->string == "b" ? async_begin : async_end)++;
    } else {
      EXPECT_EQ(ph->string, "i");
      ++instants;
    }
  }
  EXPECT_TRUE(names.contains("quote \" slash \\ newline \n tab \t"));
  EXPECT_TRUE(names.contains("plain"));
  EXPECT_EQ(spans.size(), 3u * (1 + 2 * 5));
  EXPECT_EQ(async_begin, 1);
  EXPECT_EQ(async_end, 1);
  EXPECT_EQ(instants, 3);
  EXPECT_EQ(NestingErrors(spans, {{"outer", "(none)"}, {"middle", "outer"}, {"inner", "middle"}}),
            "");
}

TEST_F(TraceTest, AnAsyncEndWhoseBeginWasDroppedIsLeftOutOfTheJson) {
  SetTraceCapacityPerThread(16);
  const uint64_t id = TraceAsyncBegin("expert load", "loader");
  for (int i = 0; i < 20; ++i) MOERT_TRACE_SCOPE("filler");
  TraceAsyncEnd(id, "expert load", "loader");
  const std::string text = TraceJson(CollectTrace());
  EXPECT_EQ(text.find("expert load"), std::string::npos) << text;
  Json root;
  EXPECT_TRUE(JsonParser(text).Parse(&root)) << text;
}

TEST_F(TraceTest, WriteTraceFileWritesTheJson) {
  Nest(2, 0);
  const std::string path = ::testing::TempDir() + "/moert_trace_test.json";
  ASSERT_TRUE(WriteTraceFile(path).ok());
  std::FILE* f = std::fopen(path.c_str(), "rb");
  ASSERT_NE(f, nullptr);
  std::string text;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), f)) > 0;) text.append(buf, n);
  std::fclose(f);
  std::remove(path.c_str());
  EXPECT_EQ(text, TraceJson(CollectTrace()));
  EXPECT_FALSE(WriteTraceFile("/nonexistent-dir/trace.json").ok());
}

class RecordingSink : public TraceSink {
 public:
  void OnScopeBegin(const char* name) override { calls.push_back(std::string("B ") + name); }
  void OnScopeEnd(const char* name) override { calls.push_back(std::string("E ") + name); }
  void OnEvent(const TraceEvent& event) override {
    calls.push_back(std::string("X ") + event.name);
  }
  std::vector<std::string> calls;
};

TEST_F(TraceTest, ASinkSeesEveryScopeInOrder) {
  RecordingSink sink;
  SetTraceSink(&sink);
  {
    MOERT_TRACE_SCOPE("parent");
    MOERT_TRACE_SCOPE("child");
  }
  SetTraceSink(nullptr);
  { MOERT_TRACE_SCOPE("unseen"); }
  const std::vector<std::string> want = {"B parent", "B child",  "X child",
                                         "E child",  "X parent", "E parent"};
  EXPECT_EQ(sink.calls, want);
  EXPECT_EQ(CollectTrace().events.size(), 3u);  // the rings record too
}

// A forward pass of the tiny model with tracing on (the real clock: the loader thread's
// spans are timed on it too).
class ModelTraceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ClearTrace();
    EnableTracing();
  }
  void TearDown() override {
    DisableTracing();
    ClearTrace();
  }
};

constexpr char kTinyModel[] = "tiny-moe-shakespeare-q4_0.gguf";

TEST_F(ModelTraceTest, EveryForwardHasOneLayerSpanPerLayerWithItsRouterInside) {
  model::ModelLoadOptions options;
  options.kv_cache_positions = 64;
  auto model = model::Model::Load(test_util::OracleFile(kTinyModel), options);
  ASSERT_TRUE(model.ok()) << model.status();
  ClearTrace();
  constexpr int kDecode = 2;
  test_util::RunGreedy(**model, 8, kDecode);
  const TraceSnapshot snapshot = CollectTrace();
  const size_t n_layer = (*model)->spec().n_layer;
  const size_t forwards = Count(snapshot, "forward", TraceEvent::Phase::kComplete);
  EXPECT_GE(forwards, size_t{1 + kDecode});  // the prompt may run as several batches
  EXPECT_EQ(Count(snapshot, "layer", TraceEvent::Phase::kComplete), forwards * n_layer);
  EXPECT_EQ(Count(snapshot, "attention", TraceEvent::Phase::kComplete), forwards * n_layer);
  EXPECT_EQ(Count(snapshot, "router", TraceEvent::Phase::kComplete), forwards * n_layer);
  EXPECT_GE(Count(snapshot, "expert batch", TraceEvent::Phase::kComplete), forwards * n_layer);
  // Each forward's layers carry their index, in order.
  std::vector<int64_t> layers;
  for (const TraceEvent& e : snapshot.events) {
    if (std::string_view(e.name) == "layer") layers.push_back(e.arg);
  }
  for (size_t i = 0; i < layers.size(); ++i)
    EXPECT_EQ(layers[i], static_cast<int64_t>(i % n_layer));
  EXPECT_EQ(NestingErrors(SpansOf(snapshot), {{"forward", "(none)"},
                                              {"layer", "forward"},
                                              {"attention", "layer"},
                                              {"moe", "layer"},
                                              {"router", "moe"}}),
            "");
}

TEST_F(ModelTraceTest, WithAnExpertPoolLoadsAreAsyncEventsOnTheLoadersTrack) {
  model::ModelLoadOptions options;
  options.kv_cache_positions = 64;
  options.expert_pool_fraction = 0.25;
  auto model = model::Model::Load(test_util::OracleFile(kTinyModel), options);
  ASSERT_TRUE(model.ok()) << model.status();
  test_util::RunGreedy(**model, 16, 2);
  const TraceSnapshot snapshot = CollectTrace();
  std::set<uint32_t> loader_tids;  // one per I/O thread (LoaderOptions::io_threads)
  for (const auto& [tid, name] : snapshot.thread_names) {
    if (name == "moert-loader") loader_tids.insert(tid);
  }
  ASSERT_FALSE(loader_tids.empty()) << "no thread named moert-loader";
  std::map<uint64_t, int> begun, ended;
  size_t reads_on_loader = 0;
  for (const TraceEvent& e : snapshot.events) {
    if (e.phase == TraceEvent::Phase::kAsyncBegin) {
      EXPECT_STREQ(e.name, "expert load");
      EXPECT_STREQ(e.category, "loader");
      EXPECT_STREQ(e.arg_name, "layer");
      EXPECT_STREQ(e.arg2_name, "expert");
      ++begun[e.id];
    } else if (e.phase == TraceEvent::Phase::kAsyncEnd) {
      EXPECT_STREQ(e.category, "loader");
      ++ended[e.id];
    } else if (std::string_view(e.name) == "expert read") {
      EXPECT_EQ(loader_tids.count(e.tid), 1u) << "an expert read on thread " << e.tid;
      ++reads_on_loader;
    }
  }
  EXPECT_FALSE(begun.empty());
  EXPECT_EQ(begun, ended);  // every load begun ended (no prefetch: none left in flight)
  for (const auto& [id, n] : begun) EXPECT_EQ(n, 1) << id;
  EXPECT_GT(reads_on_loader, 0u);
  EXPECT_GT(Count(snapshot, "expert wait", TraceEvent::Phase::kComplete), 0u);
  EXPECT_EQ(NestingErrors(SpansOf(snapshot), {{"layer", "forward"}, {"router", "moe"}}), "");
}

TEST_F(ModelTraceTest, PrefetchDecisionsAreInstants) {
  model::ModelLoadOptions options;
  options.kv_cache_positions = 64;
  options.expert_pool_fraction = 0.5;
  options.prefetch = true;
  options.prefetch_depth = 1;
  auto model = model::Model::Load(test_util::OracleFile(kTinyModel), options);
  ASSERT_TRUE(model.ok()) << model.status();
  test_util::RunGreedy(**model, 16, 2);
  const TraceSnapshot snapshot = CollectTrace();
  EXPECT_GT(Count(snapshot, "prefetch", TraceEvent::Phase::kInstant), 0u);
  std::set<uint64_t> begun;
  for (const TraceEvent& e : snapshot.events) {
    if (e.phase == TraceEvent::Phase::kAsyncBegin) begun.insert(e.id);
    // A prefetch may still be loading at the end, never an end without its begin.
    if (e.phase == TraceEvent::Phase::kAsyncEnd) {
      EXPECT_TRUE(begun.contains(e.id)) << e.id;
    }
  }
}

}  // namespace
}  // namespace moert::telemetry
