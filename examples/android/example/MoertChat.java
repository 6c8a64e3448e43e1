// The smallest Java program over moert: load a model (and, given one, a MiniCPM-V
// projector and an image), ask one question, stream the answer, print tok/s. Copy it
// into an app: the calls are the same on Android (pass paths under getFilesDir(), or
// loadModel(afd.getFileDescriptor(), afd.getStartOffset(), afd.getLength(), null) for
// an asset).
//
//   java -Djava.library.path=build/x86/lib -cp build/x86/lib/moert.jar:build/x86/lib/moert-example-chat.jar \
//       MoertChat MODEL.gguf [MMPROJ.gguf IMAGE.jpg] "What is in the picture?"
import org.moert.GenerateOptions;
import org.moert.MoERuntime;
import org.moert.MoertException;
import org.moert.Session;
import org.moert.Stats;

public final class MoertChat {
  public static void main(String[] args) throws MoertException {
    if (args.length != 2 && args.length != 4) {
      System.err.println("usage: MoertChat MODEL.gguf [MMPROJ.gguf IMAGE] QUESTION");
      System.exit(2);
    }
    String question = args[args.length - 1];
    try (MoERuntime runtime = new MoERuntime(new MoERuntime.Options())) {
      runtime.loadModel(args[0], null);
      if (args.length == 4) runtime.loadMmproj(args[1]);
      System.err.println(runtime.modelInfo());
      try (Session session = runtime.newSession()) {
        if (args.length == 4) session.addImage(args[2]);
        session.generate(new GenerateOptions().message("user", question).maxTokens(256),
            (piece, token) -> {
              System.out.print(piece);
              System.out.flush();
              return true;
            });
        Stats stats = session.stats();
        System.out.println();
        System.err.printf("prefill %d tokens at %.1f tok/s, decode %d tokens at %.1f tok/s%n",
            stats.prefillTokens, stats.prefillTokensPerSecond, stats.generatedTokens,
            stats.decodeTokensPerSecond);
      }
    }
  }
}
