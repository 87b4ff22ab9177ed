package persistshard.companion;

import org.apache.spark.sql.connector.read.InputPartition;

/**
 * A Spark partition Python reads (a consolidating merge, a time filter, a store the JVM does
 * not open, a column the JVM cannot hand over as is): {@code request} is the bridge's read
 * request, holding the Python source's own partition, pickled.
 */
final class PythonPartition implements InputPartition {
  private static final long serialVersionUID = 1L;
  final String request;

  PythonPartition(String request) {
    this.request = request;
  }
}
