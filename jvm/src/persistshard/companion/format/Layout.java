package persistshard.companion.format;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.arrow.vector.types.DateUnit;
import org.apache.arrow.vector.types.FloatingPointPrecision;
import org.apache.arrow.vector.types.IntervalUnit;
import org.apache.arrow.vector.types.TimeUnit;
import org.apache.arrow.vector.types.pojo.ArrowType;
import org.apache.arrow.vector.types.pojo.Field;
import org.apache.arrow.vector.types.pojo.FieldType;

/**
 * How one node of a stored type tree is laid out in a payload, and the Arrow Java field it
 * decodes to (docs/format.md, "Schema" and "Segments and payloads"; Python's
 * {@code persistshard.format.chunk.Layout}).
 *
 * <p>Invariants: a layout is immutable; {@link #tableWords} is the number of u64 words the
 * node and its descendants take in a payload's node table, a function of the type alone.
 *
 * <p>One difference from the Python reader: Arrow Java has no 32- or 64-bit decimal vector, so
 * {@code decimal} of {@code bits} 32 or 64 decodes to a 128-bit decimal of the same precision
 * and scale ({@link #widenTo} is 16), the values sign-extended: the same numbers.
 */
final class Layout {
  static final int NULL = 0;
  static final int BOOL = 1;
  static final int FIXED = 2;
  static final int VARBIN = 3;
  static final int LIST = 4;
  static final int FIXED_LIST = 5;
  static final int STRUCT = 6;

  private static final int[] SLOTS = {0, 2, 2, 3, 2, 1, 1};

  final Field field;
  final int kind;
  /** FIXED: bytes per stored value; VARBIN/LIST: bytes per offset; FIXED_LIST: list size. */
  final int width;
  /** FIXED: values byte-shuffled in a compressed segment's payload. */
  final boolean shuffle;
  /** FIXED decimals stored narrower than Arrow Java holds them: bytes per decoded value. */
  final int widenTo;

  final List<Layout> children;
  final int tableWords;

  private Layout(Field field, int kind, int width, boolean shuffle, int widenTo, List<Layout> children) {
    this.field = field;
    this.kind = kind;
    this.width = width;
    this.shuffle = shuffle;
    this.widenTo = widenTo;
    this.children = List.copyOf(children);
    int words = 2 + SLOTS[kind];
    for (Layout c : children) {
      words += c.tableWords;
    }
    this.tableWords = words;
  }

  int slots() {
    return SLOTS[kind];
  }

  /** The layout of a stored field (its footer JSON); IllegalArgumentException if malformed. */
  static Layout ofField(JsonNode obj) {
    String name = text(obj, "name");
    JsonNode nullableNode = get(obj, "nullable");
    if (!nullableNode.isBoolean()) {
      throw new IllegalArgumentException("'nullable' has the wrong JSON type");
    }
    boolean nullable = nullableNode.booleanValue();
    Map<String, String> metadata = metadata(obj.get("metadata"));
    JsonNode type = get(obj, "type");
    String t = text(type, "type");
    switch (t) {
      case "null":
        return leaf(name, nullable, metadata, ArrowType.Null.INSTANCE, NULL, 0, false, 0);
      case "bool":
        return leaf(name, nullable, metadata, ArrowType.Bool.INSTANCE, BOOL, 0, false, 0);
      case "int8": case "int16": case "int32": case "int64":
      case "uint8": case "uint16": case "uint32": case "uint64": {
        boolean signed = t.charAt(0) == 'i';
        int bits = Integer.parseInt(t.substring(signed ? 3 : 4));
        return fixed(name, nullable, metadata, new ArrowType.Int(bits, signed), bits / 8);
      }
      case "float16":
        return fixed(name, nullable, metadata, new ArrowType.FloatingPoint(FloatingPointPrecision.HALF), 2);
      case "float32":
        return fixed(name, nullable, metadata, new ArrowType.FloatingPoint(FloatingPointPrecision.SINGLE), 4);
      case "float64":
        return fixed(name, nullable, metadata, new ArrowType.FloatingPoint(FloatingPointPrecision.DOUBLE), 8);
      case "decimal": {
        int bits = integer(type, "bits");
        int precision = integer(type, "precision");
        int scale = integer(type, "scale");
        if (bits != 32 && bits != 64 && bits != 128 && bits != 256) {
          throw new IllegalArgumentException("bad decimal width " + bits);
        }
        int decoded = Math.max(bits, 128);
        ArrowType arrow = new ArrowType.Decimal(precision, scale, decoded);
        return leaf(name, nullable, metadata, arrow, FIXED, bits / 8, bits > 8, bits < 128 ? 16 : 0);
      }
      case "date32":
        return fixed(name, nullable, metadata, new ArrowType.Date(DateUnit.DAY), 4);
      case "date64":
        return fixed(name, nullable, metadata, new ArrowType.Date(DateUnit.MILLISECOND), 8);
      case "time32": {
        TimeUnit unit = unit(type, "s", "ms");
        return fixed(name, nullable, metadata, new ArrowType.Time(unit, 32), 4);
      }
      case "time64": {
        TimeUnit unit = unit(type, "us", "ns");
        return fixed(name, nullable, metadata, new ArrowType.Time(unit, 64), 8);
      }
      case "timestamp": {
        JsonNode tz = type.get("tz");
        if (tz != null && !tz.isNull() && !tz.isTextual()) {
          throw new IllegalArgumentException("bad time zone");
        }
        TimeUnit unit = unit(type, "s", "ms", "us", "ns");
        String zone = tz == null || tz.isNull() ? null : tz.textValue();
        return fixed(name, nullable, metadata, new ArrowType.Timestamp(unit, zone), 8);
      }
      case "duration":
        return fixed(name, nullable, metadata, new ArrowType.Duration(unit(type, "s", "ms", "us", "ns")), 8);
      case "interval_mdn":
        return fixed(name, nullable, metadata, new ArrowType.Interval(IntervalUnit.MONTH_DAY_NANO), 16);
      case "fixed_binary": {
        int w = integer(type, "width");
        return leaf(name, nullable, metadata, new ArrowType.FixedSizeBinary(w), FIXED, w, false, 0);
      }
      case "string":
        return leaf(name, nullable, metadata, ArrowType.Utf8.INSTANCE, VARBIN, 4, false, 0);
      case "binary":
        return leaf(name, nullable, metadata, ArrowType.Binary.INSTANCE, VARBIN, 4, false, 0);
      case "large_string":
        return leaf(name, nullable, metadata, ArrowType.LargeUtf8.INSTANCE, VARBIN, 8, false, 0);
      case "large_binary":
        return leaf(name, nullable, metadata, ArrowType.LargeBinary.INSTANCE, VARBIN, 8, false, 0);
      case "list":
        return nested(name, nullable, metadata, ArrowType.List.INSTANCE, LIST, 4, List.of(ofField(get(type, "child"))));
      case "large_list":
        return nested(name, nullable, metadata, ArrowType.LargeList.INSTANCE, LIST, 8, List.of(ofField(get(type, "child"))));
      case "fixed_list": {
        int size = integer(type, "size");
        return nested(name, nullable, metadata, new ArrowType.FixedSizeList(size), FIXED_LIST, size,
            List.of(ofField(get(type, "child"))));
      }
      case "struct": {
        JsonNode fields = get(type, "children");
        if (!fields.isArray()) {
          throw new IllegalArgumentException("'children' has the wrong JSON type");
        }
        List<Layout> kids = new ArrayList<>();
        for (JsonNode f : fields) {
          kids.add(ofField(f));
        }
        return nested(name, nullable, metadata, ArrowType.Struct.INSTANCE, STRUCT, 0, kids);
      }
      case "map": {
        JsonNode sorted = get(type, "keys_sorted");
        if (!sorted.isBoolean()) {
          throw new IllegalArgumentException("'keys_sorted' has the wrong JSON type");
        }
        List<Layout> pair = List.of(ofField(get(type, "key")), ofField(get(type, "item")));
        Layout entries = nested("entries", false, null, ArrowType.Struct.INSTANCE, STRUCT, 0, pair);
        return nested(name, nullable, metadata, new ArrowType.Map(sorted.booleanValue()), LIST, 4,
            List.of(entries));
      }
      default:
        throw new IllegalArgumentException("unknown type '" + t + "'");
    }
  }

  private static Layout fixed(String name, boolean nullable, Map<String, String> metadata, ArrowType type, int width) {
    return leaf(name, nullable, metadata, type, FIXED, width, width > 1, 0);
  }

  private static Layout leaf(String name, boolean nullable, Map<String, String> metadata, ArrowType type,
      int kind, int width, boolean shuffle, int widenTo) {
    Field f = new Field(name, new FieldType(nullable, type, null, metadata), List.of());
    return new Layout(f, kind, width, shuffle, widenTo, List.of());
  }

  private static Layout nested(String name, boolean nullable, Map<String, String> metadata, ArrowType type,
      int kind, int width, List<Layout> children) {
    List<Field> fields = new ArrayList<>();
    for (Layout c : children) {
      fields.add(c.field);
    }
    Field f = new Field(name, new FieldType(nullable, type, null, metadata), fields);
    return new Layout(f, kind, width, false, 0, children);
  }

  /** A layout whose fixed-width values are stored as is: a plain segment's payload. */
  Layout unshuffled() {
    List<Layout> kids = new ArrayList<>();
    boolean changed = shuffle;
    for (Layout c : children) {
      Layout u = c.unshuffled();
      changed |= u != c;
      kids.add(u);
    }
    return changed ? new Layout(field, kind, width, false, widenTo, kids) : this;
  }

  static Map<String, String> metadata(JsonNode obj) {
    if (obj == null || obj.isNull()) {
      return null;
    }
    if (!obj.isArray()) {
      throw new IllegalArgumentException("metadata must be a list of pairs");
    }
    Map<String, String> out = new LinkedHashMap<>();
    for (Iterator<JsonNode> it = obj.elements(); it.hasNext(); ) {
      JsonNode pair = it.next();
      if (!pair.isArray() || pair.size() != 2 || !pair.get(0).isTextual() || !pair.get(1).isTextual()) {
        throw new IllegalArgumentException("metadata entries must be [key, value] string pairs");
      }
      out.put(pair.get(0).textValue(), pair.get(1).textValue());
    }
    return out;
  }

  static JsonNode get(JsonNode obj, String key) {
    JsonNode v = obj == null || !obj.isObject() ? null : obj.get(key);
    if (v == null) {
      throw new IllegalArgumentException("missing '" + key + "'");
    }
    return v;
  }

  private static String text(JsonNode obj, String key) {
    JsonNode v = get(obj, key);
    if (!v.isTextual()) {
      throw new IllegalArgumentException("'" + key + "' has the wrong JSON type");
    }
    return v.textValue();
  }

  private static int integer(JsonNode obj, String key) {
    JsonNode v = get(obj, key);
    if (!v.isIntegralNumber() || !v.canConvertToInt() || v.intValue() < 0) {
      throw new IllegalArgumentException("'" + key + "' must be a non-negative integer");
    }
    return v.intValue();
  }

  private static TimeUnit unit(JsonNode type, String... allowed) {
    String u = text(type, "unit");
    for (String a : allowed) {
      if (a.equals(u)) {
        switch (u) {
          case "s":
            return TimeUnit.SECOND;
          case "ms":
            return TimeUnit.MILLISECOND;
          case "us":
            return TimeUnit.MICROSECOND;
          default:
            return TimeUnit.NANOSECOND;
        }
      }
    }
    throw new IllegalArgumentException("bad time unit '" + u + "'");
  }
}
