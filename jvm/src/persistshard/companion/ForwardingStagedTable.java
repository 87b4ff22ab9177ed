package persistshard.companion;

import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.connector.catalog.Column;
import org.apache.spark.sql.connector.catalog.StagedTable;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.types.StructType;

/**
 * A staged table ({@link CompanionCatalog}'s CTAS and REPLACE) that is, to Spark's planner,
 * the table it will be: name, columns, partitioning, properties and capabilities are {@link
 * #table}'s. Subclasses say how it is written, committed and aborted.
 */
abstract class ForwardingStagedTable implements StagedTable, SupportsWrite {
  /** The table as it will be (or, for another provider, as it already is). */
  protected final Table table;

  ForwardingStagedTable(Table table) {
    this.table = table;
  }

  @Override
  public String name() {
    return table.name();
  }

  @Override
  @SuppressWarnings("deprecation") // Table.schema(): the planner still asks for it
  public StructType schema() {
    return table.schema();
  }

  @Override
  public Column[] columns() {
    return table.columns();
  }

  @Override
  public Transform[] partitioning() {
    return table.partitioning();
  }

  @Override
  public Map<String, String> properties() {
    return table.properties();
  }

  @Override
  public Set<TableCapability> capabilities() {
    return table.capabilities();
  }
}
