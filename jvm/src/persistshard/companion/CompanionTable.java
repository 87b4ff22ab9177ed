package persistshard.companion;

import java.util.HashMap;
import java.util.Locale;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.TreeSet;
import org.apache.spark.sql.connector.catalog.MetadataColumn;
import org.apache.spark.sql.connector.catalog.SupportsMetadataColumns;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.SupportsRowLevelOperations;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.RowLevelOperationBuilder;
import org.apache.spark.sql.connector.write.RowLevelOperationInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.execution.datasources.v2.python.PythonScanBuilder;
import org.apache.spark.sql.execution.datasources.v2.python.PythonTable;
import org.apache.spark.sql.execution.datasources.v2.python.PythonWriteBuilder;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * A persistshard table as Spark resolved it, with the properties Spark gave the provider.
 *
 * <p>Invariants: {@link #properties} never changes after construction; every scan builder
 * and write builder is new, and so is the Python source behind a delegated one, so nothing
 * one scan or write leaves behind is seen by another. Options are merged as {@code
 * properties, then statement options} (the statement's value wins), keys lower-cased as
 * Spark hands them to Python, plus {@link CompanionProvider#MARKER_KEY}. {@code DELETE},
 * {@code UPDATE} and {@code MERGE} are {@link DeltaOperation}s, whose row id is the metadata
 * column {@link DeltaOperation#ROW_ID}.
 */
@SuppressWarnings("deprecation") // Table.schema(): PythonTable implements it too
final class CompanionTable
    implements SupportsRead, SupportsWrite, SupportsRowLevelOperations, SupportsMetadataColumns {

  private final String name;
  private final StructType schema;
  private final Map<String, String> properties;
  /** The keys of {@link #properties} from the table's OPTIONS; null for a path table. */
  private final Set<String> tableOptions;
  private final Map<String, String> catalogProperties;

  /** A path-based table: {@code properties} are the options Spark gave the provider. */
  CompanionTable(StructType schema, Map<String, String> properties) {
    this.name = CompanionProvider.PYTHON_NAME;
    this.schema = schema;
    this.properties = Map.copyOf(properties);
    this.tableOptions = null;
    this.catalogProperties = Map.of();
  }

  /**
   * A catalog table ({@link CompanionCatalog}): {@code properties} are its data source
   * options (its location as {@code path}), {@code tableOptions} the keys among them that
   * are the table's OPTIONS, {@code catalogProperties} what the catalog stores (location,
   * provider, {@code option.*}), which DESCRIBE and SHOW CREATE TABLE show.
   */
  CompanionTable(String name, StructType schema, Map<String, String> properties,
      Set<String> tableOptions, Map<String, String> catalogProperties) {
    this.name = name;
    this.schema = schema;
    this.properties = Map.copyOf(properties);
    this.tableOptions = Set.copyOf(tableOptions);
    this.catalogProperties = Map.copyOf(catalogProperties);
  }

  @Override
  public String name() {
    return name;
  }

  @Override
  public Map<String, String> properties() {
    return catalogProperties;
  }

  @Override
  public StructType schema() {
    return schema;
  }

  @Override
  public Set<TableCapability> capabilities() {
    // The Python table's own list: the companion adds no capability.
    return new PythonTable(CompanionProvider.fresh(), CompanionProvider.PYTHON_NAME, schema)
        .capabilities();
  }

  /**
   * The table's properties under the statement's options, plus the companion's marker; for a
   * catalog table also {@link CompanionCatalog#TABLE_KEY} (unless the statement names a path
   * or location of its own) and {@link CompanionCatalog#TABLE_OPTIONS_KEY} (the table's
   * OPTIONS the statement did not give itself).
   */
  CaseInsensitiveStringMap merged(Map<String, String> statement) {
    Map<String, String> out = new HashMap<>();
    properties.forEach((k, v) -> out.put(k.toLowerCase(Locale.ROOT), v));
    Set<String> given = new TreeSet<>();
    statement.forEach((k, v) -> {
      String key = k.toLowerCase(Locale.ROOT);
      out.put(key, v);
      given.add(key);
    });
    out.put(CompanionProvider.MARKER_KEY, CompanionProvider.MARKER_VALUE);
    if (tableOptions != null) {
      if (!given.contains("path") && !given.contains("location")) {
        out.put(CompanionCatalog.TABLE_KEY, name);
      }
      Set<String> kept = new TreeSet<>(tableOptions);
      kept.removeAll(given);
      if (!kept.isEmpty()) {
        out.put(CompanionCatalog.TABLE_OPTIONS_KEY, String.join(",", kept));
      }
    }
    return new CaseInsensitiveStringMap(out);
  }

  /** The Python source's scan builder for these options, on a Python source of its own. */
  static ScanBuilder pythonScan(StructType schema, CaseInsensitiveStringMap options) {
    return new PythonScanBuilder(
        CompanionProvider.fresh(), CompanionProvider.PYTHON_NAME, schema, options);
  }

  @Override
  public ScanBuilder newScanBuilder(CaseInsensitiveStringMap statement) {
    CaseInsensitiveStringMap options = merged(statement);
    if (ColumnarScanBuilder.accelerates(schema, options)) {
      return new ColumnarScanBuilder(schema, options);
    }
    return pythonScan(schema, options);
  }

  @Override
  public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
    LogicalWriteInfo withProperties = new MergedWriteInfo(info, merged(info.options()));
    return new PythonWriteBuilder(
        CompanionProvider.fresh(), CompanionProvider.PYTHON_NAME, withProperties);
  }

  @Override
  public RowLevelOperationBuilder newRowLevelOperationBuilder(RowLevelOperationInfo info) {
    return () -> DeltaOperation.build(this, info);
  }

  @Override
  public MetadataColumn[] metadataColumns() {
    return new MetadataColumn[] {DeltaOperation.rowIdColumn(schema)};
  }

  /** Spark's write info with the merged options; everything else is Spark's. */
  private static final class MergedWriteInfo implements LogicalWriteInfo {
    private final LogicalWriteInfo spark;
    private final CaseInsensitiveStringMap options;

    MergedWriteInfo(LogicalWriteInfo spark, CaseInsensitiveStringMap options) {
      this.spark = spark;
      this.options = options;
    }

    @Override
    public CaseInsensitiveStringMap options() {
      return options;
    }

    @Override
    public String queryId() {
      return spark.queryId();
    }

    @Override
    public StructType schema() {
      return spark.schema();
    }

    @Override
    public Optional<StructType> rowIdSchema() {
      return spark.rowIdSchema();
    }

    @Override
    public Optional<StructType> metadataSchema() {
      return spark.metadataSchema();
    }
  }
}
