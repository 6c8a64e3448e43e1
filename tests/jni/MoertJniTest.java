// The Java API (org.moert) over JNI end to end, run by ctest with plain checks (no test
// framework): load the example model with progress, the model's facts, a greedy
// continuation equal to the C API's (c_reference.c wrote it), streaming callbacks,
// cancel from the callback and from a second thread, errors as MoertException with the
// status and message, a callback that throws, close twice, the log listener, and loads
// from a FileDescriptor or an int fd: the whole file, and the model at an offset inside a
// bigger file (an asset inside an APK), with bad descriptors and ranges refused by name.
// Usage: java -Djava.library.path=DIR --add-opens=java.base/java.io=ALL-UNNAMED
//            -cp moert.jar:tests MoertJniTest MODEL REF_IDS REF_TEXT
// (--add-opens: the int overload's test reads the int out of OpenJDK's FileDescriptor,
// as an Android app gets one from ParcelFileDescriptor.getFd().)
import java.io.FileDescriptor;
import java.io.FileInputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.Arrays;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.moert.GenerateOptions;
import org.moert.MoERuntime;
import org.moert.MoertException;
import org.moert.ModelInfo;
import org.moert.Session;
import org.moert.Stats;

public final class MoertJniTest {
  private static int failures = 0;

  private static void check(boolean ok, String what) {
    if (!ok) {
      System.err.println("CHECK failed: " + what);
      ++failures;
    }
  }

  private interface Body {
    void run() throws Exception;
  }

  // The MoertException `body` throws (null, counted as a failure, when it throws none).
  private static MoertException expectMoert(String what, Body body) {
    try {
      body.run();
    } catch (MoertException e) {
      return e;
    } catch (Exception e) {
      check(false, what + ": threw " + e + " instead of a MoertException");
      return null;
    }
    check(false, what + ": threw nothing");
    return null;
  }

  private static GenerateOptions greedy(int maxTokens) {
    return new GenerateOptions().prompt("ROMEO:").maxTokens(maxTokens).temperature(0f);
  }

  // The greedy continuation of the runtime's model, as the C reference was written: its
  // token ids, and its text appended to `text`.
  private static List<Integer> greedyIds(MoERuntime runtime, StringBuilder text)
      throws MoertException {
    final List<Integer> ids = new ArrayList<>();
    try (Session s = runtime.newSession()) {
      text.append(s.generate(greedy(32), (piece, token) -> {
        if (token >= 0) ids.add(token);
        return true;
      }));
    }
    return ids;
  }

  // The runtime's model continues "ROMEO:" as the C API did by path (refIds, refText).
  private static void checkGreedy(MoERuntime runtime, String what, List<Integer> refIds,
      String refText) throws MoertException {
    final StringBuilder text = new StringBuilder();
    final List<Integer> ids = greedyIds(runtime, text);
    check(ids.equals(refIds), what + ": greedy ids " + ids + " vs the C API's " + refIds);
    check(text.toString().equals(refText),
        what + ": greedy text '" + text + "' vs the C API's '" + refText + "'");
  }

  // The int an OpenJDK FileDescriptor holds (private field `fd`; Android's is
  // `descriptor`, and an app gets the int from ParcelFileDescriptor.getFd()).
  private static int intOf(FileDescriptor fd) throws ReflectiveOperationException {
    java.lang.reflect.Field field = FileDescriptor.class.getDeclaredField("fd");
    field.setAccessible(true);
    return field.getInt(fd);
  }

  // A MoertException INVALID_ARGUMENT whose message holds every one of `words`.
  private static void checkRefused(String what, Body body, String... words) {
    MoertException e = expectMoert(what, body);
    if (e == null) return;
    check(e.code() == MoertException.INVALID_ARGUMENT, what + ": " + e.statusName() + " " + e);
    for (String word : words) {
      check(e.getMessage().contains(word),
          what + ": '" + word + "' not in '" + e.getMessage() + "'");
    }
  }

  // Loads through MoERuntime.loadModel(FileDescriptor | int, offset, length): the example
  // model as a file, and embedded at an unaligned offset between padding and trailing
  // bytes (as an asset stored uncompressed in an APK), each giving the C API's greedy
  // continuation; bad descriptors and ranges give MoertException naming the fault and
  // leave the runtime usable (the model loaded before stays loaded).
  private static void checkFdLoads(String model, List<Integer> refIds, String refText)
      throws Exception {
    final byte[] weights = Files.readAllBytes(Paths.get(model));
    final int prefix = 3 * 4096 + 123;
    final int trailing = 777;
    final Path apk = Files.createTempFile("moert-jni-apk", ".bin");
    final Path cache = Files.createTempDirectory("moert-jni-cache");
    final byte[] bytes = new byte[prefix + weights.length + trailing];
    Arrays.fill(bytes, (byte) 0x5a);  // not a GGUF: a wrong offset cannot pass
    System.arraycopy(weights, 0, bytes, prefix, weights.length);
    Files.write(apk, bytes);
    final long size = weights.length;
    final long apkSize = bytes.length;
    try (MoERuntime rt = new MoERuntime(
             new MoERuntime.Options().threads(1).cacheDir(cache.toString()));
         FileInputStream whole = new FileInputStream(model);
         FileInputStream embedded = new FileInputStream(apk.toFile())) {
      final FileDescriptor apkFd = embedded.getFD();
      final String apkPath = apk.toString();

      // Refused before any model: the runtime then has none, and loads afterwards.
      checkRefused("loadModel(-1)", () -> rt.loadModel(-1, 0, 0, null), "fd -1", "negative");
      checkRefused("a null FileDescriptor",
          () -> rt.loadModel((FileDescriptor) null, 0, 0, null), "FileDescriptor is null");
      final FileInputStream closed = new FileInputStream(model);
      final FileDescriptor closedFd = closed.getFD();
      closed.close();
      checkRefused("a closed FileDescriptor", () -> rt.loadModel(closedFd, 0, 0, null),
          "FileDescriptor is not valid", "closed");
      checkRefused("a length past the end",
          () -> rt.loadModel(apkFd, prefix, size + trailing + 1, null), apkPath,
          "past the end", "offset " + prefix);
      checkRefused("an offset past the end", () -> rt.loadModel(apkFd, apkSize + 1, 0, null),
          apkPath, "past the end");
      checkRefused("a negative offset", () -> rt.loadModel(apkFd, -1, size, null),
          "offset -1", "negative");
      checkRefused("a negative length", () -> rt.loadModel(apkFd, prefix, -1, null),
          "length -1", "negative");
      MoertException e = expectMoert("a session after refused loads", rt::newSession);
      check(e != null && e.code() == MoertException.FAILED_PRECONDITION,
          "no model after refused loads: " + e);

      // (a) The whole file through FileInputStream.getFD(), to the end (length 0) and
      // with its length, progress rising to 1.
      final List<Float> progress = new ArrayList<>();
      rt.loadModel(whole.getFD(), 0, 0, f -> progress.add(f));
      check(!progress.isEmpty() && progress.get(progress.size() - 1) == 1.0f,
          "fd load progress " + progress);
      check(rt.modelInfo().fileOffset == 0, "whole file: offset " + rt.modelInfo().fileOffset);
      checkGreedy(rt, "FileDescriptor, whole file", refIds, refText);
      rt.loadModel(whole.getFD(), 0, size, null);
      checkGreedy(rt, "FileDescriptor, offset 0 and the file's length", refIds, refText);

      // (b) Embedded at an unaligned offset with bytes after it, loaded with offset, length.
      rt.loadModel(apkFd, prefix, size, null);
      check(rt.modelInfo().fileOffset == prefix, "embedded: offset " + rt.modelInfo().fileOffset);
      checkGreedy(rt, "FileDescriptor, embedded at " + prefix, refIds, refText);

      // (c) The int overload, the same two ways.
      rt.loadModel(intOf(whole.getFD()), 0, 0, null);
      checkGreedy(rt, "int fd, whole file", refIds, refText);
      rt.loadModel(intOf(apkFd), prefix, size, null);
      check(rt.modelInfo().fileOffset == prefix, "int fd embedded: offset "
          + rt.modelInfo().fileOffset);
      checkGreedy(rt, "int fd, embedded at " + prefix, refIds, refText);
      // Its earlier name, kept.
      loadModelFdByItsEarlierName(rt, intOf(apkFd), prefix, size);
      check(rt.modelInfo().fileOffset == prefix, "loadModelFd: offset "
          + rt.modelInfo().fileOffset);
      checkGreedy(rt, "loadModelFd, embedded at " + prefix, refIds, refText);

      // (d) Refused with a model loaded: the model stays, and the next good load works.
      checkRefused("loadModel(-1) with a model", () -> rt.loadModel(-1, prefix, size, null),
          "fd -1", "negative");
      checkRefused("a closed FileDescriptor with a model",
          () -> rt.loadModel(closedFd, prefix, size, null), "FileDescriptor is not valid");
      checkRefused("a length past the end with a model",
          () -> rt.loadModel(apkFd, prefix + 1, size + trailing, null), "past the end");
      checkRefused("a negative offset with a model",
          () -> rt.loadModel(intOf(apkFd), -4096, size, null), "offset -4096", "negative");
      // The wrong offset: the bytes there are no GGUF, and the reader says so.
      e = expectMoert("a wrong offset", () -> rt.loadModel(apkFd, prefix - 1, size, null));
      check(e != null && e.getMessage().contains(apkPath)
              && e.getMessage().contains("not a GGUF"), "wrong offset: " + e);
      check(rt.modelInfo().fileOffset == prefix, "the loaded model stays after refused loads");
      checkGreedy(rt, "after refused loads", refIds, refText);
      rt.loadModel(whole.getFD(), 0, 0, null);
      check(rt.modelInfo().fileOffset == 0, "a good load after refused ones");
      checkGreedy(rt, "a good load after refused ones", refIds, refText);
    } finally {
      Files.deleteIfExists(apk);
      try (java.util.stream.Stream<Path> files = Files.walk(cache)) {
        files.sorted(java.util.Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
      }
    }
  }

  public static void main(String[] args) throws Exception {
    if (args.length != 3) {
      System.err.println("usage: MoertJniTest MODEL REF_IDS REF_TEXT");
      System.exit(2);
    }
    final String model = args[0];
    final List<Integer> refIds = new ArrayList<>();
    for (String id : Files.readString(Paths.get(args[1])).trim().split("\\s+")) {
      refIds.add(Integer.parseInt(id));
    }
    final String refText =
        new String(Files.readAllBytes(Paths.get(args[2])), StandardCharsets.UTF_8);
    check(refIds.size() == 32, "the C reference has 32 tokens, not " + refIds.size());

    check(MoERuntime.abiVersion() >= 1, "abiVersion");
    check(MoERuntime.version().matches("\\d+\\.\\d+\\.\\d+"), "version " + MoERuntime.version());

    MoERuntime runtime = new MoERuntime(new MoERuntime.Options().threads(1));

    // Errors before a model: FAILED_PRECONDITION with the C API's message.
    MoertException e = expectMoert("newSession without a model", runtime::newSession);
    check(e != null && e.code() == MoertException.FAILED_PRECONDITION
            && e.getMessage().contains("LoadModel"), "no model: " + e);
    e = expectMoert("a bad path", () -> runtime.loadModel("/no/such/model.gguf", null));
    check(e != null && e.code() == MoertException.NOT_FOUND
            && e.statusName().equals("MOERT_NOT_FOUND")
            && e.getMessage().contains("/no/such/model.gguf"), "bad path: " + e);
    e = expectMoert("bad options",
        () -> new MoERuntime(new MoERuntime.Options().threads(-1)).close());
    check(e != null && e.code() == MoertException.INVALID_ARGUMENT
            && e.getMessage().contains("threads"), "threads -1: " + e);

    // A load cancelled by its listener, then one with progress rising to exactly 1.
    e = expectMoert("a cancelled load", () -> runtime.loadModel(model, f -> f < 0.5f));
    check(e != null && e.code() == MoertException.CANCELLED, "cancelled load: " + e);
    // The log, through a listener: the load's debug message naming the model.
    final List<String> logged = java.util.Collections.synchronizedList(new ArrayList<>());
    MoERuntime.setLogListener((level, message) -> logged.add(level + " " + message),
        org.moert.LogListener.DEBUG);
    e = expectMoert("a bad log level",
        () -> MoERuntime.setLogListener((level, message) -> {}, 7));
    check(e != null && e.code() == MoertException.INVALID_ARGUMENT
            && e.getMessage().contains("minLevel 7"), "log level 7: " + e);
    final List<Float> progress = new ArrayList<>();
    runtime.loadModel(model, f -> progress.add(f));
    boolean loadLogged = false;
    synchronized (logged) {
      for (String line : logged) {
        loadLogged |= line.startsWith(org.moert.LogListener.DEBUG + " loaded ")
            && line.contains(model);
      }
    }
    check(loadLogged, "the load's log message, in " + logged);
    // A listener that throws is dropped, and the load goes on; null restores stderr.
    MoERuntime.setLogListener((level, message) -> {
      throw new IllegalStateException("a log listener that throws");
    }, org.moert.LogListener.DEBUG);
    runtime.loadModel(model, null);
    MoERuntime.setLogListener(null, org.moert.LogListener.WARNING);
    final int before = logged.size();
    runtime.loadModel(model, null);
    check(logged.size() == before, "no message after the listener is removed: " + logged);
    check(progress.size() >= 2 && progress.get(progress.size() - 1) == 1.0f, "progress " + progress);
    for (int i = 1; i < progress.size(); ++i) {
      check(progress.get(i) >= progress.get(i - 1), "progress rises: " + progress);
    }

    ModelInfo info = runtime.modelInfo();
    check(!info.architecture.isEmpty() && info.experts > 1 && info.expertsUsed >= 1
            && info.vocabSize > 0 && info.layers > 0 && info.parameters > 0
            && info.contextLength > 0 && info.backend.equals("CPU") && info.fileOffset == 0,
        "model info " + info);

    // Greedy: the C API's continuation, token by token, and streamed text = returned text.
    Session session = runtime.newSession();
    final List<Integer> ids = new ArrayList<>();
    final StringBuilder streamed = new StringBuilder();
    String text = session.generate(greedy(32), (piece, token) -> {
      streamed.append(piece);
      if (token >= 0) ids.add(token);
      return true;
    });
    check(ids.equals(refIds), "greedy ids " + ids + " vs the C API's " + refIds);
    check(text.equals(refText), "greedy text '" + text + "' vs the C API's '" + refText + "'");
    check(streamed.toString().equals(text), "streamed text equals the returned text");
    Stats stats = session.stats();
    check(stats.generatedTokens == 32 && stats.finishReason == Stats.FINISH_MAX_TOKENS
            && stats.promptTokens > 0 && stats.decodeTokensPerSecond > 0,
        "stats after greedy: " + stats.generatedTokens + " tokens, finish " + stats.finishReason);

    // The callback cancels after 5 tokens.
    session.reset();
    final int[] calls = {0};
    e = expectMoert("a callback that cancels", () -> session.generate(greedy(32), (p, t) -> {
      return t < 0 || ++calls[0] < 5;
    }));
    check(e != null && e.code() == MoertException.CANCELLED, "callback cancel: " + e);
    check(session.stats().finishReason == Stats.FINISH_CANCELLED
            && session.stats().generatedTokens == 5, "cancelled at 5 tokens");

    // Cancel from a second thread, while the generating thread waits in its callback.
    session.reset();
    final CountDownLatch started = new CountDownLatch(1);
    final CountDownLatch cancelled = new CountDownLatch(1);
    Thread canceller = new Thread(() -> {
      try {
        started.await();
        session.cancel();
        cancelled.countDown();
      } catch (InterruptedException ignored) {
        Thread.currentThread().interrupt();
      }
    });
    canceller.start();
    e = expectMoert("cancel from a thread", () -> session.generate(greedy(-1), (p, t) -> {
      if (t >= 0 && started.getCount() > 0) {
        started.countDown();
        try {
          check(cancelled.await(30, TimeUnit.SECONDS), "the canceller ran");
        } catch (InterruptedException ignored) {
          Thread.currentThread().interrupt();
        }
      }
      return true;
    }));
    canceller.join();
    check(e != null && e.code() == MoertException.CANCELLED, "thread cancel: " + e);
    check(session.stats().generatedTokens <= 2, "stopped before the next step: "
        + session.stats().generatedTokens + " tokens");

    // A callback that throws: the exception itself reaches the caller; the session stays usable.
    session.reset();
    final IllegalStateException boom = new IllegalStateException("boom from the callback");
    try {
      session.generate(greedy(32), (p, t) -> {
        throw boom;
      });
      check(false, "the callback's exception was not rethrown");
    } catch (IllegalStateException thrown) {
      check(thrown == boom, "the callback's own exception: " + thrown);
    }
    session.reset();
    check(session.generate(greedy(32), null).equals(refText), "usable after a throwing callback");

    // Bad requests and arguments: the status and the message; nothing breaks.
    e = expectMoert("prompt and messages", () -> session.generate(
        new GenerateOptions().prompt("a").message("user", "b"), null));
    check(e != null && e.code() == MoertException.INVALID_ARGUMENT, "prompt + messages: " + e);
    e = expectMoert("a bad role", () -> session.addMessage("robot", "hi"));
    check(e != null && e.code() == MoertException.INVALID_ARGUMENT
            && e.getMessage().contains("robot"), "bad role: " + e);
    e = expectMoert("an image without a projector", () -> session.addImage(new byte[] {1, 2}));
    check(e != null && e.code() == MoertException.FAILED_PRECONDITION, "image: " + e);
    e = expectMoert("a bad trim level", () -> runtime.trim(-1));
    check(e != null && e.code() == MoertException.INVALID_ARGUMENT, "trim -1: " + e);
    runtime.trim(80);
    runtime.trim(0);
    check(runtime.metrics().contains("moert_"), "metrics text");

    // Chat messages and a non-ASCII round trip.
    session.reset();
    session.addMessage("system", "Thou speakest as in the plays \u2014 \uD83C\uDFAD.");
    String reply = session.generate(new GenerateOptions().message("user", "Who art thou?")
        .maxTokens(8).temperature(0f), null);
    check(session.stats().generatedTokens == 8 && reply != null, "a chat turn");

    // close twice; a closed handle is an IllegalStateException, never a crash.
    session.close();
    session.close();
    session.cancel();  // a no-op once closed
    try {
      session.reset();
      check(false, "reset after close");
    } catch (IllegalStateException expected) {
      // ok
    }
    Session survivor = runtime.newSession();
    runtime.close();
    runtime.close();
    check(survivor.generate(greedy(32), null).equals(refText), "a session outlives its runtime");
    survivor.close();
    try {
      runtime.newSession();
      check(false, "newSession after close");
    } catch (IllegalStateException expected) {
      // ok
    }

    checkFdLoads(model, refIds, refText);

    if (failures > 0) {
      System.err.println("MoertJniTest: " + failures + " check(s) failed");
      System.exit(1);
    }
    System.out.println("MoertJniTest: all checks passed");
  }

  @SuppressWarnings("deprecation")
  private static void loadModelFdByItsEarlierName(MoERuntime rt, int fd, long offset, long length)
      throws MoertException {
    rt.loadModelFd(fd, offset, length, null);
  }
}
