package persistshard.companion.format;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.FileOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.ipc.ArrowFileWriter;

/**
 * Decodes part files in the JVM and writes what it read as Arrow IPC files: the companion's
 * decoder, runnable on its own (the tests compare its output with the Python reader's, and an
 * operator can check a part with it).
 *
 * <pre>
 * java -cp COMPANION_JAR:PYSPARK_JARS/* persistshard.companion.format.DecodePart \
 *     PART OUT.arrow [--columns a,b] [--filter JSON]
 * java ... DecodePart --jobs JOBS.jsonl
 * </pre>
 *
 * <p>An IPC file holds the chosen columns (all by default; {@code --columns ""} none), one
 * record batch per chunk that the filter ({@link ChunkFilter}'s JSON) may match, every chunk
 * without a filter, in file order. Standard output gets one JSON line per part:
 * {@code {"chunks": [kept chunk indices], "num_rows": rows written}}, or, for a part that
 * fails a check, {@code {"error": "CorruptData: ..."}}. With {@code --jobs}, each line of the
 * file is one part to decode, {@code {"part": P, "out": O, "columns": [..] or null,
 * "filter": {..} or null}}, all in this one JVM. Exit status: 0; 3 when the single part given
 * fails a check; 2 for bad arguments; 1 for anything else.
 */
public final class DecodePart {
  private static final ObjectMapper JSON = new ObjectMapper();

  private DecodePart() {}

  public static void main(String[] args) throws IOException {
    if (args.length == 2 && args[0].equals("--jobs")) {
      try (BufferAllocator allocator = new RootAllocator()) {
        for (String line : Files.readAllLines(Path.of(args[1]), StandardCharsets.UTF_8)) {
          if (line.isBlank()) {
            continue;
          }
          JsonNode job = JSON.readTree(line);
          List<String> columns = null;
          JsonNode cols = job.get("columns");
          if (cols != null && !cols.isNull()) {
            columns = new ArrayList<>();
            for (JsonNode c : cols) {
              columns.add(c.textValue());
            }
          }
          JsonNode filter = job.get("filter");
          ChunkFilter f = filter == null || filter.isNull() ? null : ChunkFilter.fromJson(filter);
          System.out.println(decode(job.get("part").textValue(), job.get("out").textValue(), columns, f, allocator));
        }
      }
      return;
    }
    if (args.length < 2 || args.length % 2 != 0) {
      System.err.println("usage: DecodePart PART OUT.arrow [--columns a,b] [--filter JSON] | --jobs FILE");
      System.exit(2);
    }
    List<String> columns = null;
    ChunkFilter filter = null;
    for (int i = 2; i < args.length; i += 2) {
      if (args[i].equals("--columns")) {
        columns = args[i + 1].isEmpty() ? List.of() : Arrays.asList(args[i + 1].split(","));
      } else if (args[i].equals("--filter")) {
        filter = ChunkFilter.fromJson(JSON.readTree(args[i + 1]));
      } else {
        System.err.println("DecodePart: unknown argument " + args[i]);
        System.exit(2);
      }
    }
    String result;
    try (BufferAllocator allocator = new RootAllocator()) {
      result = decode(args[0], args[1], columns, filter, allocator);
    }
    System.out.println(result);
    if (result.startsWith("{\"error\"")) {
      System.exit(3);
    }
  }

  /** Decodes one part into one IPC file; the JSON line that reports it. */
  static String decode(String part, String out, List<String> columns, ChunkFilter filter,
      BufferAllocator allocator) throws IOException {
    ObjectNode report = JSON.createObjectNode();
    try (RangeSource source = RangeSource.file(Path.of(part))) {
      PartFile file = PartFile.open(part, source);
      int[] cols = file.columns(columns);
      int[] chunks = filter == null ? allChunks(file) : filter.chunks(file);
      long rows = 0;
      try (VectorSchemaRoot root = VectorSchemaRoot.create(file.projectedSchema(cols), allocator);
          FileOutputStream sink = new FileOutputStream(out);
          ArrowFileWriter writer = new ArrowFileWriter(root, null, sink.getChannel())) {
        writer.start();
        for (int c : chunks) {
          file.readChunk(c, cols, root, allocator);
          writer.writeBatch();
          rows += root.getRowCount();
        }
        writer.end();
      }
      report.putArray("chunks").addAll(Arrays.stream(chunks).mapToObj(JSON.getNodeFactory()::numberNode).toList());
      report.put("num_rows", rows);
    } catch (CorruptData e) {
      report.put("error", e.getMessage());
    }
    return JSON.writeValueAsString(report);
  }

  private static int[] allChunks(PartFile file) {
    int[] all = new int[file.chunks.size()];
    Arrays.setAll(all, i -> i);
    return all;
  }
}
