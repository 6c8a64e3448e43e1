// The library's log (MoERuntime.setLogListener): a message with its level, from any of
// the library's threads (the loader's, the prefetcher's, the caller's).
package org.moert;

public interface LogListener {
  int DEBUG = 0;
  int INFO = 1;
  int WARNING = 2;
  int ERROR = 3;

  /**
   * One message (no trailing newline) at one of the levels above. Keep it short: the
   * library's thread waits for it. An exception it throws is dropped.
   */
  void onLog(int level, String message);
}
