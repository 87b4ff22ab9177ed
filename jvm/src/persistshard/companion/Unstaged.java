package persistshard.companion;

import org.apache.spark.sql.connector.catalog.Identifier;
import org.apache.spark.sql.connector.catalog.StagedTable;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;

/**
 * A table of another provider that {@link CompanionCatalog} "stages" as Spark does for a
 * catalog that stages nothing: the table is already created (and, for a replace, the old one
 * dropped); committing changes nothing; aborting drops the new table. Writes are the table's.
 */
final class Unstaged extends ForwardingStagedTable {
  private final CompanionCatalog catalog;
  private final Identifier ident;

  private Unstaged(CompanionCatalog catalog, Identifier ident, Table table) {
    super(table);
    this.catalog = catalog;
    this.ident = ident;
  }

  /** {@code table}, just created as {@code ident}, as Spark's CTAS or REPLACE writes it. */
  static StagedTable created(CompanionCatalog catalog, Identifier ident, Table table) {
    return new Unstaged(catalog, ident, table);
  }

  @Override
  public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
    if (!(table instanceof SupportsWrite)) {
      throw new UnsupportedOperationException("table " + catalog.qualified(ident)
          + " (" + table.getClass().getName() + ") takes no writes");
    }
    return ((SupportsWrite) table).newWriteBuilder(info);
  }

  @Override
  public void commitStagedChanges() {
    // created already
  }

  @Override
  public void abortStagedChanges() {
    catalog.dropEntry(ident);
  }
}
