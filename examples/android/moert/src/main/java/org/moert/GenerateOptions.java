// A generation request for Session.generate (moert_generate_params): raw text or chat
// messages, the sampling settings (llama.cpp's meanings; temperature 0 is greedy), stop
// strings and the context policy. Setters return this, to chain.
package org.moert;

import java.util.ArrayList;
import java.util.List;

public final class GenerateOptions {
  String prompt;
  final List<String> roles = new ArrayList<>();
  final List<String> contents = new ArrayList<>();
  final List<String> stop = new ArrayList<>();
  int maxTokens = -1;
  float temperature = 0.8f;
  int topK = 40;
  float topP = 0.95f;
  float minP = 0.05f;
  float repeatPenalty = 1.0f;
  int repeatLastN = 64;
  long seed = 0xFFFFFFFFL;
  String chatTemplate;
  boolean slideContext;
  float imageKeepRatio = 1.0f;
  int imageMinKeep = 1;

  /** Raw text appended to the session (no chat template); not with messages. */
  public GenerateOptions prompt(String text) {
    prompt = text;
    return this;
  }

  /** A chat message ("system", "user", "assistant"), formatted with the chat template. */
  public GenerateOptions message(String role, String content) {
    roles.add(role);
    contents.add(content);
    return this;
  }

  /** At most this many tokens; below 0 (the default): until the end of generation. */
  public GenerateOptions maxTokens(int n) {
    maxTokens = n;
    return this;
  }

  public GenerateOptions temperature(float t) {
    temperature = t;
    return this;
  }

  public GenerateOptions topK(int k) {
    topK = k;
    return this;
  }

  public GenerateOptions topP(float p) {
    topP = p;
    return this;
  }

  public GenerateOptions minP(float p) {
    minP = p;
    return this;
  }

  public GenerateOptions repeatPenalty(float penalty, int lastN) {
    repeatPenalty = penalty;
    repeatLastN = lastN;
    return this;
  }

  public GenerateOptions seed(long s) {
    seed = s;
    return this;
  }

  /** Generation stops where this appears; it is not emitted. */
  public GenerateOptions stop(String s) {
    stop.add(s);
    return this;
  }

  /** "chatml", "llama2", "llama3", "plain"; null: the model's own. */
  public GenerateOptions chatTemplate(String name) {
    chatTemplate = name;
    return this;
  }

  /** true: drop the oldest turns when the context is full instead of failing. */
  public GenerateOptions slideContext(boolean slide) {
    slideContext = slide;
    return this;
  }

  /** Visual-token pruning: each image slice keeps this fraction, at least minKeep. */
  public GenerateOptions imageKeep(float ratio, int minKeep) {
    imageKeepRatio = ratio;
    imageMinKeep = minKeep;
    return this;
  }
}
