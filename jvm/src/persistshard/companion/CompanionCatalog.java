package persistshard.companion;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.util.HashMap;
import java.util.Iterator;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import org.apache.spark.sql.catalyst.analysis.NoSuchNamespaceException;
import org.apache.spark.sql.catalyst.analysis.NoSuchTableException;
import org.apache.spark.sql.catalyst.analysis.TableAlreadyExistsException;
import org.apache.spark.sql.connector.catalog.CatalogV2Util;
import org.apache.spark.sql.connector.catalog.Column;
import org.apache.spark.sql.connector.catalog.DelegatingCatalogExtension;
import org.apache.spark.sql.connector.catalog.Identifier;
import org.apache.spark.sql.connector.catalog.StagedTable;
import org.apache.spark.sql.connector.catalog.StagingTableCatalog;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCatalog;
import org.apache.spark.sql.connector.catalog.TableWritePrivilege;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.types.StructType;

/**
 * The session catalog ({@code spark.sql.catalog.spark_catalog}) that makes a persistshard
 * table a full Spark table; {@code ps.configure_spark} sets it with the companion jar.
 *
 * <p>Every table and statement that is not persistshard's is the built-in session catalog's,
 * unchanged (it is the delegate). For a table whose provider is {@code persistshard}:
 * <ul>
 *   <li>{@link #loadTable} hands Spark a {@link CompanionTable} holding the table's OPTIONS
 *       and, as option {@code path}, its external location: every read and write of the table
 *       (INSERT, CTAS, saveAsTable, insertInto, writeTo) names that shard and no other,
 *       whatever metadata the query's columns carry; DESCRIBE and SHOW CREATE TABLE see the
 *       catalog's properties (location, provider, options). A statement that names no path
 *       of its own also carries {@link #TABLE_KEY}, so Python checks and evolves the shard's
 *       columns as a table's (ALTER TABLE ... ADD COLUMNS is the built-in catalog's, and the
 *       next write adds the column to the shard), and {@link #TABLE_OPTIONS_KEY}, so a table
 *       option of reads (a change table's {@code changes}) does not fail its writes.</li>
 *   <li>DROP TABLE, ALTER TABLE ... RENAME TO and every other ALTER TABLE are the built-in
 *       catalog's: a table with a location is external, so dropping it never deletes the
 *       shard, and renaming it keeps its location and options.</li>
 *   <li>{@code VERSION AS OF v} is the read option {@code as_of v}; {@code TIMESTAMP AS OF}
 *       is the shard time Python maps the instant to ({@code bridge} {@code time_at}: the
 *       newest time whose commit the log recorded at or before it).</li>
 *   <li>{@link #createTable} requires a location (LOCATION, or option {@code path}) and
 *       fails otherwise with an error that says how to create the table, before anything is
 *       stored or written: a persistshard table never lives at a managed default location.
 *       It refuses OPTIONS that would keep a secret in the catalog (a consensus URL with a
 *       password, storage options), as the Python source's CREATE does, also when the
 *       statement declares its columns (the Python source is then never asked by Spark).
 *       Without a column list the columns are the Python source's (the shard's, or the
 *       {@code columns} option for a new one); declared or CTAS columns lose any persistshard
 *       metadata a scan of another table put on them.</li>
 *   <li>CTAS and REPLACE (SQL, {@code writeTo}, {@code saveAsTable}) are staged ({@code
 *       StagingTableCatalog}): {@link #stageCreate}, {@link #stageReplace} and {@link
 *       #stageCreateOrReplace} check what {@link #createTable} checks and store nothing; the
 *       {@link StagedCompanionTable} commits the query's rows and stores the entry together
 *       when the query has run, so a failed query leaves table and shard as they were. A
 *       REPLACE that names no location keeps the table's. Another provider's statements get
 *       Spark's own non-atomic sequence ({@link Unstaged}).</li>
 * </ul>
 * A managed persistshard table (created without a location by a session without this
 * catalog) gets no {@code path}: its statements fail in Python with the error that says how
 * to create the table.
 */
public class CompanionCatalog extends DelegatingCatalogExtension
    implements StagingTableCatalog {
  private static final ObjectMapper JSON = new ObjectMapper();
  /** The read option a time-travel statement becomes. */
  static final String AS_OF = "as_of";
  /**
   * The option naming the table a statement reads or writes through its LOCATION (Python's
   * {@code TABLE_KEY}): Python then treats the statement's columns as the table's catalog
   * columns (ALTER TABLE ... ADD COLUMNS followed, dropped or renamed columns refused).
   */
  static final String TABLE_KEY = "__persistshard_table";
  /**
   * The option listing the keys a statement took from the table's OPTIONS (Python's {@code
   * TABLE_OPTIONS_KEY}): an operation that does not take one of them ignores it.
   */
  static final String TABLE_OPTIONS_KEY = "__persistshard_table_options";
  /** Field metadata keys persistshard's Python source reads a location from. */
  private static final String[] PERSISTSHARD_KEYS = {
    "persistshard.location", "persistshard.consensus", "persistshard.catalog"
  };
  /** Spark's key for a declared CHAR/VARCHAR type, which a persistshard scan also carries. */
  private static final String RAW_TYPE_KEY = "__CHAR_VARCHAR_TYPE_STRING";

  /** Whether catalog properties (or a loaded table's) name the provider persistshard. */
  static boolean ours(Map<String, String> properties) {
    String provider = properties.get(TableCatalog.PROP_PROVIDER);
    return provider != null
        && CompanionProvider.PYTHON_NAME.equals(provider.toLowerCase(Locale.ROOT));
  }

  /**
   * The data source options of a table: its {@code option.}-prefixed properties without the
   * prefix (keys lower-cased, as Spark hands options to Python), and its location as {@code
   * path} when the table is external; a managed table's location and {@code path} are
   * dropped (a default location is never a shard's).
   */
  static Map<String, String> options(Map<String, String> properties) {
    Map<String, String> out = new HashMap<>();
    properties.forEach((k, v) -> {
      if (k.startsWith(TableCatalog.OPTION_PREFIX)) {
        out.put(k.substring(TableCatalog.OPTION_PREFIX.length()).toLowerCase(Locale.ROOT), v);
      }
    });
    out.remove("location");
    boolean managed = "true".equalsIgnoreCase(
        properties.get(TableCatalog.PROP_IS_MANAGED_LOCATION))
        || "MANAGED".equalsIgnoreCase(properties.get(TableCatalog.PROP_TABLE_TYPE));
    if (managed) {
      out.remove("path");
      return out;
    }
    String location = properties.get(TableCatalog.PROP_LOCATION);
    if (location != null && !location.isEmpty()) {
      out.put("path", location);
    }
    return out;
  }

  String qualified(Identifier ident) {
    StringBuilder out = new StringBuilder(name());
    for (String part : ident.namespace()) {
      out.append('.').append(part);
    }
    return out.append('.').append(ident.name()).toString();
  }

  /** {@code table} as Spark should see it: a {@link CompanionTable} if it is ours. */
  private Table wrap(Identifier ident, Table table, Map<String, String> extra) {
    Map<String, String> properties = table.properties();
    if (!ours(properties)) {
      return table;
    }
    return companionTable(ident, table.schema(), properties, extra);
  }

  /** The persistshard table {@code ident} whose entry holds {@code properties}. */
  private CompanionTable companionTable(Identifier ident, StructType schema,
      Map<String, String> properties, Map<String, String> extra) {
    Map<String, String> options = options(properties);
    Set<String> fromTable = new TreeSet<>(options.keySet());
    fromTable.remove("path");
    options.putAll(extra);
    return new CompanionTable(qualified(ident), schema, options, fromTable, properties);
  }

  @Override
  public Table loadTable(Identifier ident) throws NoSuchTableException {
    return wrap(ident, super.loadTable(ident), Map.of());
  }

  @Override
  public Table loadTable(Identifier ident, String version) throws NoSuchTableException {
    Table table = super.loadTable(ident);
    if (!ours(table.properties())) {
      return super.loadTable(ident, version);
    }
    return wrap(ident, table, Map.of(AS_OF, version));
  }

  @Override
  public Table loadTable(Identifier ident, long timestamp) throws NoSuchTableException {
    Table table = super.loadTable(ident);
    if (!ours(table.properties())) {
      return super.loadTable(ident, timestamp);
    }
    ObjectNode req = JSON.createObjectNode();
    req.put("kind", "time_at");
    req.put("micros", timestamp);
    ObjectNode opts = req.putObject("options");
    options(table.properties()).forEach(opts::put);
    JsonNode answer = PlanServer.plan(Planner.python(), req);
    return wrap(ident, table, Map.of(AS_OF, Long.toString(answer.get("as_of").longValue())));
  }

  @Override
  public Table createTable(Identifier ident, Column[] columns, Transform[] partitions,
      Map<String, String> properties)
      throws TableAlreadyExistsException, NoSuchNamespaceException {
    if (!ours(properties)) {
      return super.createTable(ident, columns, partitions, properties);
    }
    Map<String, String> stored = checked(ident, partitions, properties);
    Column[] kept;
    if (columns.length == 0) {
      // The Python source's schema, with the options a CREATE hands it (its checks of what
      // may be stored in a catalog apply).
      Map<String, String> creating = new HashMap<>(options(properties));
      creating.put("location", stored.get(TableCatalog.PROP_LOCATION));
      creating.put(TableCatalog.PROP_PROVIDER, CompanionProvider.PYTHON_NAME);
      StructType schema = CompanionProvider.pythonSchema(creating);
      kept = CatalogV2Util.structTypeToV2Columns(schema, false);
    } else {
      kept = withoutScanMetadata(columns);
    }
    super.createTable(ident, kept, partitions, stored);
    try {
      return loadTable(ident);
    } catch (NoSuchTableException e) {
      throw new IllegalStateException("table " + qualified(ident) + " vanished while created",
          e);
    }
  }

  /**
   * What the catalog stores for a persistshard table created (or replaced) with {@code
   * properties}: them, with the location as {@link TableCatalog#PROP_LOCATION}. Refuses,
   * before anything is stored or written, a table without a location, with PARTITIONED BY,
   * or with OPTIONS that would keep a secret in the catalog.
   */
  private Map<String, String> checked(Identifier ident, Transform[] partitions,
      Map<String, String> properties) {
    Map<String, String> options = options(properties);
    String location = options.get("path");
    if (location == null || location.isEmpty()) {
      throw new IllegalArgumentException("InvalidOption: no shard location for table "
          + qualified(ident) + ": a persistshard table keeps its data where you say, never at "
          + "a default location, and nothing was created; create it with one, e.g. CREATE "
          + "TABLE t (id BIGINT, name STRING) USING persistshard LOCATION '/data/t', CREATE "
          + "TABLE t USING persistshard LOCATION '/data/t' (an existing shard), CREATE TABLE t "
          + "USING persistshard LOCATION '/data/t' AS SELECT ..., or "
          + "df.write.format('persistshard').option('path', '/data/t').saveAsTable('t')");
    }
    if (partitions.length > 0) {
      throw new IllegalArgumentException("InvalidOption: table " + qualified(ident) + " at "
          + location + ": persistshard tables take no PARTITIONED BY or CLUSTERED BY (a "
          + "shard orders its rows by time itself); nothing was created");
    }
    // The catalog stores OPTIONS as given and shows them (SHOW CREATE TABLE, DESCRIBE): the
    // Python source refuses a secret among them (a consensus password, storage options)
    // before anything is stored, whether or not the statement declares its columns.
    ObjectNode check = JSON.createObjectNode();
    check.put("kind", "table_options");
    ObjectNode given = check.putObject("options");
    options.forEach(given::put);
    PlanServer.plan(Planner.python(), check);
    Map<String, String> stored = new HashMap<>(properties);
    stored.put(TableCatalog.PROP_LOCATION, location);
    return stored;
  }

  // --- CTAS and REPLACE (StagingTableCatalog) --------------------------------------------

  @Override
  @SuppressWarnings("deprecation") // the TableInfo variant (Spark's default) calls it
  public StagedTable stageCreate(Identifier ident, Column[] columns, Transform[] partitions,
      Map<String, String> properties)
      throws TableAlreadyExistsException, NoSuchNamespaceException {
    if (!ours(properties)) {
      return unstagedCreate(ident, columns, partitions, properties);
    }
    if (tableExists(ident)) {
      throw new TableAlreadyExistsException(ident);
    }
    return staged(ident, StagedCompanionTable.Kind.CREATE, columns, partitions, properties);
  }

  @Override
  @SuppressWarnings("deprecation") // the TableInfo variant (Spark's default) calls it
  public StagedTable stageReplace(Identifier ident, Column[] columns, Transform[] partitions,
      Map<String, String> properties) throws NoSuchNamespaceException, NoSuchTableException {
    Table old = super.loadTable(ident);
    if (!ours(properties)) {
      return unstagedReplace(ident, columns, partitions, properties);
    }
    return staged(ident, StagedCompanionTable.Kind.REPLACE, columns, partitions,
        locatedAsBefore(old, properties));
  }

  @Override
  @SuppressWarnings("deprecation") // the TableInfo variant (Spark's default) calls it
  public StagedTable stageCreateOrReplace(Identifier ident, Column[] columns,
      Transform[] partitions, Map<String, String> properties) throws NoSuchNamespaceException {
    Table old;
    try {
      old = super.loadTable(ident);
    } catch (NoSuchTableException e) {
      old = null;
    }
    if (!ours(properties)) {
      return unstagedReplace(ident, columns, partitions, properties);
    }
    return staged(ident, StagedCompanionTable.Kind.CREATE_OR_REPLACE, columns, partitions,
        old == null ? properties : locatedAsBefore(old, properties));
  }

  private StagedTable staged(Identifier ident, StagedCompanionTable.Kind kind,
      Column[] columns, Transform[] partitions, Map<String, String> properties) {
    Map<String, String> stored = checked(ident, partitions, properties);
    Column[] kept = withoutScanMetadata(columns);
    StructType schema = CatalogV2Util.v2ColumnsToStructType(kept);
    return new StagedCompanionTable(this, ident, kind, kept, partitions, stored,
        companionTable(ident, schema, stored, Map.of()));
  }

  /**
   * {@code properties} of a REPLACE of {@code old}: with {@code old}'s location when the
   * statement names none and {@code old} is a persistshard table with one (a replace
   * replaces the contents of the table's shard, as {@code INSERT OVERWRITE} does).
   */
  private static Map<String, String> locatedAsBefore(Table old, Map<String, String> properties) {
    if (options(properties).get("path") != null || !ours(old.properties())) {
      return properties;
    }
    String location = options(old.properties()).get("path");
    if (location == null) {
      return properties;
    }
    Map<String, String> located = new HashMap<>(properties);
    located.put(TableCatalog.PROP_LOCATION, location);
    return located;
  }

  /**
   * Spark's own replace for a table of another provider, which this catalog cannot stage
   * (the built-in catalog stages nothing): the old table dropped, the new one created now,
   * and dropped again if the write fails.
   */
  private StagedTable unstagedReplace(Identifier ident, Column[] columns,
      Transform[] partitions, Map<String, String> properties) throws NoSuchNamespaceException {
    super.dropTable(ident);
    try {
      return unstagedCreate(ident, columns, partitions, properties);
    } catch (TableAlreadyExistsException e) {
      throw new IllegalStateException("table " + qualified(ident) + " was created by another "
          + "statement while this one replaced it", e);
    }
  }

  /** Spark's own CTAS for a table of another provider: created now, dropped on abort. */
  private StagedTable unstagedCreate(Identifier ident, Column[] columns,
      Transform[] partitions, Map<String, String> properties)
      throws TableAlreadyExistsException, NoSuchNamespaceException {
    Table created = super.createTable(ident, columns, partitions, properties);
    if (created == null) { // the built-in catalog may return none: the stored table, then
      try {
        created = loadTable(ident, Set.of(TableWritePrivilege.INSERT));
      } catch (NoSuchTableException e) {
        throw new IllegalStateException("table " + qualified(ident) + " vanished while "
            + "created", e);
      }
    }
    return Unstaged.created(this, ident, created);
  }

  /** The built-in catalog's CREATE: a staged table's entry, stored at its commit. */
  void createEntry(Identifier ident, Column[] columns, Transform[] partitions,
      Map<String, String> properties)
      throws TableAlreadyExistsException, NoSuchNamespaceException {
    super.createTable(ident, columns, partitions, properties);
  }

  /** The built-in catalog's DROP TABLE (a table with a location keeps its data). */
  boolean dropEntry(Identifier ident) {
    return super.dropTable(ident);
  }

  /** The built-in catalog's entry for {@code ident}, as stored. */
  Table entry(Identifier ident) throws NoSuchTableException {
    return super.loadTable(ident);
  }

  /** {@code columns} without persistshard scan metadata (`withoutScanMetadata`). */
  static Column[] withoutScanMetadata(Column[] columns) {
    Column[] kept = new Column[columns.length];
    for (int i = 0; i < columns.length; i++) {
      kept[i] = withoutScanMetadata(columns[i]);
    }
    return kept;
  }

  /**
   * {@code column} without the metadata a persistshard scan put on it (another table's
   * location): a CTAS or a column list copied from such a scan must not store it.
   */
  static Column withoutScanMetadata(Column column) {
    String json = column.metadataInJSON();
    if (json == null || !json.contains("persistshard.")) {
      return column;
    }
    JsonNode parsed;
    try {
      parsed = JSON.readTree(json);
    } catch (IOException e) {
      return column;
    }
    if (!(parsed instanceof ObjectNode)) {
      return column;
    }
    ObjectNode meta = (ObjectNode) parsed;
    boolean scanned = meta.has(PERSISTSHARD_KEYS[0]);
    for (String key : PERSISTSHARD_KEYS) {
      meta.remove(key);
    }
    if (scanned) {
      meta.remove(RAW_TYPE_KEY);
    }
    Iterator<String> left = meta.fieldNames();
    return Column.builderFrom(column).metadata(left.hasNext() ? meta.toString() : null).build();
  }
}
