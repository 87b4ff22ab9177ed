package persistshard.companion;

import java.util.Map;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * The JVM table provider of the format {@code persistshard} (docs/design.md, "JVM companion").
 *
 * <p>Spark looks a short name up among JVM registrations first and asks its Python registry
 * only when none matches: with the companion jar on the classpath, {@code format("persistshard")}
 * resolves here, without it to the Python source. So this provider must serve every path:
 * <ul>
 *   <li>the schema is the Python source's ({@link #inferSchema} asks it);</li>
 *   <li>writes (batch and streaming) and streaming reads are the Python source's own builders,
 *       one fresh Python source per builder ({@link CompanionTable});</li>
 *   <li>batch snapshot reads are {@link ColumnarScanBuilder}: planned by the Python source's
 *       planner ({@link Planner}), parts decoded here into Arrow vectors;</li>
 *   <li>every other batch read (changes, {@code with_diff}, {@code where}, tables whose
 *       columns carry a location in their metadata) is the Python source's scan.</li>
 * </ul>
 * SQL tables reach it through {@link CompanionCatalog}, which hands Spark a {@link
 * CompanionTable} with the table's location and options.
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
  public static final String MARKER_VALUE = "2";

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
    return new CompanionTable(schema, properties);
  }
}
