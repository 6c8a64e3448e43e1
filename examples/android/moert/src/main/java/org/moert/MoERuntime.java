// moert from Java (moert_runtime): options, loading a model (by path, or an APK asset's
// FileDescriptor or fd) with progress and cancel, a vision projector, trim, sessions.
// close() frees it (idempotent); sessions stay usable after it.
//
//   try (MoERuntime rt = new MoERuntime(new MoERuntime.Options().threads(4))) {
//     rt.loadModel("/data/local/tmp/model.gguf", null);
//     try (Session s = rt.newSession()) {
//       s.generate(new GenerateOptions().message("user", "Hi"), (piece, token) -> {
//         System.out.print(piece);
//         return true;
//       });
//     }
//   }
package org.moert;

import java.io.FileDescriptor;

public final class MoERuntime implements AutoCloseable {
  static {
    System.loadLibrary("moert_jni");
  }

  /** Runtime options, applied by the constructor; 0 / null: the library's default. */
  public static final class Options {
    int threads;
    int contextLength;
    long memoryBudgetBytes;
    double expertPoolFraction;
    String cacheDir;
    int backend;  // moert_backend: 0 CPU, 1 OpenCL, 2 auto
    boolean mlock;

    public Options threads(int n) {
      threads = n;
      return this;
    }

    public Options contextLength(int n) {
      contextLength = n;
      return this;
    }

    /** Everything a model may hold, in bytes (routed experts then live in a pool). */
    public Options memoryBudgetBytes(long bytes) {
      memoryBudgetBytes = bytes;
      return this;
    }

    /** The expert pool as a fraction of all routed experts, in (0, 1]. */
    public Options expertPoolFraction(double fraction) {
      expertPoolFraction = fraction;
      return this;
    }

    /** An Android app passes context.getCacheDir().getPath(). */
    public Options cacheDir(String dir) {
      cacheDir = dir;
      return this;
    }

    public static final int BACKEND_CPU = 0;
    public static final int BACKEND_OPENCL = 1;
    public static final int BACKEND_AUTO = 2;

    public Options backend(int b) {
      backend = b;
      return this;
    }

    public Options mlock(boolean on) {
      mlock = on;
      return this;
    }
  }

  private long handle;  // moert_runtime*, 0 once closed (guarded by trimLock)
  private final Object trimLock = new Object();  // trim() from any thread vs close()

  public MoERuntime(Options o) throws MoertException {
    handle = nativeCreate(o.threads, o.contextLength, o.memoryBudgetBytes, o.expertPoolFraction,
        o.cacheDir, o.backend, o.mlock);
  }

  private long live() {
    if (handle == 0) throw new IllegalStateException("the runtime is closed");
    return handle;
  }

  /** The library's version, "MAJOR.MINOR.PATCH". */
  public static native String version();

  /**
   * Routes the library's log, process-wide, to listener (messages below minLevel, a
   * LogListener level, are dropped); null restores the default: logcat on Android,
   * stderr elsewhere. A message being delivered when the listener changes finishes on
   * the old one.
   */
  public static void setLogListener(LogListener listener, int minLevel) throws MoertException {
    nativeSetLogListener(listener, minLevel);
  }

  /** The C ABI version of the loaded libmoert (moert_abi_version). */
  public static native int abiVersion();

  /** Loads a GGUF model; listener may be null, or return false to cancel. */
  public synchronized void loadModel(String path, ProgressListener listener)
      throws MoertException {
    nativeLoad(live(), path, -1, 0, 0, listener);
  }

  /**
   * Loads the model at offset, length (0: to the end of the file) of an open file: an
   * asset stored uncompressed in the APK (AssetFileDescriptor's getFileDescriptor(),
   * getStartOffset(), getLength()), or a FileInputStream's getFD(). The descriptor stays
   * the caller's. A null, closed or unreadable FileDescriptor, a negative offset or
   * length, or a range past the end of the file is a MoertException (INVALID_ARGUMENT)
   * saying which; the model loaded before stays loaded.
   */
  public synchronized void loadModel(FileDescriptor fd, long offset, long length,
      ProgressListener listener) throws MoertException {
    nativeLoad(live(), null, nativeDescriptorOf(fd), offset, length, listener);
  }

  /** As loadModel(FileDescriptor, ...) for a raw fd (ParcelFileDescriptor.getFd()). */
  public synchronized void loadModel(int fd, long offset, long length,
      ProgressListener listener) throws MoertException {
    nativeLoad(live(), null, fd, offset, length, listener);
  }

  /** The earlier name of loadModel(int fd, ...), kept for callers written against it. */
  @Deprecated
  public void loadModelFd(int fd, long offset, long length, ProgressListener listener)
      throws MoertException {
    loadModel(fd, offset, length, listener);
  }

  /** Loads a MiniCPM-V vision projector (llama.cpp's --mmproj) for the loaded model. */
  public synchronized void loadMmproj(String path) throws MoertException {
    nativeLoadMmproj(live(), path);
  }

  public synchronized ModelInfo modelInfo() throws MoertException {
    return nativeModelInfo(live());
  }

  /** Gives memory back: pass ComponentCallbacks2.onTrimMemory's level. Any thread. */
  public void trim(int level) throws MoertException {
    synchronized (trimLock) {
      nativeTrim(live(), level);
    }
  }

  public synchronized Session newSession() throws MoertException {
    return new Session(nativeNewSession(live()));
  }

  /** The runtime's metrics in the Prometheus text format. */
  public synchronized String metrics() {
    return nativeMetrics(live());
  }

  /** Frees the runtime; a second call does nothing. Its sessions stay usable. */
  @Override
  public synchronized void close() {
    synchronized (trimLock) {
      if (handle != 0) nativeDestroy(handle);
      handle = 0;
    }
  }

  private static native long nativeCreate(int threads, int contextLength, long budget,
      double poolFraction, String cacheDir, int backend, boolean mlock) throws MoertException;
  private static native void nativeLoad(long h, String path, int fd, long offset, long length,
      ProgressListener listener) throws MoertException;
  private static native int nativeDescriptorOf(FileDescriptor fd) throws MoertException;
  private static native void nativeLoadMmproj(long h, String path) throws MoertException;
  private static native ModelInfo nativeModelInfo(long h) throws MoertException;
  private static native void nativeTrim(long h, int level) throws MoertException;
  private static native long nativeNewSession(long h) throws MoertException;
  private static native String nativeMetrics(long h);
  private static native void nativeDestroy(long h);
  private static native void nativeSetLogListener(LogListener listener, int minLevel)
      throws MoertException;
}
