package persistshard.companion;

/**
 * An error persistshard's Python side reported to the companion. The message is Python's
 * own text, which starts with the error's class name (e.g. {@code SinceViolation: ...}), so
 * what a user sees names the same class as with the Python source.
 */
public final class PythonFailure extends RuntimeException {
  private static final long serialVersionUID = 1L;

  PythonFailure(String message) {
    super(message);
  }

  PythonFailure(String message, Throwable cause) {
    super(message, cause);
  }
}
