package persistshard.companion;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.LongAdder;

/**
 * A long-lived {@code python -m persistshard.datasource.bridge serve} per interpreter, in the
 * driver: a scan's plan is one request line and one answer line, so planning starts no
 * interpreter (that would cost more than reading a mid-size table).
 *
 * <p>Invariants: requests are serialized ({@link #plan} is synchronized on the class); an
 * answer {@code {"error": text}} is {@link PythonFailure} with that text (the server goes on);
 * a server that died or broke the protocol is discarded (its stderr's end in the error) and
 * the next plan starts a new one. The server ends when the JVM does (its stdin closes).
 * Every request is counted by its {@code kind} ({@code plan} when it has none) with the wall
 * time the JVM waited for its answer ({@link #requests}, {@link #waitedNanos}): what a query
 * costs in round trips to Python is observable (tests, benchmarks).
 */
final class PlanServer {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final Map<String, PlanServer> SERVERS = new HashMap<>();
  private static final int STDERR_LINES = 40;
  private static final Map<String, LongAdder> REQUESTS = new ConcurrentHashMap<>();
  private static final Map<String, LongAdder> WAITED = new ConcurrentHashMap<>();

  private final Process process;
  private final OutputStream requests;
  private final BufferedReader answers;
  private final StderrTail stderr;

  private PlanServer(String python) {
    process = PythonProcess.start(python, "serve", "planner");
    requests = process.getOutputStream();
    answers = new BufferedReader(
        new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8));
    stderr = new StderrTail(process, STDERR_LINES, "persistshard-planner-stderr");
  }

  /** How many requests of {@code kind} this JVM sent so far (answered or not). */
  static long requests(String kind) {
    LongAdder n = REQUESTS.get(kind);
    return n == null ? 0 : n.sum();
  }

  /** The wall time (ns) this JVM spent in requests of {@code kind}, the server's start too. */
  static long waitedNanos(String kind) {
    LongAdder n = WAITED.get(kind);
    return n == null ? 0 : n.sum();
  }

  /** The bridge's answer to one request (its {@code kind} names it; none: a plan). */
  static JsonNode plan(String python, ObjectNode request) {
    String kind = request.path("kind").asText("plan");
    REQUESTS.computeIfAbsent(kind, k -> new LongAdder()).increment();
    long start = System.nanoTime();
    try {
      return answer(python, request.toString());
    } finally {
      WAITED.computeIfAbsent(kind, k -> new LongAdder()).add(System.nanoTime() - start);
    }
  }

  private static synchronized JsonNode answer(String python, String request) {
    PlanServer server = SERVERS.get(python);
    if (server == null || !server.process.isAlive()) {
      server = new PlanServer(python);
      SERVERS.put(python, server);
    }
    JsonNode answer;
    try {
      server.requests.write((request.replace('\n', ' ') + "\n").getBytes(StandardCharsets.UTF_8));
      server.requests.flush();
      String line = server.answers.readLine();
      if (line == null) {
        throw new IOException("the planner ended");
      }
      answer = JSON.readTree(line);
    } catch (IOException e) {
      SERVERS.remove(python);
      server.process.destroyForcibly();
      throw new PythonFailure("the persistshard companion's planner failed (" + e.getMessage()
          + "): " + server.stderr.text(), e);
    }
    if (answer.has("error")) {
      throw new PythonFailure(answer.get("error").textValue());
    }
    return answer;
  }
}
