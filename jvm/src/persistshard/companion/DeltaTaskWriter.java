package persistshard.companion;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.nio.channels.Channels;
import java.nio.charset.StandardCharsets;
import org.apache.arrow.vector.ipc.ArrowStreamWriter;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.JoinedRow;
import org.apache.spark.sql.connector.write.DeltaWriter;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.execution.arrow.ArrowWriter;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;

/**
 * One task of a {@link DeltaOperation}'s write: each deleted row (its row id) as the row with
 * diff {@code -1}, each inserted row with {@code +1}, an update as both, streamed as Arrow
 * batches in the body of one request to a {@code bridge writes} worker ({@link
 * BridgeWorker}, from the JVM's pool), which writes the task's parts with Python's write
 * protocol and answers with the task's commit message.
 *
 * <p>Invariants: the worker is borrowed with the task's first row (a task without rows uses
 * none and reports no parts); {@link #commit} returns only after Python's write ended well
 * (else {@link PythonFailure} with Python's error text, class name first), and gives the
 * worker back only when its answer was read to the end ({@code E} or {@code X}); {@link
 * #abort} and {@link #close} end a worker still held (its request unfinished: never reused);
 * whatever it wrote carries the write id and is swept by the driver.
 */
final class DeltaTaskWriter implements DeltaWriter<InternalRow> {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final int BATCH_ROWS = 8192;
  private static final InternalRow RETRACT = new GenericInternalRow(new Object[] {-1L});
  private static final InternalRow INSERT = new GenericInternalRow(new Object[] {1L});

  /** A task's commit message: Python's pickled one (base64), or null for no rows. */
  static final class Message implements WriterCommitMessage {
    private static final long serialVersionUID = 1L;
    final String message;

    Message(String message) {
      this.message = message;
    }
  }

  private final String python;
  private final String writer;
  private final String writeSchemaJson;
  private final int columns;
  private final JoinedRow joined = new JoinedRow();
  private BridgeWorker worker;
  private BridgeWorker.Body body;
  private ArrowWriter arrow;
  private ArrowStreamWriter stream;
  private int pending;

  DeltaTaskWriter(String python, String writer, String writeSchemaJson, int columns) {
    this.python = python;
    this.writer = writer;
    this.writeSchemaJson = writeSchemaJson;
    this.columns = columns;
  }

  private void start() throws IOException {
    ObjectNode header = JSON.createObjectNode();
    header.put("writer", writer);
    header.set("schema", JSON.readTree(writeSchemaJson));
    worker = BridgeWorker.borrow("writes", python);
    body = worker.requestWithBody(header.toString().getBytes(StandardCharsets.UTF_8));
    StructType schema = (StructType) DataType.fromJson(writeSchemaJson);
    arrow = ArrowWriter.create(schema, "UTC", true, false);
    stream = new ArrowStreamWriter(arrow.root(), null, Channels.newChannel(body));
    stream.start();
  }

  private void add(InternalRow row, InternalRow diff) throws IOException {
    if (worker == null) {
      start();
    }
    arrow.write(joined.apply(row, diff));
    if (++pending >= BATCH_ROWS) {
      flush();
    }
  }

  private void flush() throws IOException {
    if (pending > 0) {
      arrow.finish();
      stream.writeBatch();
      arrow.reset();
      pending = 0;
    }
  }

  @Override
  public void delete(InternalRow metadata, InternalRow id) throws IOException {
    add(id.getStruct(0, columns), RETRACT);
  }

  @Override
  public void update(InternalRow metadata, InternalRow id, InternalRow row) throws IOException {
    add(id.getStruct(0, columns), RETRACT);
    add(row, INSERT);
  }

  @Override
  public void reinsert(InternalRow metadata, InternalRow row) throws IOException {
    add(row, INSERT);
  }

  @Override
  public void insert(InternalRow row) throws IOException {
    add(row, INSERT);
  }

  @Override
  public WriterCommitMessage commit() throws IOException {
    if (worker == null) {
      return new Message(null);
    }
    flush();
    stream.end();
    BridgeWorker.Answer answer = body.answer();
    byte[] answered;
    try {
      answered = answer.readAllBytes(); // an X frame: PythonFailure with Python's error
    } finally {
      if (answer.complete()) {
        worker.release();
        worker = null;
      }
    }
    JsonNode parsed = JSON.readTree(answered);
    return new Message(parsed.get("message").textValue());
  }

  @Override
  public void abort() {
    endWorker();
  }

  /** Ends a worker still held: its request was not answered to the end. */
  private void endWorker() {
    if (worker != null) {
      worker.end();
      worker = null;
    }
  }

  @Override
  public void close() {
    try {
      endWorker();
    } finally {
      if (arrow != null) {
        arrow.root().close();
      }
    }
  }
}
