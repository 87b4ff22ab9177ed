package persistshard.companion;

import java.util.Arrays;
import java.util.OptionalLong;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.Statistics;
import org.apache.spark.sql.connector.read.SupportsReportStatistics;
import org.apache.spark.sql.connector.read.streaming.ContinuousStream;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * One columnar snapshot scan: its plan is asked of Python once ({@link Planner}) and kept
 * for this scan only; partitions are read by {@link ColumnarReaderFactory}.
 *
 * <p>A stream built over the table (Spark builds the same scan for {@code readStream}) is the
 * Python source's stream: {@link #toMicroBatchStream} hands over to a Python scan of the
 * table's whole schema.
 */
final class ColumnarScan implements Scan, Batch, SupportsReportStatistics {
  private final StructType schema;
  private final StructType required;
  private final CaseInsensitiveStringMap options;
  private final String filter;
  private final Filter[] pushed;
  private Planner.Plan plan;

  ColumnarScan(StructType schema, StructType required, CaseInsensitiveStringMap options,
      String filter, Filter[] pushed) {
    this.schema = schema;
    this.required = required;
    this.options = options;
    this.filter = filter;
    this.pushed = pushed;
  }

  private synchronized Planner.Plan plan() {
    if (plan == null) {
      plan = Planner.plan(options, schema, required, filter);
    }
    return plan;
  }

  @Override
  public StructType readSchema() {
    return required;
  }

  @Override
  public String description() {
    StringBuilder out = new StringBuilder("persistshard columnar scan [");
    out.append(String.join(", ", required.fieldNames())).append("]");
    if (pushed.length > 0) {
      out.append(" skipping chunks by ");
      for (int i = 0; i < pushed.length; i++) {
        out.append(i == 0 ? "" : ", ").append(pushed[i]);
      }
    }
    Planner.Plan planned;
    synchronized (this) {
      planned = plan; // never planned for a description: a read that fails plans nothing
    }
    if (planned != null) {
      long jvm = Arrays.stream(planned.partitions).filter(p -> p instanceof NativePartition)
          .count();
      out.append(" (").append(jvm).append(" of ").append(planned.partitions.length)
          .append(" partitions decoded in the JVM)");
    }
    return out.toString();
  }

  @Override
  public ColumnarSupportMode columnarSupportMode() {
    return ColumnarSupportMode.SUPPORTED;
  }

  @Override
  public Batch toBatch() {
    return this;
  }

  @Override
  public InputPartition[] planInputPartitions() {
    return plan().partitions;
  }

  @Override
  public PartitionReaderFactory createReaderFactory() {
    return new ColumnarReaderFactory(Planner.python(), required.json(), plan().hadoopConf);
  }

  /**
   * The bytes Spark's optimizer sees (its broadcast joins follow them): the stored size of the
   * parts scaled to the columns this scan reads, by their default sizes, as Spark scales a
   * file scan's bytes to its pruned columns ({@code FileScan}), so a pruned scan of a large
   * table can be broadcast where the same scan of Parquet is. At least 1.
   */
  static long scaledSize(long stored, StructType schema, StructType required) {
    int all = schema.defaultSize();
    if (all <= 0) {
      return Math.max(1, stored);
    }
    return Math.max(1, (long) ((double) stored * required.defaultSize() / all));
  }

  @Override
  public Statistics estimateStatistics() {
    Planner.Plan p = plan();
    long size = scaledSize(p.sizeInBytes, schema, required);
    return new Statistics() {
      @Override
      public OptionalLong sizeInBytes() {
        return OptionalLong.of(size);
      }

      @Override
      public OptionalLong numRows() {
        return OptionalLong.of(p.numRows);
      }
    };
  }

  @Override
  public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
    return CompanionTable.pythonScan(schema, options).build().toMicroBatchStream(checkpointLocation);
  }

  @Override
  public ContinuousStream toContinuousStream(String checkpointLocation) {
    return CompanionTable.pythonScan(schema, options).build().toContinuousStream(checkpointLocation);
  }
}
