package persistshard.companion;

import java.io.IOException;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.JoinedRow;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownFilters;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarArray;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.apache.spark.sql.vectorized.ColumnarMap;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The target scan of a {@link DeltaOperation}: every column of the table, then the row id
 * ({@link DeltaOperation#ROW_ID}, a struct of those same columns), over the scan the table
 * would make for a read (columnar in the JVM, or the Python source's).
 *
 * <p>Invariants: the inner scan reads every column (a row id is the whole row); its rows
 * and batches are handed on unchanged with one more column whose value is the row itself
 * (a batch's row id column is a view of its other columns, never a copy); filters reach a
 * columnar inner scan only to skip chunks, Spark evaluates every one of them.
 */
final class RowIdScan implements Scan, Batch {
  private final Scan inner;
  private final StructType readSchema;

  RowIdScan(Scan inner) {
    this.inner = inner;
    this.readSchema = inner.readSchema().add(
        DeltaOperation.ROW_ID, DeltaOperation.rowIdType(inner.readSchema()), false);
  }

  /** The operation's scan builder: prunes nothing, pushes filters to a columnar scan. */
  static final class Builder
      implements ScanBuilder, SupportsPushDownRequiredColumns, SupportsPushDownFilters {
    private final ScanBuilder inner;

    Builder(ScanBuilder inner, StructType schema) {
      this.inner = inner;
      if (inner instanceof SupportsPushDownRequiredColumns) {
        ((SupportsPushDownRequiredColumns) inner).pruneColumns(schema);
      }
    }

    @Override
    public void pruneColumns(StructType requiredSchema) {
      // the row id is the whole row: every column is read
    }

    @Override
    public Filter[] pushFilters(Filter[] filters) {
      if (inner instanceof ColumnarScanBuilder) {
        ((ColumnarScanBuilder) inner).pushFilters(filters);
      }
      return filters;
    }

    @Override
    public Filter[] pushedFilters() {
      return inner instanceof ColumnarScanBuilder
          ? ((ColumnarScanBuilder) inner).pushedFilters() : new Filter[0];
    }

    @Override
    public Scan build() {
      return new RowIdScan(inner.build());
    }
  }

  @Override
  public StructType readSchema() {
    return readSchema;
  }

  @Override
  public String description() {
    return inner.description() + " with row ids";
  }

  @Override
  public ColumnarSupportMode columnarSupportMode() {
    return inner.columnarSupportMode();
  }

  @Override
  public Batch toBatch() {
    return this;
  }

  @Override
  public InputPartition[] planInputPartitions() {
    return inner.toBatch().planInputPartitions();
  }

  @Override
  public PartitionReaderFactory createReaderFactory() {
    return new Readers(inner.toBatch().createReaderFactory(),
        DeltaOperation.rowIdType(inner.readSchema()));
  }

  /** The inner scan's readers, each row or batch with its row id. */
  static final class Readers implements PartitionReaderFactory {
    private static final long serialVersionUID = 1L;
    private final PartitionReaderFactory inner;
    private final StructType columns;

    Readers(PartitionReaderFactory inner, StructType columns) {
      this.inner = inner;
      this.columns = columns;
    }

    @Override
    public boolean supportColumnarReads(InputPartition partition) {
      return inner.supportColumnarReads(partition);
    }

    @Override
    public PartitionReader<InternalRow> createReader(InputPartition partition) {
      PartitionReader<InternalRow> rows = inner.createReader(partition);
      return new PartitionReader<InternalRow>() {
        private final JoinedRow joined = new JoinedRow();

        @Override
        public boolean next() throws IOException {
          return rows.next();
        }

        @Override
        public InternalRow get() {
          InternalRow row = rows.get();
          return joined.apply(row, new GenericInternalRow(new Object[] {row.copy()}));
        }

        @Override
        public void close() throws IOException {
          rows.close();
        }
      };
    }

    @Override
    public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
      PartitionReader<ColumnarBatch> batches = inner.createColumnarReader(partition);
      return new PartitionReader<ColumnarBatch>() {
        @Override
        public boolean next() throws IOException {
          return batches.next();
        }

        @Override
        public ColumnarBatch get() {
          ColumnarBatch batch = batches.get();
          int n = batch.numCols();
          ColumnVector[] vectors = new ColumnVector[n + 1];
          for (int i = 0; i < n; i++) {
            vectors[i] = batch.column(i);
          }
          vectors[n] = new RowOfColumns(columns, java.util.Arrays.copyOf(vectors, n));
          return new ColumnarBatch(vectors, batch.numRows());
        }

        @Override
        public void close() throws IOException {
          batches.close();
        }
      };
    }
  }

  /**
   * A non-null struct column over other columns of the same batch: each row's struct is that
   * row of {@code children}. It owns nothing: closing it closes no child.
   */
  static final class RowOfColumns extends ColumnVector {
    private final ColumnVector[] children;

    RowOfColumns(StructType type, ColumnVector[] children) {
      super(type);
      this.children = children;
    }

    @Override
    public void close() {
      // the children belong to the batch they came from
    }

    @Override
    public boolean hasNull() {
      return false;
    }

    @Override
    public int numNulls() {
      return 0;
    }

    @Override
    public boolean isNullAt(int rowId) {
      return false;
    }

    @Override
    public ColumnVector getChild(int ordinal) {
      return children[ordinal];
    }

    private static UnsupportedOperationException notScalar() {
      return new UnsupportedOperationException("a persistshard row id is a struct");
    }

    @Override
    public boolean getBoolean(int rowId) {
      throw notScalar();
    }

    @Override
    public byte getByte(int rowId) {
      throw notScalar();
    }

    @Override
    public short getShort(int rowId) {
      throw notScalar();
    }

    @Override
    public int getInt(int rowId) {
      throw notScalar();
    }

    @Override
    public long getLong(int rowId) {
      throw notScalar();
    }

    @Override
    public float getFloat(int rowId) {
      throw notScalar();
    }

    @Override
    public double getDouble(int rowId) {
      throw notScalar();
    }

    @Override
    public ColumnarArray getArray(int rowId) {
      throw notScalar();
    }

    @Override
    public ColumnarMap getMap(int rowId) {
      throw notScalar();
    }

    @Override
    public Decimal getDecimal(int rowId, int precision, int scale) {
      throw notScalar();
    }

    @Override
    public UTF8String getUTF8String(int rowId) {
      throw notScalar();
    }

    @Override
    public byte[] getBinary(int rowId) {
      throw notScalar();
    }
  }
}
