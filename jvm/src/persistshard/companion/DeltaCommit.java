package persistshard.companion;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.write.DeltaBatchWrite;
import org.apache.spark.sql.connector.write.DeltaWrite;
import org.apache.spark.sql.connector.write.DeltaWriter;
import org.apache.spark.sql.connector.write.DeltaWriterFactory;
import org.apache.spark.sql.connector.write.PhysicalWriteInfo;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

/**
 * The write of a {@link DeltaOperation}: tasks hand their rows with diffs to Python ({@link
 * DeltaTaskWriter}), and the driver's commit asks Python ({@code bridge serve}, {@code
 * delta_commit}) to append every task's parts in one compare-and-append at the operation's
 * time; an abort asks it to sweep them ({@code delta_abort}).
 *
 * <p>Invariants: the pickled Python writer minted when the operation was built is the only
 * state; every task writes under its write id, so the commit (or the abort, or a refused
 * commit) accounts for every part any attempt wrote.
 */
final class DeltaCommit implements DeltaWrite, DeltaBatchWrite {
  private static final ObjectMapper JSON = new ObjectMapper();

  private final String python;
  private final String writer;
  private final StructType schema;
  private final long lower;

  DeltaCommit(String python, String writer, StructType schema, long lower) {
    this.python = python;
    this.writer = writer;
    this.schema = schema;
    this.lower = lower;
  }

  /** What tasks send Python: the table's columns, then {@code _diff}. */
  static StructType writeSchema(StructType schema) {
    return DeltaOperation.rowIdType(schema).add("_diff", DataTypes.LongType, false);
  }

  @Override
  public String description() {
    return "persistshard retractions and insertions at " + lower;
  }

  @Override
  public DeltaBatchWrite toBatch() {
    return this;
  }

  @Override
  public DeltaWriterFactory createBatchWriterFactory(PhysicalWriteInfo info) {
    return new Factory(python, writer, writeSchema(schema).json(), schema.size());
  }

  private void ask(String kind, WriterCommitMessage[] messages) {
    ObjectNode req = JSON.createObjectNode();
    req.put("kind", kind);
    req.put("writer", writer);
    ArrayNode out = req.putArray("messages");
    for (WriterCommitMessage m : messages) {
      String text = m == null ? null : ((DeltaTaskWriter.Message) m).message;
      if (text == null) {
        out.addNull();
      } else {
        out.add(text);
      }
    }
    PlanServer.plan(python, req);
  }

  @Override
  public void commit(WriterCommitMessage[] messages) {
    ask("delta_commit", messages);
  }

  @Override
  public void abort(WriterCommitMessage[] messages) {
    ask("delta_abort", messages);
  }

  /** Makes each task's {@link DeltaTaskWriter}. */
  static final class Factory implements DeltaWriterFactory {
    private static final long serialVersionUID = 1L;
    private final String python;
    private final String writer;
    private final String writeSchemaJson;
    private final int columns;

    Factory(String python, String writer, String writeSchemaJson, int columns) {
      this.python = python;
      this.writer = writer;
      this.writeSchemaJson = writeSchemaJson;
      this.columns = columns;
    }

    @Override
    public DeltaWriter<InternalRow> createWriter(int partitionId, long taskId) {
      return new DeltaTaskWriter(python, writer, writeSchemaJson, columns);
    }
  }
}
