// A failed moert call: the C API's status code (moert_status) and its message.
package org.moert;

public class MoertException extends Exception {
  private static final long serialVersionUID = 1L;

  // The values of the C API's moert_status.
  public static final int INVALID_ARGUMENT = 1;
  public static final int NOT_FOUND = 2;
  public static final int OUT_OF_RANGE = 3;
  public static final int UNIMPLEMENTED = 4;
  public static final int CANCELLED = 5;
  public static final int INTERNAL = 6;
  public static final int FAILED_PRECONDITION = 7;
  public static final int DATA_LOSS = 8;
  public static final int RESOURCE_EXHAUSTED = 9;
  public static final int PERMISSION_DENIED = 10;

  private final int code;
  private final String statusName;

  // Called by the JNI glue with moert_status_string(code) and the handle's last error.
  public MoertException(int code, String statusName, String message) {
    super(statusName + ": " + message);
    this.code = code;
    this.statusName = statusName;
  }

  /** The moert_status value (INVALID_ARGUMENT, NOT_FOUND, ...). */
  public int code() {
    return code;
  }

  /** "MOERT_INVALID_ARGUMENT", ... */
  public String statusName() {
    return statusName;
  }
}
