package persistshard.companion;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.Map;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.errors.QueryCompilationErrors;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * The JVM table provider of the format {@code persistshard} (docs/design.md, "JVM companion").
 *
 * <p>Spark looks a short name up among JVM registrations first and asks its Python registry
 * only when none matches: with the companion jar on the classpath, {@code format("persistshard")}
 * resolves here, without it to the Python source. So this provider must serve every path:
 * <ul>
 *   <li>the schema is the Python source's ({@link #inferSchema} asks the driver's long-lived
 *       bridge, {@link PlanServer}, for its {@code schema()}: no Spark Python worker per
 *       query);</li>
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

  private static final ObjectMapper JSON = new ObjectMapper();

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

  /**
   * The Python source's {@code schema()} for {@code options}, asked of the bridge ({@code
   * kind} {@code schema}): the same method Spark's Python data source would run in a Python
   * worker, with the same options (keys lower-cased, as Spark hands them), read fresh for each
   * call, so a query sees the shard's columns as of its analysis. A failure is what Spark
   * raises when its Python worker fails there: an {@code AnalysisException} of condition
   * {@code PYTHON_DATA_SOURCE_ERROR}, its message Python's text (which names the persistshard
   * class, e.g. {@code NoShard: ...}).
   */
  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    return pythonSchema(options.asCaseSensitiveMap());
  }

  /**
   * The Python source's {@code schema()} for {@code options}, as {@link #inferSchema} asks it;
   * also what the session catalog stores for a {@code CREATE TABLE} without a column list.
   */
  static StructType pythonSchema(Map<String, String> options) {
    ObjectNode req = JSON.createObjectNode();
    req.put("kind", "schema");
    ObjectNode opts = req.putObject("options");
    options.forEach(opts::put);
    JsonNode answer;
    try {
      answer = PlanServer.plan(PythonProcess.python(), req);
    } catch (PythonFailure e) {
      // Spark's own error for a Python data source that failed to be made (its cause slot
      // is taken); Python's text is the message, on a line of its own as in the traceback
      // Spark's worker path reports (Spark appends the SQLSTATE after it).
      throw CompanionProvider.<RuntimeException>raise(QueryCompilationErrors
          .pythonDataSourceError("create", "instance", e.getMessage() + "\n"));
    }
    return (StructType) DataType.fromJson(answer.get("schema").textValue());
  }

  /**
   * Throws {@code t} as it is: Spark's {@code AnalysisException} is a checked exception to
   * Java, which Scala code (as Spark's own worker path) throws undeclared.
   */
  @SuppressWarnings("unchecked")
  private static <E extends Throwable> E raise(Throwable t) throws E {
    throw (E) t;
  }

  /**
   * How many requests of {@code kind} ({@code schema}, {@code plan}, ...) this JVM sent to
   * the driver's bridge so far: a query's round trips to Python, for tests and benchmarks.
   */
  public static long plannerRequests(String kind) {
    return PlanServer.requests(kind);
  }

  /** The wall time (ns) this JVM spent waiting for the bridge's answers of {@code kind}. */
  public static long plannerWaitedNanos(String kind) {
    return PlanServer.waitedNanos(kind);
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
