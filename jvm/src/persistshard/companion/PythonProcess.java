package persistshard.companion;

import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.SparkEnv;

/**
 * How the companion runs persistshard's JVM bridge in Python ({@code python -m
 * persistshard.datasource.bridge COMMAND}): which interpreter ({@link #python}) and the start
 * of a bridge process ({@link #start}), for the long-lived ones that talk to it ({@link
 * PlanServer}, {@link BridgeWorker}).
 */
final class PythonProcess {
  static final String MODULE = "persistshard.datasource.bridge";

  private PythonProcess() {}

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
