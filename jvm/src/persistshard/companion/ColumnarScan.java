package persistshard.companion;

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
    return new ColumnarReaderFactory(Planner.python(), required.json());
  }

  @Override
  public Statistics estimateStatistics() {
    Planner.Plan p = plan();
    return new Statistics() {
      @Override
      public OptionalLong sizeInBytes() {
        return OptionalLong.of(p.sizeInBytes);
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
