// The Java API (org.moert) over JNI end to end, run by ctest with plain checks (no test
// framework): load the example model with progress, the model's facts, a greedy
// continuation equal to the C API's (c_reference.c wrote it), streaming callbacks,
// cancel from the callback and from a second thread, errors as MoertException with the
// status and message, a callback that throws, close twice, the log listener.
// Usage: java -Djava.library.path=DIR -cp moert.jar:tests MoertJniTest MODEL REF_IDS REF_TEXT
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
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

    if (failures > 0) {
      System.err.println("MoertJniTest: " + failures + " check(s) failed");
      System.exit(1);
    }
    System.out.println("MoertJniTest: all checks passed");
  }
}
