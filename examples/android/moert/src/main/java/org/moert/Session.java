// A conversation on a runtime's model (moert_session): history, images, generation with
// a token callback, cancel from any thread, reset, stats. close() frees it (idempotent).
package org.moert;

public final class Session implements AutoCloseable {
  private long handle;  // moert_session*, 0 once closed (guarded by this)
  private final Object cancelLock = new Object();  // cancel() vs close()

  Session(long handle) {
    this.handle = handle;
  }

  private long live() {
    if (handle == 0) throw new IllegalStateException("the session is closed");
    return handle;
  }

  /** Appends a message without generating (a system prompt, earlier turns). */
  public synchronized void addMessage(String role, String content) throws MoertException {
    nativeAddMessage(live(), role, content);
  }

  /** Adds a PNG or JPEG file to the next generation (a vision projector must be loaded). */
  public synchronized void addImage(String path) throws MoertException {
    nativeAddImageFile(live(), path);
  }

  /** Adds the bytes of a PNG or JPEG to the next generation. */
  public synchronized void addImage(byte[] encoded) throws MoertException {
    nativeAddImageBytes(live(), encoded);
  }

  /**
   * Generates a continuation, streaming it to callback (may be null), and returns all
   * of its text. MoertException CANCELLED when cancel() or the callback stopped it (what
   * was generated stays in the session). An exception the callback throws is rethrown.
   */
  public synchronized String generate(GenerateOptions o, TokenCallback callback)
      throws MoertException {
    return nativeGenerate(live(), o.prompt, o.roles.toArray(new String[0]),
        o.contents.toArray(new String[0]), o.maxTokens, o.temperature, o.topK, o.topP, o.minP,
        o.repeatPenalty, o.repeatLastN, o.seed, o.stop.toArray(new String[0]), o.chatTemplate,
        o.slideContext, o.imageKeepRatio, o.imageMinKeep, callback);
  }

  /** Asks the running generation to stop before its next step. Any thread. */
  public void cancel() {
    synchronized (cancelLock) {
      if (handle != 0) nativeCancel(handle);
    }
  }

  /** Forgets the history and the KV cache. */
  public synchronized void reset() throws MoertException {
    nativeReset(live());
  }

  /** The figures of the last generation. */
  public synchronized Stats stats() throws MoertException {
    return nativeStats(live());
  }

  /** Frees the session; a second call does nothing. Waits for a running generate. */
  @Override
  public synchronized void close() {
    synchronized (cancelLock) {
      if (handle != 0) nativeDestroy(handle);
      handle = 0;
    }
  }

  private static native void nativeAddMessage(long h, String role, String content)
      throws MoertException;
  private static native void nativeAddImageFile(long h, String path) throws MoertException;
  private static native void nativeAddImageBytes(long h, byte[] bytes) throws MoertException;
  private static native String nativeGenerate(long h, String prompt, String[] roles,
      String[] contents, int maxTokens, float temperature, int topK, float topP, float minP,
      float repeatPenalty, int repeatLastN, long seed, String[] stop, String chatTemplate,
      boolean slide, float imageKeepRatio, int imageMinKeep, TokenCallback callback)
      throws MoertException;
  private static native void nativeCancel(long h);
  private static native void nativeReset(long h) throws MoertException;
  private static native Stats nativeStats(long h) throws MoertException;
  private static native void nativeDestroy(long h);
}
