package persistshard.companion;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.FieldVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.ipc.ArrowStreamReader;
import org.apache.arrow.vector.util.TransferPair;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.vectorized.ArrowColumnVector;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * Reads a {@link PythonPartition}: the Python source reads it (a {@link BridgeWorker}, {@code
 * bridge reads}: exactly its own partition read, consolidation and all) and streams Arrow
 * record batches in Spark's read schema, which this hands on as {@link ColumnarBatch}es.
 *
 * <p>Invariants: a batch is valid until the next {@link #next}; the end of the stream is the
 * end of the partition only when the answer also ended well (else {@link PythonFailure}
 * with Python's error text); {@link #close} returns the worker to its pool when its answer
 * was read to the end, and ends it otherwise.
 */
final class PythonReader implements PartitionReader<ColumnarBatch> {
  private final BridgeWorker worker;
  private final BridgeWorker.Answer answer;
  private final BufferAllocator allocator = new RootAllocator(Long.MAX_VALUE);
  private ArrowStreamReader reader;
  private VectorSchemaRoot own;
  private ColumnarBatch batch;
  /** Spark's columns: a read of none gets Python's one column of nulls, for the counts. */
  private final int columns;

  PythonReader(String python, PythonPartition partition, int columns) {
    this.columns = columns;
    this.worker = BridgeWorker.borrow("reads", python);
    this.answer = worker.request(partition.request.getBytes(StandardCharsets.UTF_8));
  }

  @Override
  public boolean next() throws IOException {
    if (reader == null) {
      reader = new ArrowStreamReader(answer, allocator);
    }
    if (reader.loadNextBatch()) {
      ownBatch(reader.getVectorSchemaRoot());
      return true;
    }
    answer.finish(); // the answer's last frame: an error after the stream's end is raised
    return false;
  }

  /**
   * Moves the batch just loaded out of the stream reader's root into vectors of its own (the
   * previous batch's closed) and makes Spark's batch of them. The reader's root is never
   * handed to Spark: a struct vector closed after Spark read it has no children left, and the
   * next batch of a struct column failed to load into it ("should have as many children as
   * in the schema"), as the native reader's chunks did (each decodes into a root of its own).
   */
  private void ownBatch(VectorSchemaRoot loaded) {
    if (own != null) {
      own.close();
    }
    List<FieldVector> moved = new ArrayList<>();
    for (FieldVector v : loaded.getFieldVectors()) {
      TransferPair pair = v.getTransferPair(allocator);
      pair.transfer();
      moved.add((FieldVector) pair.getTo());
    }
    own = new VectorSchemaRoot(moved);
    own.setRowCount(loaded.getRowCount());
    ColumnVector[] vectors = new ColumnVector[columns];
    for (int i = 0; i < vectors.length; i++) {
      vectors[i] = new ArrowColumnVector(own.getVector(i));
    }
    batch = new ColumnarBatch(vectors, own.getRowCount());
  }

  @Override
  public ColumnarBatch get() {
    return batch;
  }

  @Override
  public void close() throws IOException {
    try {
      if (own != null) {
        own.close();
      }
      if (reader != null) {
        reader.close();
      }
    } finally {
      if (answer.complete()) {
        worker.release();
      } else {
        worker.end();
      }
      allocator.close();
    }
  }
}
