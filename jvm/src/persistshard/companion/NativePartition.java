package persistshard.companion;

import java.io.Serializable;
import java.util.List;
import org.apache.spark.sql.connector.read.InputPartition;

/**
 * A Spark partition the JVM decodes itself: slices of parts whose every update counts once
 * in the snapshot (the planner's proof, {@link Planner}), so the rows are the parts' rows,
 * no consolidation, no time filter. {@code filter} is the scan's chunk-skipping filter
 * ({@code ChunkFilter} JSON) or null.
 */
final class NativePartition implements InputPartition {
  private static final long serialVersionUID = 1L;

  /**
   * One part: a local file ({@code path}), a URL Hadoop's file systems open ({@code url}, its
   * scheme one the driver found a file system for; never with credentials) or inline bytes,
   * exactly one of them; and the chunks to read (null: all).
   */
  static final class Slice implements Serializable {
    private static final long serialVersionUID = 2L;
    final String key;
    final String path;
    final String url;
    final byte[] inline;
    final int[] chunks;

    Slice(String key, String path, String url, byte[] inline, int[] chunks) {
      this.key = key;
      this.path = path;
      this.url = url;
      this.inline = inline;
      this.chunks = chunks;
    }
  }

  final List<Slice> slices;
  final List<String> columns;
  final String filter;

  NativePartition(List<Slice> slices, List<String> columns, String filter) {
    this.slices = List.copyOf(slices);
    this.columns = List.copyOf(columns);
    this.filter = filter;
  }
}
