package persistshard.companion;

import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.util.ArrayDeque;
import java.util.HashMap;
import java.util.Map;

/**
 * A long-lived {@code python -m persistshard.datasource.bridge reads} that reads partitions
 * for {@link PythonReader}, one request at a time, kept in a pool per interpreter in each JVM:
 * a partition read by Python starts no interpreter (which costs more, in CPU, than reading a
 * small partition: Python, pyarrow and persistshard imported again).
 *
 * <p>Protocol (the bridge's module docstring): a request is a 4-byte big-endian length and
 * that many bytes of JSON; its answer is frames of a tag byte and a 4-byte length: {@code D}
 * frames carry the Arrow IPC stream, then exactly one {@code E} (ended well) or {@code X}
 * (JSON string: the error's text, class name first) frame.
 *
 * <p>Invariants: a worker serves one {@link Answer} at a time, from {@link #borrow} until
 * {@link #release}; it goes back to the pool only when its answer was read to its last frame
 * (an answer abandoned before that, say by a {@code LIMIT}, leaves frames in the pipe: that
 * worker is ended, never reused), and at most {@link #MAX_IDLE} wait there per interpreter
 * (more are ended). A worker that died or broke the protocol is ended and its stderr's end
 * is in the error. Workers end with the JVM: their stdin closes and the bridge returns.
 */
final class ReadWorker {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final Map<String, ArrayDeque<ReadWorker>> IDLE = new HashMap<>();
  /** Idle workers kept per interpreter: about as many as tasks run at once in a JVM. */
  static final int MAX_IDLE = Math.max(2, Runtime.getRuntime().availableProcessors());
  private static final int STDERR_LINES = 40;
  private static final int DATA = 'D';
  private static final int END = 'E';
  private static final int FAILED = 'X';

  private final Process process;
  private final DataOutputStream requests;
  private final DataInputStream answers;
  private final StderrTail stderr;

  private ReadWorker(String python) {
    process = PythonProcess.start(python, "reads", "reads");
    requests = new DataOutputStream(new BufferedOutputStream(process.getOutputStream()));
    answers = new DataInputStream(new BufferedInputStream(process.getInputStream(), 1 << 16));
    stderr = new StderrTail(process, STDERR_LINES, "persistshard-reads-stderr");
  }

  /** An idle worker of {@code python} from the pool, else a new one. */
  static ReadWorker borrow(String python) {
    synchronized (IDLE) {
      ArrayDeque<ReadWorker> idle = IDLE.get(python);
      while (idle != null && !idle.isEmpty()) {
        ReadWorker worker = idle.pollLast();
        if (worker.process.isAlive()) {
          return worker;
        }
        worker.end();
      }
    }
    return new ReadWorker(python);
  }

  /** Idle workers of {@code python} in the pool (for tests). */
  static int idle(String python) {
    synchronized (IDLE) {
      ArrayDeque<ReadWorker> idle = IDLE.get(python);
      return idle == null ? 0 : idle.size();
    }
  }

  /**
   * Sends one request; its answer's Arrow IPC stream is read from the returned stream.
   * {@link PythonFailure} (this worker ended) when the request cannot be sent.
   */
  Answer request(byte[] json) {
    try {
      requests.writeInt(json.length);
      requests.write(json);
      requests.flush();
    } catch (IOException e) {
      throw died("could not send its request", e);
    }
    return new Answer();
  }

  /** Back to the pool of {@code python} (or ended, when the pool is full or it died). */
  void release(String python) {
    if (process.isAlive()) {
      synchronized (IDLE) {
        ArrayDeque<ReadWorker> idle = IDLE.computeIfAbsent(python, k -> new ArrayDeque<>());
        if (idle.size() < MAX_IDLE) {
          idle.addLast(this);
          return;
        }
      }
    }
    end();
  }

  /** Ends the process (a worker whose answer was abandoned, or one that failed). */
  void end() {
    try {
      requests.close();
    } catch (IOException e) {
      // ending anyway
    }
    StderrTail.kill(process);
  }

  private PythonFailure died(String what, Exception cause) {
    end();
    String said = stderr.text();
    String exit = process.isAlive() ? "" : " (exit " + process.exitValue() + ")";
    return new PythonFailure("the persistshard companion's Python reader " + what + exit
        + (said.isEmpty() ? "" : ": " + said), cause);
  }

  /**
   * The Arrow IPC stream of one answer: the payload of its {@code D} frames, ending where its
   * {@code E} frame is; an {@code X} frame is {@link PythonFailure} with Python's error text.
   * Closing it closes nothing (Arrow's reader closes its stream; the pipe is the worker's).
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
