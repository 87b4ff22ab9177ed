package persistshard.companion;

import org.apache.spark.broadcast.Broadcast;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.apache.spark.util.SerializableConfiguration;

/**
 * Makes the columnar reader of each partition of a {@link ColumnarScan}; all columnar.
 * {@code hadoopConf} is the session's Hadoop configuration, broadcast once per scan when a
 * partition reads a part through Hadoop's file systems (null otherwise).
 */
final class ColumnarReaderFactory implements PartitionReaderFactory {
  private static final long serialVersionUID = 2L;
  private final String python;
  private final String schemaJson;
  private final Broadcast<SerializableConfiguration> hadoopConf;

  ColumnarReaderFactory(String python, String schemaJson,
      Broadcast<SerializableConfiguration> hadoopConf) {
    this.python = python;
    this.schemaJson = schemaJson;
    this.hadoopConf = hadoopConf;
  }

  @Override
  public boolean supportColumnarReads(InputPartition partition) {
    return true;
  }

  @Override
  public PartitionReader<InternalRow> createReader(InputPartition partition) {
    throw new UnsupportedOperationException("persistshard's companion scan reads columnar only");
  }

  @Override
  public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
    StructType schema = (StructType) DataType.fromJson(schemaJson);
    if (partition instanceof NativePartition) {
      return new NativeReader((NativePartition) partition, schema,
          hadoopConf == null ? null : hadoopConf.value().value());
    }
    return new PythonReader(python, (PythonPartition) partition, schema.size());
  }
}
