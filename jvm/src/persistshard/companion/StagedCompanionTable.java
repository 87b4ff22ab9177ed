package persistshard.companion;

import java.util.Map;
import org.apache.spark.sql.catalyst.analysis.NoSuchNamespaceException;
import org.apache.spark.sql.catalyst.analysis.NoSuchTableException;
import org.apache.spark.sql.catalyst.analysis.TableAlreadyExistsException;
import org.apache.spark.sql.connector.catalog.Column;
import org.apache.spark.sql.connector.catalog.Identifier;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.metric.CustomMetric;
import org.apache.spark.sql.connector.metric.CustomTaskMetric;
import org.apache.spark.sql.connector.write.BatchWrite;
import org.apache.spark.sql.connector.write.DataWriterFactory;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.PhysicalWriteInfo;
import org.apache.spark.sql.connector.write.SupportsTruncate;
import org.apache.spark.sql.connector.write.Write;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.connector.write.WriteSummary;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A persistshard table's CTAS, REPLACE or CREATE OR REPLACE, staged by {@link
 * CompanionCatalog} (a {@code StagingTableCatalog}): nothing is stored in the catalog or
 * committed to a shard until {@link #commitStagedChanges}.
 *
 * <p>Spark writes the query into this table (an append for CTAS, an overwrite for the
 * replacing forms) through the Python source's write, whose tasks write parts under the
 * write's id; the write's commit, the one compare-and-append on the table's shard (for an
 * overwrite: the retractions of the old contents and the new rows, at one new time), is held
 * back ({@link HeldCommit}) until {@link #commitStagedChanges}, which then:
 * <ol>
 *   <li>checks the catalog: for CTAS that no table took the name meanwhile, for REPLACE that
 *       the table is still there (otherwise it fails, nothing written);</li>
 *   <li>runs the held commit (a refused one, {@code UpperMismatch} after a racing writer,
 *       sweeps the write's parts and changes nothing);</li>
 *   <li>stores the entry: the new columns, location, OPTIONS and properties (a replaced
 *       entry is dropped and stored anew; a table with a location keeps its data).</li>
 * </ol>
 * Invariants: a failed query (its tasks, the Python source's checks of the columns, the
 * catalog's checks) leaves the catalog and the shard exactly as they were, nothing of the
 * write left behind ({@link #abortStagedChanges}: the Python source's abort sweeps the
 * write's parts); a commit that may have landed is never aborted. The one gap is step 3
 * failing after step 2 landed (the built-in catalog refusing to store an entry it just
 * dropped): the shard then holds the new contents, the old entry is stored again if it can
 * be, and the error says so.
 */
final class StagedCompanionTable extends ForwardingStagedTable {
  private static final Logger LOG = LoggerFactory.getLogger(StagedCompanionTable.class);

  /** Which statement staged the table. */
  enum Kind { CREATE, REPLACE, CREATE_OR_REPLACE }

  private final CompanionCatalog catalog;
  private final Identifier ident;
  private final Kind kind;
  private final Column[] columns;
  private final Transform[] partitions;
  private final Map<String, String> stored;
  /** The new table as writes see it (also {@link #table}): location, OPTIONS, columns. */
  private final CompanionTable target;
  /** The write Spark ran into this table, its commit held back; null before it ran. */
  private HeldCommit held;

  StagedCompanionTable(CompanionCatalog catalog, Identifier ident, Kind kind, Column[] columns,
      Transform[] partitions, Map<String, String> stored, CompanionTable target) {
    super(target);
    this.catalog = catalog;
    this.ident = ident;
    this.kind = kind;
    this.columns = columns.clone();
    this.partitions = partitions.clone();
    this.stored = Map.copyOf(stored);
    this.target = target;
  }

  @Override
  public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
    return new HeldWriteBuilder(target.newWriteBuilder(info));
  }

  @Override
  public void commitStagedChanges() {
    String table = catalog.qualified(ident);
    boolean exists = catalog.tableExists(ident);
    if (kind == Kind.CREATE && exists) {
      throw new IllegalStateException("TableAlreadyExists: table " + table + " was created "
          + "by another statement while this CREATE TABLE ... AS SELECT ran; nothing was "
          + "written to its location " + stored.get("location"));
    }
    if (kind == Kind.REPLACE && !exists) {
      throw new IllegalStateException("NoSuchTable: table " + table + " was dropped while "
          + "this REPLACE TABLE ... AS SELECT ran; nothing was written");
    }
    HeldCommit write = held;
    if (write != null) {
      write.release();
    }
    Table old = null;
    if (exists) {
      try {
        old = catalog.entry(ident);
      } catch (NoSuchTableException e) {
        old = null; // dropped meanwhile: the new entry is stored all the same
      }
      if (old != null) {
        catalog.dropEntry(ident);
      }
    }
    try {
      catalog.createEntry(ident, columns, partitions, stored);
    } catch (TableAlreadyExistsException | NoSuchNamespaceException | RuntimeException e) {
      String restored = old == null ? "" : restore(old);
      throw new IllegalStateException("table " + table + ": its shard at "
          + stored.get("location") + " holds the statement's rows"
          + (write == null ? " (none written)" : "") + ", but the catalog did not store "
          + "the new entry (" + e.getMessage() + ")" + restored, e);
    }
  }

  /** Stores {@code old} again after the new entry was refused; what happened, for the error. */
  private String restore(Table old) {
    try {
      catalog.createEntry(ident, old.columns(), old.partitioning(), old.properties());
      return "; the old entry is back";
    } catch (TableAlreadyExistsException | NoSuchNamespaceException | RuntimeException e) {
      LOG.error("table {}: the old catalog entry could not be stored again", ident, e);
      return "; the old entry could not be stored again either (" + e.getMessage() + ")";
    }
  }

  @Override
  public void abortStagedChanges() {
    HeldCommit write = held;
    if (write != null) {
      write.abandon();
    }
  }

  /** The Python source's write builder, whose writes' commits are held back. */
  private final class HeldWriteBuilder implements WriteBuilder, SupportsTruncate {
    private WriteBuilder python;

    HeldWriteBuilder(WriteBuilder python) {
      this.python = python;
    }

    @Override
    public WriteBuilder truncate() {
      python = ((SupportsTruncate) python).truncate();
      return this;
    }

    @Override
    public Write build() {
      Write write = python.build();
      return new Write() {
        @Override
        public CustomMetric[] supportedCustomMetrics() {
          return write.supportedCustomMetrics();
        }

        @Override
        public BatchWrite toBatch() {
          HeldCommit batch = new HeldCommit(write.toBatch());
          held = batch;
          return batch;
        }

        @Override
        public CustomTaskMetric[] reportDriverMetrics() {
          return write.reportDriverMetrics();
        }

        // What Spark shows of the write (its plan, the UI): the Python write's, held.
        @Override
        public String description() {
          return "held commit of " + write.description();
        }
      };
    }
  }

  /**
   * The Python source's batch write with its commit held back: Spark's {@code commit} only
   * keeps the tasks' messages; {@link #release} commits them, {@link #abandon} aborts them
   * (sweeping the write's parts) unless a commit was tried (it may have landed).
   */
  private static final class HeldCommit implements BatchWrite {
    private final BatchWrite python;
    private WriterCommitMessage[] messages;
    private WriteSummary summary;
    private boolean tried;

    HeldCommit(BatchWrite python) {
      this.python = python;
    }

    @Override
    public DataWriterFactory createBatchWriterFactory(PhysicalWriteInfo info) {
      return python.createBatchWriterFactory(info);
    }

    @Override
    public boolean useCommitCoordinator() {
      return python.useCommitCoordinator();
    }

    @Override
    public void onDataWriterCommit(WriterCommitMessage message) {
      python.onDataWriterCommit(message);
    }

    @Override
    public void commit(WriterCommitMessage[] messages) {
      this.messages = messages.clone();
    }

    @Override
    public void commit(WriterCommitMessage[] messages, WriteSummary summary) {
      this.messages = messages.clone();
      this.summary = summary;
    }

    @Override
    public void abort(WriterCommitMessage[] messages) {
      python.abort(messages);
    }

    /** The held commit, now (nothing when Spark never committed the write). */
    synchronized void release() {
      if (messages == null || tried) {
        return;
      }
      tried = true;
      if (summary != null) {
        python.commit(messages, summary);
      } else {
        python.commit(messages);
      }
    }

    /** The write's parts swept, unless its commit was tried. */
    synchronized void abandon() {
      if (messages == null || tried) {
        return;
      }
      tried = true;
      python.abort(messages);
    }
  }
}
