package persistshard.companion;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/** Makes the columnar reader of each partition of a {@link ColumnarScan}; all columnar. */
final class ColumnarReaderFactory implements PartitionReaderFactory {
  private static final long serialVersionUID = 1L;
  private final String python;
  private final String schemaJson;

  ColumnarReaderFactory(String python, String schemaJson) {
    this.python = python;
    this.schemaJson = schemaJson;
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
      return new NativeReader((NativePartition) partition, schema);
    }
    return new PythonReader(python, (PythonPartition) partition, schema.size());
  }
}
