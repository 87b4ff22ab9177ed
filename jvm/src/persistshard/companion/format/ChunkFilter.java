package persistshard.companion.format;

import com.fasterxml.jackson.databind.JsonNode;
import java.math.BigDecimal;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import org.apache.arrow.vector.types.pojo.ArrowType;

/**
 * A scan's filter, decided against one chunk's statistics: {@link #mayMatch} is false only
 * when no row of the chunk can make the predicate true (a proof), true otherwise (a maybe).
 *
 * <p>The JVM twin of Python's {@code persistshard.core.read.filters.may_match}, over the same
 * predicate tree with the same semantics (SQL's three-valued logic: a comparison with a null is
 * never true). A filter belongs to the scan that built it: it holds no state, so nothing one
 * scan decides reaches another.
 *
 * <p>JSON form (what {@link #fromJson} reads): {@code {"op": OP, "column": NAME, "value": V}}
 * for a leaf and {@code {"op": "and"|"or"|"not", "children": [...]}} otherwise, OP one of
 * {@code eq eq_null_safe lt le gt ge in is_null is_not_null starts_with}; V in the raw
 * statistics form of the column's type (docs/format.md, "Statistics": an integer for integer
 * and temporal types, a boolean, a string, lowercase hex for binary, the text of a decimal),
 * a list for {@code in}, null for {@code eq_null_safe} with a null.
 */
public final class ChunkFilter {
  private final String op;
  private final String column;
  private final JsonNode value;
  private final List<ChunkFilter> children;

  private ChunkFilter(String op, String column, JsonNode value, List<ChunkFilter> children) {
    this.op = op;
    this.column = column;
    this.value = value;
    this.children = children;
  }

  /** The filter a JSON predicate describes; IllegalArgumentException if malformed. */
  public static ChunkFilter fromJson(JsonNode obj) {
    JsonNode opNode = Layout.get(obj, "op");
    String op = opNode.asText();
    switch (op) {
      case "and":
      case "or":
      case "not": {
        JsonNode kids = Layout.get(obj, "children");
        List<ChunkFilter> children = new ArrayList<>();
        for (JsonNode k : kids) {
          children.add(fromJson(k));
        }
        if (op.equals("not") && children.size() != 1) {
          throw new IllegalArgumentException("'not' takes one child");
        }
        return new ChunkFilter(op, null, null, List.copyOf(children));
      }
      case "eq": case "eq_null_safe": case "lt": case "le": case "gt": case "ge":
      case "in": case "is_null": case "is_not_null": case "starts_with": {
        JsonNode col = Layout.get(obj, "column");
        JsonNode value = obj.get("value");
        if (op.equals("in") && (value == null || !value.isArray())) {
          throw new IllegalArgumentException("'in' takes a list of values");
        }
        return new ChunkFilter(op, col.asText(), value, List.of());
      }
      default:
        throw new IllegalArgumentException("unknown filter operator '" + op + "'");
    }
  }

  /** Whether some row of chunk {@code chunk} of {@code part} can make this filter true. */
  public boolean mayMatch(PartFile part, int chunk) {
    PartFile.Chunk info = part.chunks.get(chunk);
    switch (op) {
      case "and":
        return children.stream().allMatch(c -> c.mayMatch(part, chunk));
      case "or":
        return children.stream().anyMatch(c -> c.mayMatch(part, chunk));
      case "not": {
        ChunkFilter child = children.get(0);
        if (child.op.equals("is_null") || child.op.equals("is_not_null")) {
          String flipped = child.op.equals("is_null") ? "is_not_null" : "is_null";
          return new ChunkFilter(flipped, child.column, null, List.of()).mayMatch(part, chunk);
        }
        return true;
      }
      default:
        break;
    }
    int index;
    try {
      index = part.columns(List.of(column))[0];
    } catch (IllegalArgumentException e) {
      return true; // not a column of this part: no proof
    }
    JsonNode lo;
    JsonNode hi;
    long nulls;
    if (info.stats != null) {
      JsonNode entry = info.stats.get(index);
      lo = entry.get(0);
      hi = entry.get(1);
      nulls = entry.get(2).longValue();
    } else if (column.equals(part.sortColumn)) {
      lo = info.keyMin;
      hi = info.keyMax;
      nulls = info.keyNullCount;
    } else {
      return true;
    }
    long rows = info.numRows;
    boolean nullValue = value == null || value.isNull();
    if (op.equals("is_null") || (op.equals("eq_null_safe") && nullValue)) {
      return nulls > 0;
    }
    if (op.equals("is_not_null")) {
      return nulls < rows;
    }
    if (nulls >= rows) {
      return false; // every value is null: no value test is true
    }
    if (lo.isNull() || hi.isNull()) {
      return true;
    }
    ArrowType type = part.layouts.get(index).field.getType();
    try {
      switch (op) {
        case "eq":
        case "eq_null_safe":
          return compare(lo, value, type) <= 0 && compare(value, hi, type) <= 0;
        case "lt":
          return compare(lo, value, type) < 0;
        case "le":
          return compare(lo, value, type) <= 0;
        case "gt":
          return compare(hi, value, type) > 0;
        case "ge":
          return compare(hi, value, type) >= 0;
        case "in":
          for (JsonNode v : value) {
            if (!v.isNull() && compare(lo, v, type) <= 0 && compare(v, hi, type) <= 0) {
              return true;
            }
          }
          return false;
        case "starts_with": {
          if (!(type instanceof ArrowType.Utf8 || type instanceof ArrowType.LargeUtf8)) {
            return true;
          }
          String v = value.textValue();
          int n = v.codePointCount(0, v.length());
          return compareBytes(utf8(prefix(lo.textValue(), n)), utf8(v)) <= 0
              && compareBytes(utf8(v), utf8(prefix(hi.textValue(), n))) <= 0;
        }
        default:
          return true;
      }
    } catch (NotComparable e) {
      return true; // statistics or a value of an unexpected form: no proof
    }
  }

  /** The chunks of {@code part} this filter may match, in file order. */
  public int[] chunks(PartFile part) {
    int[] out = new int[part.chunks.size()];
    int n = 0;
    for (int i = 0; i < part.chunks.size(); i++) {
      if (mayMatch(part, i)) {
        out[n++] = i;
      }
    }
    return Arrays.copyOf(out, n);
  }

  private static final class NotComparable extends Exception {
    private static final long serialVersionUID = 1L;
  }

  /** Orders two raw statistics values of {@code type} the way the writer's min/max did. */
  private static int compare(JsonNode a, JsonNode b, ArrowType type) throws NotComparable {
    if (a == null || b == null) {
      throw new NotComparable();
    }
    switch (type.getTypeID()) {
      case Int:
      case Date:
      case Time:
      case Timestamp:
      case Duration:
        if (!a.isIntegralNumber() || !b.isIntegralNumber()) {
          throw new NotComparable();
        }
        return a.bigIntegerValue().compareTo(b.bigIntegerValue());
      case Bool:
        if (!a.isBoolean() || !b.isBoolean()) {
          throw new NotComparable();
        }
        return Boolean.compare(a.booleanValue(), b.booleanValue());
      case Decimal:
        if (!a.isTextual() || !b.isTextual()) {
          throw new NotComparable();
        }
        try {
          return new BigDecimal(a.textValue()).compareTo(new BigDecimal(b.textValue()));
        } catch (NumberFormatException e) {
          throw new NotComparable();
        }
      case Utf8:
      case LargeUtf8:
        if (!a.isTextual() || !b.isTextual()) {
          throw new NotComparable();
        }
        return compareBytes(utf8(a.textValue()), utf8(b.textValue()));
      case Binary:
      case LargeBinary:
      case FixedSizeBinary:
        if (!a.isTextual() || !b.isTextual()) {
          throw new NotComparable();
        }
        return compareBytes(hex(a.textValue()), hex(b.textValue()));
      default:
        throw new NotComparable();
    }
  }

  private static byte[] utf8(String s) {
    return s.getBytes(StandardCharsets.UTF_8);
  }

  private static String prefix(String s, int codePoints) {
    int n = Math.min(codePoints, s.codePointCount(0, s.length()));
    return s.substring(0, s.offsetByCodePoints(0, n));
  }

  private static byte[] hex(String s) throws NotComparable {
    if (s.length() % 2 != 0) {
      throw new NotComparable();
    }
    byte[] out = new byte[s.length() / 2];
    for (int i = 0; i < out.length; i++) {
      int hiNibble = Character.digit(s.charAt(2 * i), 16);
      int loNibble = Character.digit(s.charAt(2 * i + 1), 16);
      if (hiNibble < 0 || loNibble < 0) {
        throw new NotComparable();
      }
      out[i] = (byte) (hiNibble << 4 | loNibble);
    }
    return out;
  }

  private static int compareBytes(byte[] a, byte[] b) {
    return Arrays.compareUnsigned(a, b);
  }

}
