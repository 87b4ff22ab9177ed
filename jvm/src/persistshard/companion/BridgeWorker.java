package persistshard.companion;

import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.util.ArrayDeque;
import java.util.HashMap;
import java.util.Map;

/**
 * A long-lived {@code python -m persistshard.datasource.bridge reads} or {@code writes}: it
 * reads partitions for {@link PythonReader} ({@code reads}) or writes the tasks of row-level
 * operations for {@link DeltaTaskWriter} ({@code writes}), one request at a time, kept in a
 * pool per command and interpreter in each JVM: a partition read by Python, or a task's
 * write, starts no interpreter (which costs more, in CPU, than reading or writing a small
 * partition: Python, pyarrow and persistshard imported again).
 *
 * <p>Protocol (the bridge's module docstring): a request is a 4-byte big-endian length and
 * that many bytes of JSON; a {@code writes} request goes on with its body ({@link
 * #requestWithBody}: {@code D} frames of a tag byte and a 4-byte length carrying the Arrow IPC
 * stream of the task's rows, then one {@code E} frame). The answer is frames as well: {@code
 * D} frames carry the Arrow IPC stream (or the task's commit message), then exactly one
 * {@code E} (ended well) or {@code X} (JSON string: the error's text, class name first) frame.
 *
 * <p>Invariants: a worker serves one request at a time, from {@link #borrow} until {@link
 * #release} or {@link #end}; it goes back to the pool only when its answer was read to its
 * last frame (an answer abandoned before that, say by a {@code LIMIT}, leaves frames in the
 * pipe; a request abandoned before its body's end, say a task Spark aborted, leaves Python
 * waiting for the rest: that worker is ended, never reused), and at most {@link #MAX_IDLE}
 * wait there per command and interpreter (more are ended). A worker that died or broke the
 * protocol is ended and its stderr's end is in the error. Workers end with the JVM: their
 * stdin closes and the bridge returns.
 */
final class BridgeWorker {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final Map<String, ArrayDeque<BridgeWorker>> IDLE = new HashMap<>();
  /** Idle workers kept per command and interpreter: about as many as tasks run at once. */
  static final int MAX_IDLE = Math.max(2, Runtime.getRuntime().availableProcessors());
  private static final int STDERR_LINES = 40;
  /** The largest {@code D} frame of a request's body. */
  private static final int FRAME_BYTES = 1 << 20;
  private static final int DATA = 'D';
  private static final int END = 'E';
  private static final int FAILED = 'X';

  private final String pool;
  private final String command;
  private final Process process;
  private final DataOutputStream requests;
  private final DataInputStream answers;
  private final StderrTail stderr;

  private BridgeWorker(String command, String python) {
    this.pool = key(command, python);
    this.command = command;
    process = PythonProcess.start(python, command, command);
    requests = new DataOutputStream(new BufferedOutputStream(process.getOutputStream(), 1 << 16));
    answers = new DataInputStream(new BufferedInputStream(process.getInputStream(), 1 << 16));
    stderr = new StderrTail(process, STDERR_LINES, "persistshard-" + command + "-stderr");
  }

  private static String key(String command, String python) {
    return command + " " + python;
  }

  /** An idle {@code command} worker of {@code python} from the pool, else a new one. */
  static BridgeWorker borrow(String command, String python) {
    synchronized (IDLE) {
      ArrayDeque<BridgeWorker> idle = IDLE.get(key(command, python));
      while (idle != null && !idle.isEmpty()) {
        BridgeWorker worker = idle.pollLast();
        if (worker.process.isAlive()) {
          return worker;
        }
        worker.end();
      }
    }
    return new BridgeWorker(command, python);
  }

  /**
   * Sends one request without a body ({@code reads}); its answer's Arrow IPC stream is read
   * from the returned stream. {@link PythonFailure} (this worker ended) when the request
   * cannot be sent.
   */
  Answer request(byte[] json) {
    send(json);
    try {
      requests.flush();
    } catch (IOException e) {
      throw died("could not send its request", e);
    }
    return new Answer();
  }

  /**
   * Starts a request with a body ({@code writes}): its JSON sent, its body to be written to
   * the returned stream, and {@link Body#answer} ending it.
   */
  Body requestWithBody(byte[] json) {
    send(json);
    return new Body();
  }

  private void send(byte[] json) {
    try {
      requests.writeInt(json.length);
      requests.write(json);
    } catch (IOException e) {
      throw died("could not send its request", e);
    }
  }

  /** Back to its pool (or ended, when the pool is full or it died). */
  void release() {
    if (process.isAlive()) {
      synchronized (IDLE) {
        ArrayDeque<BridgeWorker> idle = IDLE.computeIfAbsent(pool, k -> new ArrayDeque<>());
        if (idle.size() < MAX_IDLE) {
          idle.addLast(this);
          return;
        }
      }
    }
    end();
  }

  /** Ends the process (a worker whose request or answer was abandoned, or one that failed). */
  void end() {
    StderrTail.kill(process); // first: closing flushes what a request left, which could block
    try {
      requests.close();
    } catch (IOException e) {
      // the process is gone
    }
  }

  private PythonFailure died(String what, Exception cause) {
    end();
    String said = stderr.text();
    String exit = process.isAlive() ? "" : " (exit " + process.exitValue() + ")";
    return new PythonFailure("the persistshard companion's Python " + command + " worker "
        + what + exit + (said.isEmpty() ? "" : ": " + said), cause);
  }

  /**
   * The body of a request ({@code writes}): what is written goes out as {@code D} frames of up
   * to {@link #FRAME_BYTES} (small writes gathered); {@link #answer} sends the last ones and
   * the {@code E} frame. Flushing and closing it do nothing (Arrow's writer may do both; the
   * pipe is the worker's). A failed send is {@link PythonFailure}, this worker ended.
   */
  final class Body extends OutputStream {
    private final byte[] pending = new byte[FRAME_BYTES];
    private int size;

    @Override
    public void write(int b) {
      pending[size++] = (byte) b;
      if (size == pending.length) {
        sendPending();
      }
    }

    @Override
    public void write(byte[] from, int offset, int length) {
      while (length > 0) {
        int n = Math.min(length, pending.length - size);
        System.arraycopy(from, offset, pending, size, n);
        size += n;
        offset += n;
        length -= n;
        if (size == pending.length) {
          sendPending();
        }
      }
    }

    private void sendPending() {
      try {
        if (size > 0) {
          requests.writeByte(DATA);
          requests.writeInt(size);
          requests.write(pending, 0, size);
          size = 0;
        }
      } catch (IOException e) {
        throw died("could not send its request", e);
      }
    }

    /** Ends the body ({@code E} frame) and sends the request; its answer. */
    Answer answer() {
      sendPending();
      try {
        requests.writeByte(END);
        requests.writeInt(0);
        requests.flush();
      } catch (IOException e) {
        throw died("could not send its request", e);
      }
      return new Answer();
    }

    @Override
    public void flush() {
      // frames go out by size and at the end
    }

    @Override
    public void close() {
      // the pipe belongs to the worker
    }
  }

  /**
   * One answer: the payload of its {@code D} frames (an Arrow IPC stream, or a task's commit
   * message), ending where its {@code E} frame is; an {@code X} frame is {@link PythonFailure}
   * with Python's error text. Closing it closes nothing (Arrow's reader closes its stream; the
   * pipe is the worker's).
   */
  final class Answer extends InputStream {
    private int left;
    private boolean ended;

    /** Whether the answer was read to its last frame ({@code E} or {@code X}). */
    boolean complete() {
      return ended;
    }

    /** Reads to the answer's last frame, the Arrow stream's rest discarded. */
    void finish() throws IOException {
      byte[] skip = new byte[8192];
      while (read(skip, 0, skip.length) >= 0) {
        // discarding what Arrow's reader left after its end-of-stream marker, if anything
      }
    }

    /** Positions at data (true) or the answer's end (false). */
    private boolean more() throws IOException {
      while (left == 0) {
        if (ended) {
          return false;
        }
        int tag;
        int length;
        try {
          tag = answers.readByte();
          length = answers.readInt();
        } catch (EOFException e) {
          throw died("ended mid-answer", e);
        }
        if (tag == DATA) {
          left = length;
        } else if (tag == END) {
          ended = true;
        } else if (tag == FAILED) {
          byte[] text = new byte[length];
          try {
            answers.readFully(text);
          } catch (EOFException e) {
            throw died("ended mid-answer", e);
          }
          ended = true;
          throw new PythonFailure(JSON.readTree(text).textValue());
        } else {
          throw died("broke the protocol (frame tag " + tag + ")", null);
        }
      }
      return true;
    }

    @Override
    public int read() throws IOException {
      if (!more()) {
        return -1;
      }
      int b = answers.read();
      if (b < 0) {
        throw died("ended mid-answer", null);
      }
      left--;
      return b;
    }

    @Override
    public int read(byte[] into, int offset, int length) throws IOException {
      if (length == 0) {
        return 0;
      }
      if (!more()) {
        return -1;
      }
      int got = answers.read(into, offset, Math.min(length, left));
      if (got < 0) {
        throw died("ended mid-answer", null);
      }
      left -= got;
      return got;
    }

    @Override
    public void close() {
      // the pipe belongs to the worker
    }
  }
}
