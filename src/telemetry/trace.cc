// The tracer's per-thread rings, their collection and the Chrome trace-event JSON writer.
#include "telemetry/trace.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_set>

#include "core/strings.h"
#include "telemetry/platform.h"

namespace moert::telemetry {
namespace trace_internal {
std::atomic<bool> g_enabled{false};
}  // namespace trace_internal

namespace {

constexpr size_t kMinCapacity = 16;
// Rings of exited threads kept for collection; older ones go (their events counted as
// dropped), so threads that come and go cannot grow the tracer without bound.
constexpr size_t kMaxRetiredRings = 16;

std::atomic<size_t> g_capacity{32768};
std::atomic<TraceSink*> g_sink{nullptr};
std::atomic<uint64_t> g_next_async_id{1};

// One thread's events: a ring that grows up to the capacity, then overwrites its oldest.
struct ThreadRing {
  explicit ThreadRing(uint32_t id) : tid(id) {}
  const uint32_t tid;
  std::mutex mu;  // the owner records, a collector reads
  std::vector<TraceEvent> events;
  size_t next = 0;  // where the next event goes once the ring is full
  uint64_t dropped = 0;
  std::string name;
  bool retired = false;

  void Record(const TraceEvent& event, size_t capacity) {
    std::lock_guard<std::mutex> lock(mu);
    if (events.size() > capacity) {  // the capacity shrank: keep the newest
      std::vector<TraceEvent> kept;
      kept.reserve(capacity);
      for (size_t i = events.size() - capacity; i < events.size(); ++i) {
        kept.push_back(events[(next + i) % events.size()]);
      }
      dropped += events.size() - capacity;
      events = std::move(kept);
      next = 0;
    }
    if (events.size() < capacity) {
      events.push_back(event);
      return;
    }
    events[next] = event;
    next = (next + 1) % capacity;
    ++dropped;
  }
};

struct Registry {
  std::mutex mu;
  std::vector<std::shared_ptr<ThreadRing>> rings;  // live and retired, in creation order
  uint32_t next_tid = 1;
  uint64_t retired_dropped = 0;  // events of retired rings that went
};

Registry& GetRegistry() {
  static auto* registry = new Registry;  // never destroyed: threads may trace at exit
  return *registry;
}

// The calling thread's ring, registered on first use and retired at thread exit.
struct LocalRing {
  std::shared_ptr<ThreadRing> ring;
  ~LocalRing() {
    if (ring == nullptr) return;
    Registry& r = GetRegistry();
    std::lock_guard<std::mutex> lock(r.mu);
    {
      std::lock_guard<std::mutex> ring_lock(ring->mu);
      ring->retired = true;
    }
    size_t retired = 0;
    for (const auto& it : r.rings) {
      std::lock_guard<std::mutex> ring_lock(it->mu);
      retired += it->retired ? 1 : 0;
    }
    for (auto it = r.rings.begin(); retired > kMaxRetiredRings && it != r.rings.end();) {
      std::unique_lock<std::mutex> ring_lock((*it)->mu);
      if (!(*it)->retired) {
        ++it;
        continue;
      }
      r.retired_dropped += (*it)->events.size() + (*it)->dropped;
      ring_lock.unlock();
      it = r.rings.erase(it);
      --retired;
    }
  }
};

ThreadRing& Local() {
  thread_local LocalRing local;
  if (local.ring == nullptr) {
    Registry& r = GetRegistry();
    std::lock_guard<std::mutex> lock(r.mu);
    local.ring = std::make_shared<ThreadRing>(r.next_tid++);
    r.rings.push_back(local.ring);
  }
  return *local.ring;
}

void Record(const TraceEvent& event) {
  ThreadRing& ring = Local();
  TraceEvent e = event;
  e.tid = ring.tid;
  ring.Record(e, g_capacity.load(std::memory_order_relaxed));
  if (TraceSink* sink = g_sink.load(std::memory_order_acquire); sink != nullptr) sink->OnEvent(e);
}

// An event of the calling thread at NowNs().
TraceEvent MakeEvent(TraceEvent::Phase phase, const char* name, const char* arg_name, int64_t arg) {
  TraceEvent e;
  e.phase = phase;
  e.name = name;
  e.arg_name = arg_name;
  e.arg = arg;
  e.ts_ns = NowNs();
  return e;
}

void AppendEscaped(std::string* out, std::string_view s) {
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
    } else if (u < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", u);
      out->append(buf);
    } else {
      out->push_back(c);
    }
  }
}

// Nanoseconds as microseconds with three decimals, without floating point.
void AppendMicros(std::string* out, uint64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%llu.%03llu", static_cast<unsigned long long>(ns / 1000),
                static_cast<unsigned long long>(ns % 1000));
  out->append(buf);
}

}  // namespace

void EnableTracing() { trace_internal::g_enabled.store(true, std::memory_order_relaxed); }
void DisableTracing() { trace_internal::g_enabled.store(false, std::memory_order_relaxed); }

void SetTraceCapacityPerThread(size_t events) {
  g_capacity.store(std::max(events, kMinCapacity), std::memory_order_relaxed);
}

void ClearTrace() {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.retired_dropped = 0;
  for (const auto& ring : r.rings) {
    std::lock_guard<std::mutex> ring_lock(ring->mu);
    ring->events.clear();
    ring->next = 0;
    ring->dropped = 0;
  }
}

void SetTraceThreadName(std::string name) {
  ThreadRing& ring = Local();
  std::lock_guard<std::mutex> lock(ring.mu);
  ring.name = std::move(name);
}

void SetTraceSink(TraceSink* sink) { g_sink.store(sink, std::memory_order_release); }

TraceSnapshot CollectTrace(uint64_t since_ns) {
  TraceSnapshot snapshot;
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  snapshot.dropped = r.retired_dropped;
  for (const auto& ring : r.rings) {
    std::lock_guard<std::mutex> ring_lock(ring->mu);
    snapshot.dropped += ring->dropped;
    const size_t before = snapshot.events.size();
    for (const TraceEvent& e : ring->events) {
      if (e.end_ns() >= since_ns) snapshot.events.push_back(e);
    }
    // Names only of the threads in the snapshot.
    if (!ring->name.empty() && snapshot.events.size() > before) {
      snapshot.thread_names.emplace_back(ring->tid, ring->name);
    }
  }
  // Parents before children at the same start (the longer first), so that a reader
  // that nests by order sees the parent first.
  std::stable_sort(snapshot.events.begin(), snapshot.events.end(),
                   [](const TraceEvent& a, const TraceEvent& b) {
                     if (a.ts_ns != b.ts_ns) return a.ts_ns < b.ts_ns;
                     return a.dur_ns > b.dur_ns;
                   });
  return snapshot;
}

std::string TraceJson(const TraceSnapshot& snapshot) {
  const long long pid = static_cast<long long>(::getpid());
  std::unordered_set<uint64_t> begun;
  for (const TraceEvent& e : snapshot.events) {
    if (e.phase == TraceEvent::Phase::kAsyncBegin) begun.insert(e.id);
  }
  std::string out = "{\"traceEvents\":[";
  bool first = true;
  const auto open = [&](const char* name, const char* category, char phase, uint32_t tid) {
    out += first ? "\n" : ",\n";
    first = false;
    out += "{\"name\":\"";
    AppendEscaped(&out, name);
    out += "\",\"cat\":\"";
    AppendEscaped(&out, category);
    StrAppend(&out, "\",\"ph\":\"", std::string_view(&phase, 1), "\",\"pid\":", pid,
              ",\"tid\":", tid);
  };
  for (const auto& [tid, name] : snapshot.thread_names) {
    open("thread_name", "__metadata", 'M', tid);
    out += ",\"args\":{\"name\":\"";
    AppendEscaped(&out, name);
    out += "\"}}";
  }
  for (const TraceEvent& e : snapshot.events) {
    if (e.phase == TraceEvent::Phase::kAsyncEnd && !begun.contains(e.id)) continue;
    open(e.name, e.category, static_cast<char>(e.phase), e.tid);
    out += ",\"ts\":";
    AppendMicros(&out, e.ts_ns);
    if (e.phase == TraceEvent::Phase::kComplete) {
      out += ",\"dur\":";
      AppendMicros(&out, e.dur_ns);
    } else if (e.phase == TraceEvent::Phase::kInstant) {
      out += ",\"s\":\"t\"";
    } else {
      StrAppend(&out, ",\"id\":\"0x", absl::Hex(e.id), "\"");
    }
    if (e.arg_name != nullptr) {
      out += ",\"args\":{\"";
      AppendEscaped(&out, e.arg_name);
      StrAppend(&out, "\":", e.arg);
      if (e.arg2_name != nullptr) {
        out += ",\"";
        AppendEscaped(&out, e.arg2_name);
        StrAppend(&out, "\":", e.arg2);
      }
      out += "}";
    }
    out += "}";
  }
  StrAppend(&out, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"dropped_events\":\"",
            snapshot.dropped, "\"}}\n");
  return out;
}

absl::Status WriteTraceFile(const std::string& path) {
  const std::string json = TraceJson(CollectTrace());
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return absl::InternalError(StrCat("cannot write the trace to '", path, "'"));
  const bool written = std::fwrite(json.data(), 1, json.size(), f) == json.size();
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed) {
    return absl::InternalError(StrCat("cannot write the trace to '", path, "' (disk full?)"));
  }
  return absl::OkStatus();
}

TraceFile::TraceFile(std::string path) : path_(std::move(path)) {
  ClearTrace();
  EnableTracing();
}

TraceFile::~TraceFile() {
  const absl::Status status = Finish();
  if (!status.ok()) Log(LogLevel::kError, std::string(status.message()));
}

absl::Status TraceFile::Finish() {
  if (done_) return absl::OkStatus();
  done_ = true;
  DisableTracing();
  return WriteTraceFile(path_);
}

uint64_t TraceAsyncBegin(const char* name, const char* category, const char* arg_name, int64_t arg,
                         const char* arg2_name, int64_t arg2) {
  if (!TracingEnabled()) return 0;
  TraceEvent e = MakeEvent(TraceEvent::Phase::kAsyncBegin, name, arg_name, arg);
  e.category = category;
  e.arg2_name = arg2_name;
  e.arg2 = arg2;
  e.id = g_next_async_id.fetch_add(1, std::memory_order_relaxed);
  Record(e);
  return e.id;
}

void TraceAsyncEnd(uint64_t id, const char* name, const char* category) {
  if (id == 0) return;
  TraceEvent e = MakeEvent(TraceEvent::Phase::kAsyncEnd, name, nullptr, 0);
  e.category = category;
  e.id = id;
  Record(e);
}

void TraceInstant(const char* name, const char* arg_name, int64_t arg) {
  if (TracingEnabled()) Record(MakeEvent(TraceEvent::Phase::kInstant, name, arg_name, arg));
}

void TraceScope::Begin(const char* name, const char* arg_name, int64_t arg) {
  name_ = name;
  arg_name_ = arg_name;
  arg_ = arg;
  sink_ = g_sink.load(std::memory_order_acquire);
  if (sink_ != nullptr) sink_->OnScopeBegin(name);
  start_ns_ = NowNs();
}

void TraceScope::End() {
  TraceEvent e = MakeEvent(TraceEvent::Phase::kComplete, name_, arg_name_, arg_);
  e.dur_ns = e.ts_ns > start_ns_ ? e.ts_ns - start_ns_ : 0;
  e.ts_ns = start_ns_;
  Record(e);
  if (sink_ != nullptr) sink_->OnScopeEnd(name_);
}

}  // namespace moert::telemetry
