package persistshard.companion;

import java.util.Map;

import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The JVM companion of the Python data source {@code persistshard} (prototype).
 *
 * <p>Registered with the JVM under the same short name as the Python source. Spark's lookup
 * tries JVM registrations first and consults its Python registry only when none matches, so
 * with this jar on the classpath {@code format("persistshard")} and {@code USING persistshard}
 * resolve here, and without it they resolve to the Python source directly (the fallback).
 *
 * <p>What it changes, nothing else:
 * <ul>
 *   <li>{@link #getTable} keeps the table's properties (a catalog table's OPTIONS and its
 *       location as {@code path}); {@link CompanionTable} puts them under every scan's and
 *       every write's options, statement options winning. Spark's own provider drops them.</li>
 *   <li>Every scan builder and write builder gets its own {@link PythonDataSourceV2}, so the
 *       Python data source instance and the read function that a filter pushdown leaves on it
 *       belong to one scan and cannot be replayed by another scan of the same relation.</li>
 * </ul>
 *
 * <p>It relies on Spark 4.x classes that are public in bytecode but not a stable API
 * ({@code PythonDataSourceV2}, {@code PythonTable}, {@code PythonScanBuilder},
 * {@code PythonWriteBuilder}). {@link #COMPATIBLE} checks their constructors once, by
 * reflection; if one is missing (another Spark release), {@link #getTable} returns Spark's own
 * Python table, exactly what the format resolves to without this jar, and logs a warning.
 */
public final class CompanionProvider implements TableProvider, DataSourceRegister {

  /** The short name the Python source registers itself under (DefaultSource.name()). */
  public static final String PYTHON_NAME = "persistshard";

  /**
   * The option every scan and write made here carries, so Python can tell it is wrapped. Keys
   * starting with {@code __} pass the Python side's unknown-option check.
   */
  public static final String MARKER_KEY = "__persistshard_companion";

  /** The companion's protocol version, the value of {@link #MARKER_KEY}. */
  public static final String MARKER_VALUE = "1";

  private static final Logger LOG = LoggerFactory.getLogger(CompanionProvider.class);

  private static final String PY = "org.apache.spark.sql.execution.datasources.v2.python.";

  /** Whether this Spark has the constructors {@link CompanionTable} calls (checked once). */
  static final boolean COMPATIBLE = probe();

  private static boolean probe() {
    try {
      Class<?> ds = Class.forName(PY + "PythonDataSourceV2");
      ds.getMethod("setShortName", String.class);
      Class.forName(PY + "PythonTable").getConstructor(ds, String.class, StructType.class);
      Class.forName(PY + "PythonScanBuilder")
          .getConstructor(ds, String.class, StructType.class, CaseInsensitiveStringMap.class);
      Class.forName(PY + "PythonWriteBuilder")
          .getConstructor(
              ds, String.class, org.apache.spark.sql.connector.write.LogicalWriteInfo.class);
      return true;
    } catch (ReflectiveOperationException | LinkageError e) {
      LOG.warn(
          "persistshard companion: this Spark lacks {} ({}); the format runs as the plain Python"
              + " source (table OPTIONS do not reach reads and writes; pushdown state is per"
              + " relation). Remove the companion jar or use a Spark it was built for.",
          e.getMessage(),
          e.getClass().getSimpleName());
      return false;
    }
  }

  /** Only for inferSchema: it memoizes the Python instance made from the given options. */
  private final PythonDataSourceV2 inference = fresh();

  /** A Python source provider that has made nothing yet: no instance, no read info. */
  static PythonDataSourceV2 fresh() {
    PythonDataSourceV2 ds = new PythonDataSourceV2();
    ds.setShortName(PYTHON_NAME);
    return ds;
  }

  @Override
  public String shortName() {
    return PYTHON_NAME;
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    return inference.inferSchema(options);
  }

  @Override
  public boolean supportsExternalMetadata() {
    return true;
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
    if (!COMPATIBLE) {
      return inference.getTable(schema, partitioning, properties);
    }
    return new CompanionTable(schema, properties);
  }
}
