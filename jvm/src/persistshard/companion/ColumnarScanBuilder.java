package persistshard.companion;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.Set;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownFilters;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.sources.And;
import org.apache.spark.sql.sources.EqualNullSafe;
import org.apache.spark.sql.sources.EqualTo;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.sources.GreaterThan;
import org.apache.spark.sql.sources.GreaterThanOrEqual;
import org.apache.spark.sql.sources.In;
import org.apache.spark.sql.sources.IsNotNull;
import org.apache.spark.sql.sources.IsNull;
import org.apache.spark.sql.sources.LessThan;
import org.apache.spark.sql.sources.LessThanOrEqual;
import org.apache.spark.sql.sources.Or;
import org.apache.spark.sql.sources.StringStartsWith;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * A batch snapshot read in the JVM: column pruning, and the scan's filters used to skip
 * chunks by their statistics.
 *
 * <p>Invariants: the filters Spark pushes here are kept on this builder and the one scan it
 * builds, never anywhere another scan can see them; every one of them is also returned to
 * Spark ({@link #pushFilters}), which evaluates it on the rows, so skipping is only ever an
 * optimization: a chunk is left out only when its statistics prove no row of it passes.
 */
public final class ColumnarScanBuilder
    implements ScanBuilder, SupportsPushDownRequiredColumns, SupportsPushDownFilters {

  /** Options whose reads are not plain snapshots: their scans are the Python source's. */
  static final Set<String> PYTHON_READ_OPTIONS =
      Set.of("with_diff", "changes", "updates_from", "updates_to", "consumer", "where",
          "reader_id", "reader_lease_seconds");

  /** The field metadata key of a SQL table's declared columns (Python's LOCATION_KEY). */
  static final String LOCATION_KEY = "persistshard.location";

  private static final JsonNodeFactory NODES = JsonNodeFactory.instance;

  private final StructType schema;
  private final CaseInsensitiveStringMap options;
  private StructType required;
  private Filter[] pushed = new Filter[0];
  private final List<JsonNode> skipping = new ArrayList<>();

  ColumnarScanBuilder(StructType schema, CaseInsensitiveStringMap options) {
    this.schema = schema;
    this.options = options;
    this.required = schema;
  }

  /**
   * Whether a batch read of {@code schema} with {@code options} is read here: a snapshot
   * (no option of {@link #PYTHON_READ_OPTIONS}, no {@code _time}/{@code _diff} column) of a
   * path read (a SQL table's declared columns keep the Python source's checks).
   */
  static boolean accelerates(StructType schema, CaseInsensitiveStringMap options) {
    for (String key : options.keySet()) {
      if (PYTHON_READ_OPTIONS.contains(key.toLowerCase(Locale.ROOT))) {
        return false;
      }
    }
    for (StructField f : schema.fields()) {
      if (f.name().equals("_time") || f.name().equals("_diff")
          || f.metadata().contains(LOCATION_KEY)) {
        return false;
      }
    }
    return true;
  }

  @Override
  public void pruneColumns(StructType requiredSchema) {
    this.required = requiredSchema;
  }

  @Override
  public Filter[] pushFilters(Filter[] filters) {
    List<Filter> used = new ArrayList<>();
    for (Filter f : filters) {
      JsonNode json = translate(f);
      if (json != null) {
        skipping.add(json);
        used.add(f);
      }
    }
    pushed = used.toArray(new Filter[0]);
    return filters; // Spark evaluates every filter: skipping decides chunks, never rows
  }

  @Override
  public Filter[] pushedFilters() {
    return Arrays.copyOf(pushed, pushed.length);
  }

  @Override
  public Scan build() {
    JsonNode filter = null;
    if (skipping.size() == 1) {
      filter = skipping.get(0);
    } else if (!skipping.isEmpty()) {
      filter = node("and", null, null, skipping);
    }
    return new ColumnarScan(schema, required, options, filter == null ? null : filter.toString(),
        pushedFilters());
  }

  /** The {@code ChunkFilter} JSON of {@code f}, or null when it has none (no skipping). */
  JsonNode translate(Filter f) {
    if (f instanceof And) {
      JsonNode l = translate(((And) f).left());
      JsonNode r = translate(((And) f).right());
      if (l == null || r == null) {
        return l == null ? r : l; // a conjunct alone admits more rows: still a sound proof
      }
      return node("and", null, null, List.of(l, r));
    }
    if (f instanceof Or) {
      JsonNode l = translate(((Or) f).left());
      JsonNode r = translate(((Or) f).right());
      return l == null || r == null ? null : node("or", null, null, List.of(l, r));
    }
    if (f instanceof IsNull) {
      return leaf("is_null", ((IsNull) f).attribute(), null, true);
    }
    if (f instanceof IsNotNull) {
      return leaf("is_not_null", ((IsNotNull) f).attribute(), null, true);
    }
    if (f instanceof EqualTo) {
      return leaf("eq", ((EqualTo) f).attribute(), value(((EqualTo) f).value()), false);
    }
    if (f instanceof EqualNullSafe) {
      Object v = ((EqualNullSafe) f).value();
      return leaf("eq_null_safe", ((EqualNullSafe) f).attribute(),
          v == null ? NODES.nullNode() : value(v), false);
    }
    if (f instanceof LessThan) {
      return leaf("lt", ((LessThan) f).attribute(), value(((LessThan) f).value()), false);
    }
    if (f instanceof LessThanOrEqual) {
      return leaf("le", ((LessThanOrEqual) f).attribute(), value(((LessThanOrEqual) f).value()),
          false);
    }
    if (f instanceof GreaterThan) {
      return leaf("gt", ((GreaterThan) f).attribute(), value(((GreaterThan) f).value()), false);
    }
    if (f instanceof GreaterThanOrEqual) {
      return leaf("ge", ((GreaterThanOrEqual) f).attribute(),
          value(((GreaterThanOrEqual) f).value()), false);
    }
    if (f instanceof StringStartsWith) {
      return leaf("starts_with", ((StringStartsWith) f).attribute(),
          NODES.textNode(((StringStartsWith) f).value()), false);
    }
    if (f instanceof In) {
      ArrayNode values = NODES.arrayNode();
      for (Object v : ((In) f).values()) {
        JsonNode j = v == null ? NODES.nullNode() : value(v);
        if (j == null) {
          return null;
        }
        values.add(j);
      }
      return leaf("in", ((In) f).attribute(), values, false);
    }
    return null;
  }

  private JsonNode leaf(String op, String column, JsonNode value, boolean noValue) {
    if ((value == null && !noValue) || !topLevel(column)) {
      return null;
    }
    ObjectNode out = NODES.objectNode();
    out.put("op", op);
    out.put("column", column);
    if (value != null) {
      out.set("value", value);
    }
    return out;
  }

  private boolean topLevel(String column) {
    for (String name : required.fieldNames()) {
      if (name.equals(column)) {
        return true;
      }
    }
    for (String name : schema.fieldNames()) {
      if (name.equals(column)) {
        return true;
      }
    }
    return false;
  }

  private static JsonNode node(String op, String column, JsonNode value, List<JsonNode> kids) {
    ObjectNode out = NODES.objectNode();
    out.put("op", op);
    ArrayNode children = out.putArray("children");
    kids.forEach(children::add);
    return out;
  }

  /** A filter value in the statistics' raw form, or null for a type not compared here. */
  static JsonNode value(Object v) {
    if (v instanceof Long || v instanceof Integer || v instanceof Short || v instanceof Byte) {
      return NODES.numberNode(((Number) v).longValue());
    }
    if (v instanceof String) {
      return NODES.textNode((String) v);
    }
    if (v instanceof Boolean) {
      return NODES.booleanNode((Boolean) v);
    }
    if (v instanceof java.time.LocalDate) {
      return NODES.numberNode(((java.time.LocalDate) v).toEpochDay());
    }
    if (v instanceof java.sql.Date) {
      return NODES.numberNode(((java.sql.Date) v).toLocalDate().toEpochDay());
    }
    return null;
  }

  static final ObjectMapper JSON = new ObjectMapper();
}
