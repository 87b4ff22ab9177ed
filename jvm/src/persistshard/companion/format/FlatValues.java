package persistshard.companion.format;

import org.apache.arrow.vector.types.DateUnit;
import org.apache.arrow.vector.types.FloatingPointPrecision;
import org.apache.arrow.vector.types.pojo.ArrowType;
import org.apache.arrow.vector.types.pojo.Field;

/**
 * One top-level fixed-width column of one chunk decoded straight into a Java array, without an
 * Arrow vector: {@code int} values ({@link #INT}: int32, date32) or {@code long} values
 * ({@link #LONG}: int64, and decimals of precision at most 18 as their unscaled value;
 * {@link #DOUBLE}: float64 as its bits). Filled by {@link PartFile#readChunk(int, int[],
 * FlatValues[], org.apache.arrow.vector.VectorSchemaRoot, org.apache.arrow.memory.BufferAllocator)}.
 *
 * <p>A decimal of precision at most 18 fits a {@code long} whatever its stored width (that is
 * what precision means; Spark keeps such decimals as unscaled longs), so only the stored
 * value's low 8 bytes are read (the upper planes of a 128-bit decimal, its sign extension,
 * are never touched), and a 32-bit decimal is sign-extended.
 *
 * <p>Invariants: after a load, rows {@code [0, rows())} hold the chunk's values; the arrays
 * are reused by the next load (grown when a chunk has more rows), so what a load filled is
 * valid until the next one; {@link #isNull} reads the chunk's validity bitmap, absent when it
 * has no nulls; values under nulls are whatever was stored.
 */
public final class FlatValues {
  public static final int INT = 1;
  public static final int LONG = 2;
  public static final int DOUBLE = 3;

  /** {@link #INT}, {@link #LONG} or {@link #DOUBLE}. */
  public final int kind;
  int rows;
  int nulls;
  /** Bit {@code i % 8} of byte {@code i / 8} set when row i is valid; null without nulls. */
  byte[] validity;
  int[] ints = new int[0];
  long[] longs = new long[0];

  private FlatValues(int kind) {
    this.kind = kind;
  }

  /**
   * Where {@code field}, a top-level column, decodes to: a new holder of its kind, or null
   * when it takes an Arrow vector (every other type, and decimals above precision 18).
   */
  public static FlatValues of(Field field) {
    int kind = kindOf(field.getType());
    return kind == 0 ? null : new FlatValues(kind);
  }

  static int kindOf(ArrowType type) {
    if (type instanceof ArrowType.Int) {
      ArrowType.Int t = (ArrowType.Int) type;
      if (!t.getIsSigned()) {
        return 0;
      }
      return t.getBitWidth() == 32 ? INT : t.getBitWidth() == 64 ? LONG : 0;
    }
    if (type instanceof ArrowType.Date) {
      return ((ArrowType.Date) type).getUnit() == DateUnit.DAY ? INT : 0;
    }
    if (type instanceof ArrowType.Decimal) {
      return ((ArrowType.Decimal) type).getPrecision() <= 18 ? LONG : 0;
    }
    if (type instanceof ArrowType.FloatingPoint) {
      return ((ArrowType.FloatingPoint) type).getPrecision() == FloatingPointPrecision.DOUBLE ? DOUBLE : 0;
    }
    return 0;
  }

  /** Room for {@code n} rows and {@code nulls} nulls; the previous contents are dropped. */
  void reset(int n, int nullCount) {
    rows = n;
    nulls = nullCount;
    if (kind == INT && ints.length < n) {
      ints = new int[n];
    } else if (kind != INT && longs.length < n) {
      longs = new long[n];
    }
    if (nullCount == 0) {
      validity = null;
    } else if (validity == null || validity.length < (n + 7) / 8) {
      validity = new byte[(n + 7) / 8];
    }
  }

  public int rows() {
    return rows;
  }

  public int nullCount() {
    return nulls;
  }

  public boolean isNull(int row) {
    return validity != null && (validity[row >>> 3] & (1 << (row & 7))) == 0;
  }

  public int getInt(int row) {
    return ints[row];
  }

  public long getLong(int row) {
    return longs[row];
  }

  public double getDouble(int row) {
    return Double.longBitsToDouble(longs[row]);
  }
}
