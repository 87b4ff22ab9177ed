package persistshard.companion;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.ipc.ArrowStreamReader;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.vectorized.ArrowColumnVector;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * Reads a {@link PythonPartition}: the Python source reads it ({@code bridge read}: exactly
 * its own partition read, consolidation and all) and streams Arrow record batches in Spark's
 * read schema, which this hands on as {@link ColumnarBatch}es.
 *
 * <p>Invariants: a batch is valid until the next {@link #next}; the end of the stream is the
 * end of the partition only when the process also ended well (else {@link PythonFailure}
 * with Python's error text); {@link #close} ends the process if it still runs.
 */
final class PythonReader implements PartitionReader<ColumnarBatch> {
  private final PythonProcess process;
  private final BufferAllocator allocator = new RootAllocator(Long.MAX_VALUE);
  private ArrowStreamReader reader;
  private ColumnarBatch batch;
  /** Spark's columns: a read of none gets Python's one column of nulls, for the counts. */
  private final int columns;

  PythonReader(String python, PythonPartition partition, int columns) {
    this.columns = columns;
    this.process = new PythonProcess(python, "read",
        partition.request.getBytes(StandardCharsets.UTF_8));
  }

  @Override
  public boolean next() throws IOException {
    try {
      if (reader == null) {
        reader = new ArrowStreamReader(process.stdout(), allocator);
        VectorSchemaRoot root = reader.getVectorSchemaRoot();
        ColumnVector[] vectors = new ColumnVector[columns];
        for (int i = 0; i < vectors.length; i++) {
          vectors[i] = new ArrowColumnVector(root.getVector(i));
        }
        batch = new ColumnarBatch(vectors);
      }
      if (reader.loadNextBatch()) {
        batch.setNumRows(reader.getVectorSchemaRoot().getRowCount());
        return true;
      }
    } catch (IOException e) {
      process.finish(); // a failed read explains itself first
      throw e;
    }
    process.finish();
    return false;
  }

  @Override
  public ColumnarBatch get() {
    return batch;
  }

  @Override
  public void close() throws IOException {
    try {
      if (reader != null) {
        reader.close();
      }
    } finally {
      process.close();
      allocator.close();
    }
  }
}
