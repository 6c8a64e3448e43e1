// Trace spans: a process-wide tracer that records what the runtime does and when, for
// Chrome trace-event JSON (ui.perfetto.dev and chrome://tracing open it; docs/tracing.md).
//
//   MOERT_TRACE_SCOPE("attention");              // a complete ("X") event over the scope
//   MOERT_TRACE_SCOPE_ARG("layer", "layer", il); // the same with one integer argument
//   const uint64_t id = TraceAsyncBegin("expert load", "loader", "layer", l, "expert", e);
//   ...  TraceAsyncEnd(id, "expert load", "loader");  // on any thread ("b"/"e" events)
//
// Off (the default), a scope costs one relaxed load and a branch, and nothing is stored.
// On, each thread records into its own bounded ring (per-thread lock, uncontended but
// for a collector), so threads never wait for each other; when a ring is full the oldest
// event goes and is counted. CollectTrace(since) merges the rings: a repro bundle takes
// the last 2 s with CollectTrace(NowNs() - 2'000'000'000).
//
// Names, categories and argument names must be static strings (only the pointer is
// kept). Timestamps come from telemetry::NowNs(). Every function is thread-safe.
#ifndef MOERT_TELEMETRY_TRACE_H_
#define MOERT_TELEMETRY_TRACE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace moert::telemetry {

struct TraceEvent {
  enum class Phase : char {
    kComplete = 'X',    // ts..ts+dur on the recording thread
    kAsyncBegin = 'b',  // id on the track `category`, ended by a kAsyncEnd of the same id
    kAsyncEnd = 'e',
    kInstant = 'i',  // a point in time (a decision)
  };
  const char* name = "";
  const char* category = "moert";
  const char* arg_name = nullptr;  // nullptr: no argument
  int64_t arg = 0;
  const char* arg2_name = nullptr;  // a second argument (async events)
  int64_t arg2 = 0;
  uint64_t ts_ns = 0;
  uint64_t dur_ns = 0;  // kComplete only
  uint64_t id = 0;      // async events only
  uint32_t tid = 0;     // the tracer's own small id of the recording thread
  Phase phase = Phase::kComplete;

  uint64_t end_ns() const { return ts_ns + dur_ns; }
};

// What CollectTrace returns: events ordered by timestamp, the names of the named threads
// that recorded them, and how many events the rings dropped since the last ClearTrace.
struct TraceSnapshot {
  std::vector<TraceEvent> events;
  std::vector<std::pair<uint32_t, std::string>> thread_names;  // tid, name
  uint64_t dropped = 0;
};

// Receives every event as it is recorded (the rings keep recording too), from the
// recording thread: an app forwards them to ATrace or the Perfetto SDK. OnScopeBegin and
// OnScopeEnd bracket each scope on its thread (for begin/end APIs such as
// ATrace_beginSection); OnEvent gets the finished event. Calls must not block for long
// and must not trace.
class TraceSink {
 public:
  virtual ~TraceSink() = default;
  virtual void OnScopeBegin(const char* /*name*/) {}
  virtual void OnScopeEnd(const char* /*name*/) {}
  virtual void OnEvent(const TraceEvent& /*event*/) {}
};

namespace trace_internal {
extern std::atomic<bool> g_enabled;
}  // namespace trace_internal

inline bool TracingEnabled() { return trace_internal::g_enabled.load(std::memory_order_relaxed); }
void EnableTracing();
void DisableTracing();

// Events each thread's ring holds (default 32768; at least 16). Rings already holding
// more drop their oldest events at their next record.
void SetTraceCapacityPerThread(size_t events);
// Drops every recorded event and the dropped count (the rings and thread names stay).
void ClearTrace();
// Names the calling thread in the trace ("moert-loader"); recorded whether or not
// tracing is on.
void SetTraceThreadName(std::string name);
// Installs the sink (nullptr: none). The sink must stay alive as long as it is installed
// and for any scope that began while it was: in practice, for the process.
void SetTraceSink(TraceSink* sink);

// The events that ended at or after `since_ns` (0: all), ordered by timestamp.
TraceSnapshot CollectTrace(uint64_t since_ns = 0);

// Chrome trace-event JSON of a snapshot: {"traceEvents":[...],"displayTimeUnit":"ms"},
// ts and dur in microseconds, "M" thread_name metadata, async ends without their begin
// in the snapshot left out.
std::string TraceJson(const TraceSnapshot& snapshot);
// CollectTrace() as JSON into `path` (Internal naming the path when it cannot be written).
absl::Status WriteTraceFile(const std::string& path);

// The tools' --trace FILE: tracing on from construction; at destruction (or Finish) off,
// and everything recorded written to `path` as JSON. A write that fails is logged.
class TraceFile {
 public:
  explicit TraceFile(std::string path);
  ~TraceFile();
  TraceFile(const TraceFile&) = delete;
  TraceFile& operator=(const TraceFile&) = delete;
  // Writes the file now (once); later calls and the destructor do nothing.
  absl::Status Finish();

 private:
  std::string path_;
  bool done_ = false;
};

// Async events on the track `category`; begin returns the id to end it with (0, and
// nothing recorded, when tracing is off). An end with id 0 does nothing; an end of a
// begun id is recorded even if tracing went off in between, so pairs stay whole.
uint64_t TraceAsyncBegin(const char* name, const char* category, const char* arg_name = nullptr,
                         int64_t arg = 0, const char* arg2_name = nullptr, int64_t arg2 = 0);
void TraceAsyncEnd(uint64_t id, const char* name, const char* category);
// A point event (a decision: a degrade step, a prefetch issued) when tracing is on.
void TraceInstant(const char* name, const char* arg_name = nullptr, int64_t arg = 0);

// The RAII span behind MOERT_TRACE_SCOPE.
class TraceScope {
 public:
  explicit TraceScope(const char* name, const char* arg_name = nullptr, int64_t arg = 0) {
    if (TracingEnabled()) [[unlikely]] {
      Begin(name, arg_name, arg);
    }
  }
  ~TraceScope() {
    if (name_ != nullptr) [[unlikely]] {
      End();
    }
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  void Begin(const char* name, const char* arg_name, int64_t arg);
  void End();

  const char* name_ = nullptr;  // set only while recording
  const char* arg_name_ = nullptr;
  int64_t arg_ = 0;
  uint64_t start_ns_ = 0;
  TraceSink* sink_ = nullptr;  // the sink that saw OnScopeBegin
};

}  // namespace moert::telemetry

#define MOERT_TRACE_CONCAT_INNER(a, b) a##b
#define MOERT_TRACE_CONCAT(a, b) MOERT_TRACE_CONCAT_INNER(a, b)
// A complete event named `name` (a static string) over the rest of the enclosing scope.
#define MOERT_TRACE_SCOPE(name) \
  ::moert::telemetry::TraceScope MOERT_TRACE_CONCAT(moert_trace_scope_, __COUNTER__)(name)
// The same with one integer argument `arg_name` (a static string) = `value`.
#define MOERT_TRACE_SCOPE_ARG(name, arg_name, value)                                  \
  ::moert::telemetry::TraceScope MOERT_TRACE_CONCAT(moert_trace_scope_, __COUNTER__)( \
      name, arg_name, static_cast<int64_t>(value))

#endif  // MOERT_TELEMETRY_TRACE_H_
