package persistshard.companion;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.util.HashMap;
import java.util.Locale;
import java.util.Map;
import org.apache.spark.sql.connector.catalog.MetadataColumn;
import org.apache.spark.sql.connector.expressions.Expressions;
import org.apache.spark.sql.connector.expressions.NamedReference;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.write.DeltaWrite;
import org.apache.spark.sql.connector.write.DeltaWriteBuilder;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.RowLevelOperation;
import org.apache.spark.sql.connector.write.RowLevelOperationInfo;
import org.apache.spark.sql.connector.write.SupportsDelta;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * {@code DELETE FROM}, {@code UPDATE} and {@code MERGE INTO} on a companion table: a
 * delta-based row-level operation (docs/design.md, "Row-level operations";
 * {@code persistshard.datasource.rowlevel} is the Python side).
 *
 * <p>Invariants: the row id is {@link #ROW_ID}, the whole row as one non-null struct, so a
 * row read {@code k} times (multiplicity {@code k}) is deleted or updated {@code k} times and
 * a row with null columns has a row id all the same. When Spark builds the operation (before
 * it reads anything), Python mints the write with {@code expected_upper = U}, the shard's
 * upper then; the target is read at {@code as_of U - 1} and the commit expects {@code U}, so
 * a writer committing in between makes the statement fail with {@code UpperMismatch} and
 * apply nothing. Updates are retractions of the old row and insertions of the new one.
 */
final class DeltaOperation implements SupportsDelta {
  /** The row id column: a metadata column of every companion table. */
  static final String ROW_ID = "_persistshard_row";

  private static final ObjectMapper JSON = new ObjectMapper();

  private final StructType schema;
  private final Command command;
  private final CaseInsensitiveStringMap options;
  private final String writer;
  private final long lower;

  DeltaOperation(CompanionTable table, RowLevelOperationInfo info) {
    this.schema = table.schema();
    this.command = info.command();
    this.options = table.merged(info.options().asCaseSensitiveMap());
    ObjectNode req = JSON.createObjectNode();
    req.put("kind", "delta_begin");
    ObjectNode opts = req.putObject("options");
    options.asCaseSensitiveMap().forEach(opts::put);
    try {
      req.set("schema", JSON.readTree(schema.json()));
    } catch (IOException e) {
      throw new IllegalStateException("Spark's schema JSON does not parse", e);
    }
    JsonNode begun = PlanServer.plan(Planner.python(), req);
    this.writer = begun.get("writer").textValue();
    this.lower = begun.get("lower").longValue();
  }

  /** The type of {@link #ROW_ID} for a table of {@code schema}: its columns, no metadata. */
  static StructType rowIdType(StructType schema) {
    StructField[] fields = new StructField[schema.size()];
    for (int i = 0; i < fields.length; i++) {
      StructField f = schema.fields()[i];
      fields[i] = DataTypes.createStructField(f.name(), f.dataType(), f.nullable());
    }
    return DataTypes.createStructType(fields);
  }

  /** The metadata column {@link #ROW_ID} of a table of {@code schema}. */
  static MetadataColumn rowIdColumn(StructType schema) {
    StructType type = rowIdType(schema);
    return new MetadataColumn() {
      @Override
      public String name() {
        return ROW_ID;
      }

      @Override
      public DataType dataType() {
        return type;
      }

      @Override
      public boolean isNullable() {
        return false;
      }

      @Override
      public String comment() {
        return "persistshard: the whole row, the row id of DELETE, UPDATE and MERGE";
      }
    };
  }

  @Override
  public String description() {
    return "persistshard " + command + " as retractions and insertions at " + lower;
  }

  @Override
  public Command command() {
    return command;
  }

  @Override
  public NamedReference[] rowId() {
    return new NamedReference[] {Expressions.column(ROW_ID)};
  }

  @Override
  public boolean representUpdateAsDeleteAndInsert() {
    return false;
  }

  @Override
  public ScanBuilder newScanBuilder(CaseInsensitiveStringMap statement) {
    Map<String, String> read = new HashMap<>(options.asCaseSensitiveMap());
    statement.asCaseSensitiveMap().forEach((k, v) -> read.put(k.toLowerCase(Locale.ROOT), v));
    if (lower > 0) {
      read.put("as_of", Long.toString(lower - 1)); // the snapshot the commit expects
    }
    CaseInsensitiveStringMap pinned = new CaseInsensitiveStringMap(read);
    ScanBuilder inner = ColumnarScanBuilder.accelerates(schema, pinned)
        ? new ColumnarScanBuilder(schema, pinned)
        : CompanionTable.pythonScan(schema, pinned);
    return new RowIdScan.Builder(inner, schema);
  }

  @Override
  public DeltaWriteBuilder newWriteBuilder(LogicalWriteInfo info) {
    // A DELETE writes row ids only (no columns); UPDATE and MERGE write whole rows.
    if (info.schema().size() != 0 && info.schema().size() != schema.size()) {
      throw new IllegalStateException("persistshard " + command + ": Spark writes "
          + info.schema().simpleString() + " to a table of " + schema.simpleString());
    }
    DeltaCommit commit = new DeltaCommit(Planner.python(), writer, schema, lower);
    return new DeltaWriteBuilder() {
      @Override
      public DeltaWrite build() {
        return commit;
      }
    };
  }

  /** Builds one {@link DeltaOperation}, when Spark asks (once per statement). */
  static RowLevelOperation build(CompanionTable table, RowLevelOperationInfo info) {
    return new DeltaOperation(table, info);
  }
}
