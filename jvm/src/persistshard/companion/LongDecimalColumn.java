package persistshard.companion;

import org.apache.arrow.vector.DecimalVector;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarArray;
import org.apache.spark.sql.vectorized.ColumnarMap;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * A top-level decimal column of precision at most 18 (Spark keeps those as an unscaled
 * {@code long}) over the 128-bit Arrow vector the decoder fills: each value is read as the low
 * 8 bytes of its little-endian two's complement, which hold it whole at that precision.
 *
 * <p>Spark's {@code ArrowColumnVector} reads every decimal through a {@code BigDecimal} object
 * per value; TPC-H's prices and quantities make that the largest cost of a scan. Invariants:
 * reads the vector's current buffers on every call (the reader reloads the same vector for each
 * chunk); owns nothing ({@link #close} frees nothing: the reader's root does); only what a
 * decimal column is asked for is implemented.
 */
final class LongDecimalColumn extends ColumnVector {
  private final DecimalVector data;

  LongDecimalColumn(DecimalVector data) {
    super(DataTypes.createDecimalType(data.getPrecision(), data.getScale()));
    this.data = data;
  }

  /** Whether {@code vector} is a decimal this column serves (precision at most 18). */
  static boolean serves(Object vector) {
    return vector instanceof DecimalVector
        && ((DecimalVector) vector).getPrecision() <= Decimal.MAX_LONG_DIGITS();
  }

  @Override
  public void close() {}

  @Override
  public boolean hasNull() {
    return data.getNullCount() > 0;
  }

  @Override
  public int numNulls() {
    return data.getNullCount();
  }

  @Override
  public boolean isNullAt(int rowId) {
    return data.isNull(rowId);
  }

  @Override
  public long getLong(int rowId) {
    return data.getDataBuffer().getLong((long) rowId * DecimalVector.TYPE_WIDTH);
  }

  @Override
  public Decimal getDecimal(int rowId, int precision, int scale) {
    if (data.isNull(rowId)) {
      return null;
    }
    return Decimal.createUnsafe(getLong(rowId), precision, scale);
  }

  private UnsupportedOperationException notDecimal() {
    return new UnsupportedOperationException("a decimal column read as another type");
  }

  @Override
  public boolean getBoolean(int rowId) {
    throw notDecimal();
  }

  @Override
  public byte getByte(int rowId) {
    throw notDecimal();
  }

  @Override
  public short getShort(int rowId) {
    throw notDecimal();
  }

  @Override
  public int getInt(int rowId) {
    throw notDecimal();
  }

  @Override
  public float getFloat(int rowId) {
    throw notDecimal();
  }

  @Override
  public double getDouble(int rowId) {
    throw notDecimal();
  }

  @Override
  public ColumnarArray getArray(int rowId) {
    throw notDecimal();
  }

  @Override
  public ColumnarMap getMap(int rowId) {
    throw notDecimal();
  }

  @Override
  public UTF8String getUTF8String(int rowId) {
    throw notDecimal();
  }

  @Override
  public byte[] getBinary(int rowId) {
    throw notDecimal();
  }

  @Override
  public ColumnVector getChild(int ordinal) {
    throw notDecimal();
  }
}
