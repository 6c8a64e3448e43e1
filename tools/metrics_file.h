// --metrics FILE and --metrics-interval N of moert-chat, moert-perplexity and moert-bench:
// the metrics (Prometheus text) written to FILE at exit and, with an interval,
// every N seconds from a thread of the tool's, each time atomically (a temporary file
// beside FILE, then rename), so a scraper never reads half a file.
#ifndef MOERT_TOOLS_METRICS_FILE_H_
#define MOERT_TOOLS_METRICS_FILE_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace moert::tools {

struct MetricsFlags {
  std::string path;        // empty: no metrics file
  int64_t interval_s = 0;  // 0: only at exit
};

// When argv[*i] is --metrics or --metrics-interval, takes it and its value (advancing
// *i) and returns true; *error gets the message of a missing or bad value.
bool ParseMetricsFlag(int argc, char** argv, int* i, MetricsFlags* flags, std::string* error);

// Writes `text` to `path` through a temporary file and a rename; "" or the error.
std::string WriteFileAtomically(const std::string& path, const std::string& text);

class MetricsFile {
 public:
  // Starts the periodic writes (flags.interval_s > 0). `text` gives the metrics (any
  // thread: MoERuntime::Metrics, or a registry's text) and must stay callable until
  // Finish; `tool` names the tool in error messages.
  MetricsFile(MetricsFlags flags, std::function<std::string()> text, std::string tool);
  // Finish, unless called already.
  ~MetricsFile();
  MetricsFile(const MetricsFile&) = delete;
  MetricsFile& operator=(const MetricsFile&) = delete;

  // Writes the file now; false (and the error on stderr) when that failed.
  bool Write();
  // Stops the periodic writes and writes the file a last time (Write's result).
  bool Finish();

 private:
  const MetricsFlags flags_;
  const std::function<std::string()> text_;
  const std::string tool_;
  std::mutex mutex_;  // one write at a time; guards stop_
  std::condition_variable wake_;
  bool stop_ = false;
  bool finished_ = false;
  std::thread thread_;
};

}  // namespace moert::tools

#endif  // MOERT_TOOLS_METRICS_FILE_H_
