package persistshard.companion;

import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.EOFException;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.stream.IntStream;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.hadoop.conf.Configuration;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ArrowColumnVector;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import persistshard.companion.format.ChunkFilter;
import persistshard.companion.format.FlatValues;
import persistshard.companion.format.HadoopRangeSource;
import persistshard.companion.format.PartFile;
import persistshard.companion.format.RangeSource;

/**
 * Reads a {@link NativePartition}: one {@link ColumnarBatch} per chunk, its columns the
 * decoded columns of the part ({@link PartFile#readChunk}: every byte checksummed): top-level
 * ints, dates, bigints, doubles and decimals of precision at most 18 straight into Java arrays
 * ({@link FlatColumn}), every other column into an Arrow vector.
 *
 * <p>Invariants: a batch is valid until the next call of {@link #next} (its vectors are
 * reloaded, its arrays refilled, for the next chunk); {@link #close} frees every buffer. A part file that is gone
 * is {@code CorruptData} (the state names it: something deleted it), as in Python. A slice at
 * a URL is read through Hadoop's file systems ({@link HadoopRangeSource}) with the session's
 * Hadoop configuration, local files through a {@code FileChannel}, inline parts from memory.
 */
final class NativeReader implements PartitionReader<ColumnarBatch> {
  private static final ObjectMapper JSON = new ObjectMapper();

  private final NativePartition partition;
  private final StructType schema;
  private final ChunkFilter filter;
  /** The session's Hadoop configuration, for slices at a URL (null: the scan has none). */
  private final Configuration hadoopConf;
  private final BufferAllocator allocator = new RootAllocator(Long.MAX_VALUE);
  private int slice = -1;
  private RangeSource source;
  private PartFile part;
  private int[] cols;
  /** Per column of {@code cols}, its array holder, or null: it takes an Arrow vector. */
  private FlatValues[] flat;
  /** The columns of {@code cols} that take an Arrow vector, in order. */
  private int[] arrowCols;
  private int[] chunks = new int[0];
  private int next;
  private VectorSchemaRoot root;
  private ColumnarBatch batch;

  NativeReader(NativePartition partition, StructType schema, Configuration hadoopConf) {
    this.partition = partition;
    this.schema = schema;
    this.hadoopConf = hadoopConf;
    try {
      this.filter = partition.filter == null ? null : ChunkFilter.fromJson(JSON.readTree(partition.filter));
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  @Override
  public boolean next() throws IOException {
    while (next >= chunks.length) {
      if (!openNextSlice()) {
        return false;
      }
    }
    int chunk = chunks[next++];
    // Every chunk gets vectors of its own: Arrow's loader does not reload a struct's children
    // into vectors that already held a chunk (the second chunk of a struct column failed with
    // "should have as many children as in the schema"). Spark is done with the previous
    // batch when it asks for the next one.
    newBatch();
    part.readChunk(chunk, cols, flat, root, allocator);
    return true;
  }

  /** A new root of the slice's projected schema (the previous one closed) and its batch. */
  private void newBatch() {
    if (root != null) {
      root.close();
    }
    root = VectorSchemaRoot.create(part.projectedSchema(arrowCols), allocator);
    ColumnVector[] vectors = new ColumnVector[cols.length];
    int a = 0;
    for (int i = 0; i < cols.length; i++) {
      vectors[i] = flat[i] != null
          ? new FlatColumn(part.schema.getFields().get(cols[i]), flat[i])
          : new ArrowColumnVector(root.getVector(a++));
    }
    batch = new ColumnarBatch(vectors);
  }

  private boolean openNextSlice() throws IOException {
    closeSlice();
    slice++;
    if (slice >= partition.slices.size()) {
      return false;
    }
    NativePartition.Slice s = partition.slices.get(slice);
    source = s.inline != null ? bytes(s.inline) : s.url != null ? hadoop(s) : file(s);
    part = PartFile.open(s.key, source);
    cols = part.columns(partition.columns);
    flat = part.flatColumns(cols);
    arrowCols = IntStream.range(0, cols.length).filter(k -> flat[k] == null)
        .map(k -> cols[k]).toArray();
    int[] wanted = s.chunks;
    if (wanted == null) {
      wanted = new int[part.chunks.size()];
      Arrays.setAll(wanted, i -> i);
    }
    if (filter != null) {
      int[] mayMatch = filter.chunks(part);
      wanted = Arrays.stream(wanted).filter(c -> Arrays.binarySearch(mayMatch, c) >= 0).toArray();
    }
    chunks = wanted;
    next = 0;
    return true;
  }

  private static RangeSource file(NativePartition.Slice s) throws IOException {
    try {
      return RangeSource.file(Path.of(s.path));
    } catch (NoSuchFileException e) {
      throw new PythonFailure("CorruptData: part " + s.key + " is referenced by the shard's "
          + "state but missing from storage (" + s.path + ")", e);
    }
  }

  private RangeSource hadoop(NativePartition.Slice s) throws IOException {
    if (hadoopConf == null) {
      throw new IllegalStateException("part " + s.key + " is at " + s.url
          + " but the scan shipped no Hadoop configuration");
    }
    try {
      return HadoopRangeSource.open(s.url, hadoopConf);
    } catch (FileNotFoundException e) {
      throw new PythonFailure("CorruptData: part " + s.key + " is referenced by the shard's "
          + "state but missing from storage (" + s.url + ")", e);
    }
  }

  private static RangeSource bytes(byte[] data) {
    return new RangeSource() {
      @Override
      public long size() {
        return data.length;
      }

      @Override
      public byte[] read(long offset, int length) throws IOException {
        if (offset < 0 || offset + length > data.length) {
          throw new EOFException("inline part ends at " + data.length + ", wanted "
              + (offset + length));
        }
        return Arrays.copyOfRange(data, (int) offset, (int) offset + length);
      }

      @Override
      public void close() {}
    };
  }

  @Override
  public ColumnarBatch get() {
    batch.setNumRows(root.getRowCount());
    return batch;
  }

  private void closeSlice() throws IOException {
    if (root != null) {
      root.close();
      root = null;
    }
    if (source != null) {
      source.close();
      source = null;
    }
  }

  @Override
  public void close() throws IOException {
    closeSlice();
    allocator.close();
  }
}
