// Receives generated text as Session.generate produces it.
package org.moert;

public interface TokenCallback {
  /**
   * One generated token: the text that became final with it (may be "" while a possible
   * stop string or a partial character is held back) and its id; once more at the end with
   * token -1 for text still held back. Return false to cancel the generation (it then
   * throws MoertException CANCELLED). An exception thrown here stops the generation and
   * reaches the caller of generate.
   */
  boolean onToken(String piece, int token);
}
