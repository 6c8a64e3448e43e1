// Progress of MoERuntime.loadModel.
package org.moert;

public interface ProgressListener {
  /** The fraction loaded, rising to exactly 1. Return false to cancel the load. */
  boolean onProgress(float fraction);
}
