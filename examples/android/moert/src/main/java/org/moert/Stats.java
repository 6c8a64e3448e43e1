// Figures of a session's last generation (moert_stats and moert_memory_stats).
package org.moert;

public final class Stats {
  // Why the generation ended: moert_finish_reason.
  public static final int FINISH_NONE = 0;
  public static final int FINISH_END_OF_GENERATION = 1;
  public static final int FINISH_STOP_STRING = 2;
  public static final int FINISH_MAX_TOKENS = 3;
  public static final int FINISH_CANCELLED = 4;
  public static final int FINISH_CONTEXT_FULL = 5;

  public final int promptTokens;
  public final int cachedTokens;
  public final int prefillTokens;
  public final int generatedTokens;
  public final int finishReason;
  public final int images;
  public final int imageTokens;
  public final boolean degraded;
  public final double prefillMs;
  public final double decodeMs;
  public final double timeToFirstTokenMs;
  public final double prefillTokensPerSecond;
  public final double decodeTokensPerSecond;
  public final double imageEncodeMs;
  public final double prefetchPrecision;
  public final double prefetchRecall;
  public final double expertHitRate;
  public final double expertBytesReadPerToken;
  public final double expertStallMsPerToken;
  public final long peakRssBytes;
  public final long budgetBytes;
  public final long expertPoolBytes;
  public final long expertPoolUsedBytes;
  public final long kvCacheBytes;
  public final String degradeReason;

  // From the JNI glue, in the order of moert_jni.cc's Java_org_moert_Session_nativeStats.
  Stats(long[] n, double[] d, String degradeReason) {
    promptTokens = (int) n[0];
    cachedTokens = (int) n[1];
    prefillTokens = (int) n[2];
    generatedTokens = (int) n[3];
    finishReason = (int) n[4];
    images = (int) n[5];
    imageTokens = (int) n[6];
    degraded = n[7] != 0;
    peakRssBytes = n[8];
    budgetBytes = n[9];
    expertPoolBytes = n[10];
    expertPoolUsedBytes = n[11];
    kvCacheBytes = n[12];
    prefillMs = d[0];
    decodeMs = d[1];
    timeToFirstTokenMs = d[2];
    prefillTokensPerSecond = d[3];
    decodeTokensPerSecond = d[4];
    imageEncodeMs = d[5];
    prefetchPrecision = d[6];
    prefetchRecall = d[7];
    expertHitRate = d[8];
    expertBytesReadPerToken = d[9];
    expertStallMsPerToken = d[10];
    this.degradeReason = degradeReason;
  }
}
