package persistshard.companion;

import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.SparkEnv;

/**
 * One run of persistshard's JVM bridge in Python ({@code python -m
 * persistshard.datasource.bridge COMMAND}): its caller writes the request to {@link #stdin}
 * and closes it, then reads the answer from {@link #stdout}; its stderr is kept for the
 * error.
 *
 * <p>Invariants: stderr is drained by a thread of its own, so it cannot fill up and stall
 * the process; {@link #finish} waits for the process and turns a failure into {@link
 * PythonFailure} carrying the error line the bridge wrote ({@code PERSISTSHARD-ERROR <json
 * string>}: the Python error's text, its class name first), or the end of stderr when the
 * bridge wrote none; {@link #close} kills a process still running.
 */
final class PythonProcess implements AutoCloseable {
  static final String MODULE = "persistshard.datasource.bridge";
  static final String ERROR_PREFIX = "PERSISTSHARD-ERROR ";
  private static final ObjectMapper JSON = new ObjectMapper();

  private final Process process;
  private final Thread drainer;
  private final ByteArrayOutputStream stderr = new ByteArrayOutputStream();

  /** A process whose stdin its caller writes ({@link #stdin}) and closes. */
  PythonProcess(String python, String command) {
    process = start(python, command);
    drainer = drain();
  }

  private static Process start(String python, String command) {
    return start(python, command, command);
  }

  /**
   * {@code python -m persistshard.datasource.bridge COMMAND} started, or {@link
   * PythonFailure} ({@code CompanionUnavailable}, naming {@code what} it was for).
   */
  static Process start(String python, String command, String what) {
    List<String> argv = new ArrayList<>(List.of(python, "-m", MODULE, command));
    try {
      return new ProcessBuilder(argv).start();
    } catch (IOException e) {
      throw new PythonFailure("CompanionUnavailable: cannot start " + python + " for the "
          + "persistshard companion's " + what + " (set spark.pyspark.python or "
          + "PYSPARK_PYTHON to a Python with persistshard): " + e.getMessage(), e);
    }
  }

  private Thread drain() {
    Thread t = new Thread(() -> {
      try (InputStream err = process.getErrorStream()) {
        err.transferTo(stderr);
      } catch (IOException e) {
        // the process is gone; what was read is what it said
      }
    }, "persistshard-bridge-stderr");
    t.setDaemon(true);
    t.start();
    return t;
  }

  /** The process's stdin: the request. */
  OutputStream stdin() {
    return process.getOutputStream();
  }

  /** The bridge's answer, as it comes. */
  InputStream stdout() {
    return process.getInputStream();
  }

  /** Waits for the process; {@link PythonFailure} unless it ended well. */
  void finish() {
    int code;
    try {
      code = process.waitFor();
      drainer.join();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      process.destroyForcibly();
      throw new PythonFailure("the persistshard companion was interrupted waiting for Python", e);
    }
    if (code != 0) {
      throw new PythonFailure(errorText(code));
    }
  }

  private String errorText(int code) {
    String text = stderr.toString(StandardCharsets.UTF_8);
    for (String line : text.split("\n")) {
      if (line.startsWith(ERROR_PREFIX)) {
        try {
          return JSON.readTree(line.substring(ERROR_PREFIX.length())).textValue();
        } catch (IOException e) {
          return line.substring(ERROR_PREFIX.length());
        }
      }
    }
    String[] lines = text.split("\n");
    int from = Math.max(0, lines.length - 20);
    return "the persistshard companion's Python bridge failed (exit " + code + "): "
        + String.join("\n", java.util.Arrays.copyOfRange(lines, from, lines.length));
  }

  @Override
  public void close() {
    StderrTail.kill(process);
  }

  /** The Python that runs the bridge: Spark's workers' interpreter. */
  static String python() {
    SparkEnv env = SparkEnv.get();
    String chosen = env == null ? null : env.conf().get("spark.pyspark.python", null);
    if (chosen == null || chosen.isEmpty()) {
      chosen = System.getenv("PYSPARK_PYTHON");
    }
    return chosen == null || chosen.isEmpty() ? "python3" : chosen;
  }
}
