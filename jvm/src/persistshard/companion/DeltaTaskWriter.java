package persistshard.companion;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.io.OutputStream;
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
 * batches to a {@code bridge write} process, which writes the task's parts with Python's
 * write protocol and answers with the task's commit message.
 *
 * <p>Invariants: the process starts with the task's first row (a task without rows starts
 * none and reports no parts); {@link #commit} returns only after Python ended well (else
 * {@link PythonFailure} with Python's error); {@link #abort} and {@link #close} end a process
 * still running; whatever it wrote carries the write id and is swept by the driver.
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
  private PythonProcess process;
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
    process = new PythonProcess(python, "write");
    OutputStream in = process.stdin();
    ObjectNode header = JSON.createObjectNode();
    header.put("writer", writer);
    header.set("schema", JSON.readTree(writeSchemaJson));
    in.write((header.toString() + "\n").getBytes(StandardCharsets.UTF_8));
    StructType schema = (StructType) DataType.fromJson(writeSchemaJson);
    arrow = ArrowWriter.create(schema, "UTC", true, false);
    stream = new ArrowStreamWriter(arrow.root(), null, Channels.newChannel(in));
    stream.start();
  }

  private void add(InternalRow row, InternalRow diff) throws IOException {
    if (process == null) {
      start();
    }
    arrow.write(joined.apply(row, diff));
    if (++pending >= BATCH_ROWS) {
      try {
        flush();
      } catch (IOException e) {
        process.finish(); // Python stopped reading: its error explains why
        throw e;
      }
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
    if (process == null) {
      return new Message(null);
    }
    String answer;
    try {
      flush();
      stream.end();
      process.stdin().close();
      answer = new String(process.stdout().readAllBytes(), StandardCharsets.UTF_8);
    } catch (IOException e) {
      process.finish(); // a failed write explains itself first
      throw e;
    }
    process.finish();
    JsonNode parsed = JSON.readTree(answer);
    return new Message(parsed.get("message").textValue());
  }

  @Override
  public void abort() {
    if (process != null) {
      process.close();
    }
  }

  @Override
  public void close() {
    try {
      if (process != null) {
        process.close();
      }
    } finally {
      if (arrow != null) {
        arrow.root().close();
      }
    }
  }
}
