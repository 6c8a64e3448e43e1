// What MoERuntime.modelInfo() tells about the loaded model (moert_model_details).
package org.moert;

public final class ModelInfo {
  public final String architecture;
  public final String name;
  public final long parameters;
  public final int layers;
  public final int embeddingLength;
  public final int experts;
  public final int expertsUsed;
  public final int vocabSize;
  public final int trainingContextLength;
  public final int contextLength;
  public final String chatTemplate;
  public final String backend;
  public final String device;
  public final long fileOffset;
  public final double loadMs;

  // From the JNI glue: strings {architecture, name, chatTemplate, backend, device} and
  // numbers in moert_model_details' order.
  ModelInfo(String[] s, long[] n, double loadMs) {
    architecture = s[0];
    name = s[1];
    chatTemplate = s[2];
    backend = s[3];
    device = s[4];
    parameters = n[0];
    layers = (int) n[1];
    embeddingLength = (int) n[2];
    experts = (int) n[3];
    expertsUsed = (int) n[4];
    vocabSize = (int) n[5];
    trainingContextLength = (int) n[6];
    contextLength = (int) n[7];
    fileOffset = n[8];
    this.loadMs = loadMs;
  }

  @Override
  public String toString() {
    return architecture + " \"" + name + "\": " + parameters + " parameters, " + layers
        + " layers, " + experts + " experts (" + expertsUsed + " per token), vocabulary "
        + vocabSize + ", context " + contextLength + ", on " + backend
        + (device.isEmpty() ? "" : " (" + device + ")");
  }
}
