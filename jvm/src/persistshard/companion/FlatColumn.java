package persistshard.companion;

import org.apache.arrow.vector.types.pojo.ArrowType;
import org.apache.arrow.vector.types.pojo.Field;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarArray;
import org.apache.spark.sql.vectorized.ColumnarMap;
import org.apache.spark.unsafe.types.UTF8String;
import persistshard.companion.format.FlatValues;

/**
 * A top-level fixed-width column handed to Spark from the decoder's Java array ({@link
 * FlatValues}): int, date, bigint, double, and decimals of precision at most 18 (Spark keeps
 * those as an unscaled {@code long}; each value is one, read without a {@code BigDecimal}).
 *
 * <p>Spark's {@code ArrowColumnVector} reads every decimal through a {@code BigDecimal} object
 * per value and checks Arrow's validity bitmap on every read; TPC-H's prices, quantities and
 * dates made those, and the copies into Arrow buffers, most of a scan's cost. Invariants: reads
 * the holder's current arrays on every call (the reader reloads the same holder for each
 * chunk); owns nothing ({@link #close} frees nothing); only the getters of its Spark type are
 * implemented, the others throw.
 */
final class FlatColumn extends ColumnVector {
  private final FlatValues data;

  FlatColumn(Field field, FlatValues data) {
    super(sparkType(field.getType()));
    this.data = data;
  }

  /** The Spark type Spark's own Arrow conversion gives the types {@link FlatValues} takes. */
  private static DataType sparkType(ArrowType type) {
    if (type instanceof ArrowType.Decimal) {
      ArrowType.Decimal d = (ArrowType.Decimal) type;
      return DataTypes.createDecimalType(d.getPrecision(), d.getScale());
    }
    if (type instanceof ArrowType.Date) {
      return DataTypes.DateType;
    }
    if (type instanceof ArrowType.FloatingPoint) {
      return DataTypes.DoubleType;
    }
    return ((ArrowType.Int) type).getBitWidth() == 32 ? DataTypes.IntegerType : DataTypes.LongType;
  }

  @Override
  public void close() {}

  @Override
  public boolean hasNull() {
    return data.nullCount() > 0;
  }

  @Override
  public int numNulls() {
    return data.nullCount();
  }

  @Override
  public boolean isNullAt(int rowId) {
    return data.isNull(rowId);
  }

  @Override
  public int getInt(int rowId) {
    if (data.kind != FlatValues.INT) {
      throw wrongType("int");
    }
    return data.getInt(rowId);
  }

  @Override
  public long getLong(int rowId) {
    if (data.kind != FlatValues.LONG) {
      throw wrongType("long");
    }
    return data.getLong(rowId);
  }

  @Override
  public double getDouble(int rowId) {
    if (data.kind != FlatValues.DOUBLE) {
      throw wrongType("double");
    }
    return data.getDouble(rowId);
  }

  @Override
  public Decimal getDecimal(int rowId, int precision, int scale) {
    if (data.isNull(rowId)) {
      return null;
    }
    return Decimal.createUnsafe(getLong(rowId), precision, scale);
  }

  private UnsupportedOperationException wrongType(String asked) {
    return new UnsupportedOperationException("a column of " + dataType() + " read as " + asked);
  }

  @Override
  public boolean getBoolean(int rowId) {
    throw wrongType("boolean");
  }

  @Override
  public byte getByte(int rowId) {
    throw wrongType("byte");
  }

  @Override
  public short getShort(int rowId) {
    throw wrongType("short");
  }

  @Override
  public float getFloat(int rowId) {
    throw wrongType("float");
  }

  @Override
  public ColumnarArray getArray(int rowId) {
    throw wrongType("array");
  }

  @Override
  public ColumnarMap getMap(int rowId) {
    throw wrongType("map");
  }

  @Override
  public UTF8String getUTF8String(int rowId) {
    throw wrongType("string");
  }

  @Override
  public byte[] getBinary(int rowId) {
    throw wrongType("binary");
  }

  @Override
  public ColumnVector getChild(int ordinal) {
    throw wrongType("struct");
  }
}
